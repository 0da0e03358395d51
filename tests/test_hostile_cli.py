"""Hostile stored strings meet the CLI on a real terminal: queue names, job ids, payloads
and errors holding rich markup (``[/]``, ``[link=...]``) or terminal control sequences
(ESC, OSC title and OSC 8 links, BEL, the 8-bit CSI ``\\x9b``) are printed as text, with
every control character shown as an escape; ``--json`` stays exact. Each command runs
as a subprocess on a pseudo-terminal and the raw bytes it writes are checked."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Tuple

import pytest
import redis

from emqfast import Queue, Worker
from emqfast.core.errors import InvalidInput

from test_cli import cli_env

MARKUP_QUEUE = "mk[/]q"
LINK_ID = "JOBx[link=//evil.example]CLICK[/link]"
CONTROLS = "\x1b[2J\x1b]0;owned\x07\x1b]8;;http://evil.example/\x07CLICK\x1b]8;;\x07\x9b31mred"
# what must never reach the terminal raw
RAW = (b"\x1b[2J", b"\x1b]0;", b"\x07", b"\x1b]8;", b"\xc2\x9b")


def on_a_terminal(*args: str, cwd: Path = None, timeout: float = 60,
                  columns: int = 250) -> Tuple[int, bytes]:
    """Run ``emqfast ARGS`` with stdout and stderr on a pseudo-terminal ``columns`` wide:
    (exit code, every byte it wrote)."""
    import pty

    leader, follower = pty.openpty()
    env = cli_env(COLUMNS=str(columns), LINES="50", TERM="xterm-256color")
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", *args], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env=env, cwd=cwd)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    code = proc.wait(30)
    os.close(leader)
    return code, b"".join(chunks)


def assert_nothing_raw(out: bytes) -> None:
    for seq in RAW:
        assert seq not in out, (seq, out)


def test_visible_escapes_every_control_and_keeps_lines_on_request():
    from emqfast.tools.render import visible

    assert visible("a\x1b[2Jb\x07\x9b\u202e\r\n\t") == "a\\x1b[2Jb\\x07\\x9b\\u202e\\x0d\\x0a\\x09"
    assert visible("tb\nline 2\tx\r", lines=True) == "tb\nline 2\tx\\x0d"
    assert visible("plain [b]text[/b] 你好") == "plain [b]text[/b] 你好"


def test_json_output_stays_exact_but_escapes_what_json_leaves_raw():
    from emqfast.tools.render import json_text

    data = {"t": CONTROLS, "u": "你好", "bidi": "\u202eabc"}
    text = json_text(data)
    assert json.loads(text) == data
    assert "你好" in text and "\x9b" not in text and "\u202e" not in text and "\x1b" not in text


@pytest.fixture
def private_server():
    """A redis-server of this test's own: ``stats`` lists every queue of its server, and
    the session's holds the deliberately broken keys of other tests."""
    import shutil

    from conftest import start_redis_server

    proc, port, workdir = start_redis_server()
    try:
        yield f"redis://127.0.0.1:{port}/0", redis.Redis(port=port)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_markup_queue_name_works_in_stats_jobs_cancel_enqueue(private_server):
    redis_url, r = private_server
    q = Queue(MARKUP_QUEUE, r)
    ref = q.enqueue({"email": "a[/]b"}, job_id="JOB[/]one")
    try:
        code, out = on_a_terminal("--url", redis_url, "stats")
        assert code == 0 and MARKUP_QUEUE.encode() in out, out
        code, out = on_a_terminal("--url", redis_url, "stats", MARKUP_QUEUE)
        assert code == 0 and MARKUP_QUEUE.encode() in out, out
        code, out = on_a_terminal("--url", redis_url, "jobs", MARKUP_QUEUE, ref.id)
        assert code == 0 and b"a[/]b" in out and b"JOB[/]one" in out, out
        code, out = on_a_terminal("--url", redis_url, "enqueue", MARKUP_QUEUE, "{}",
                                  "--job-id", ref.id)
        assert code == 0 and b"already exists in mk[/]q" in out, out
        code, out = on_a_terminal("--url", redis_url, "cancel", MARKUP_QUEUE, ref.id)
        assert code == 0 and b"cancelled" in out and b"JOB[/]one" in out, out
        code, out = on_a_terminal("--url", redis_url, "cancel", MARKUP_QUEUE, ref.id)
        assert code == 1 and b"cannot cancel JOB[/]one" in out, out
    finally:
        q.obliterate()


def test_a_link_in_an_id_prints_as_text_not_a_link(redis_url, r, qname):
    q = Queue(qname, r)
    q.enqueue({"n": 1}, job_id=LINK_ID)
    for args in (("jobs", qname), ("jobs", qname, LINK_ID), ("retry", qname, LINK_ID)):
        code, out = on_a_terminal("--url", redis_url, *args)
        assert b"\x1b]8;" not in out, (args, out)  # no OSC 8 hyperlink
        if args[0] == "jobs":
            assert code == 0 and LINK_ID.encode() in out, (args, out)
        else:  # refused (not failed): the message names the id as it is
            assert code == 1 and LINK_ID.encode() in out, (args, out)


def _hostile_jobs(r, q: Queue) -> Tuple[str, str]:
    """A failed job whose payload, error and traceback hold control sequences, and a job
    written with a control-laden id (as an older version or a raw write could leave)."""
    failed = q.enqueue({"t": CONTROLS}, attempts=1).id

    def handler(job):
        raise RuntimeError(CONTROLS)

    Worker(q, handler).run_until_idle(timeout_s=30)
    bad_id = "JOB" + CONTROLS
    r.hset(q.keys.job(bad_id), mapping={"payload": json.dumps(CONTROLS), "error": CONTROLS})
    r.zadd(q.keys.pending, {bad_id: 1})
    return failed, bad_id


def test_control_sequences_reach_no_terminal_raw(redis_url, r, qname):
    q = Queue(qname, r)
    failed, bad_id = _hostile_jobs(r, q)
    bytes_id = q.enqueue(CONTROLS.encode()).id
    for args in (("jobs", qname), ("jobs", qname, failed), ("jobs", qname, failed, "--full"),
                 ("jobs", qname, bytes_id, "--full"), ("jobs", qname, bad_id),
                 ("cancel", qname, bad_id), ("retry", qname, bad_id)):
        code, out = on_a_terminal("--url", redis_url, *args)
        assert_nothing_raw(out)
        assert b"\\x1b[2J" in out or b"\\u001b[2J" in out, (args, out)
        if args[0] == "jobs":
            assert code == 0, (args, out)


def test_json_output_is_exact(redis_url, r, qname):
    q = Queue(qname, r)
    failed, _ = _hostile_jobs(r, q)
    code, out = on_a_terminal("--url", redis_url, "jobs", qname, failed, "--json")
    assert code == 0
    assert_nothing_raw(out)
    got = json.loads(out.decode())
    assert got["payload"] == {"t": CONTROLS} and got["error"] == f"RuntimeError: {CONTROLS}"


HANDLER = textwrap.dedent('''
    CONTROLS = %r

    def fail(job):
        raise RuntimeError(CONTROLS + "\\n12:00:00 FAILED JOBforged attempt 1/1: forged")
''')


def test_worker_failure_lines_show_controls_and_forge_no_line(redis_url, r, tmp_path):
    (tmp_path / "hostile_handler.py").write_text(HANDLER % CONTROLS)
    q = Queue(MARKUP_QUEUE, r)
    q.obliterate()
    try:
        q.enqueue({"n": 1}, attempts=1, job_id="JOB[/]fails")
        code, out = on_a_terminal("--url", redis_url, "worker", "hostile_handler:fail",
                                  "-q", MARKUP_QUEUE, "--burst", cwd=tmp_path)
        assert code == 0, out
        assert_nothing_raw(out)
        assert b"FAILED JOB[/]fails attempt 1/1" in out, out
        lines = out.replace(b"\r\n", b"\n").split(b"\n")
        assert not any(line.startswith(b"12:00:00 FAILED JOBforged") for line in lines), out
        assert b"mk[/]q" in out  # the start line names the queue as it is
    finally:
        q.obliterate()


@pytest.mark.parametrize("bad", ["\x9b", "\x85", "\x80", "\x9f", "\x1b", "\n", "\x7f"])
def test_control_characters_are_refused_in_names_and_new_job_ids(r, qname, bad):
    q = Queue(qname, r)
    with pytest.raises(InvalidInput, match="control characters"):
        Queue(f"a{bad}b", r)
    with pytest.raises(InvalidInput, match="control characters"):
        q.enqueue({}, job_id=f"JOB{bad}x")
    with pytest.raises(InvalidInput, match="control characters"):
        q.enqueue_many([{}], job_ids=[f"JOB{bad}x"])
    with pytest.raises(InvalidInput, match="control characters"):
        q.schedules.upsert(f"s{bad}", every_ms=1000, payload={})
    with pytest.raises(InvalidInput, match="control characters"):
        q.enqueue({}, group=f"g{bad}")
    assert not list(r.scan_iter(match=q.keys.glob()))  # Redis untouched
