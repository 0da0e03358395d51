"""The CLI on an 80-column terminal and at a newcomer's first typo: job ids are never cut
(each can be copied back into ``jobs QUEUE ID``, ``retry``, ``cancel``), every column has
its header, times carry their date when it is not today, a queue that does not exist is
said to be missing (with close names), queue names and ``--help`` lines are never cut or
broken mid-word, and the dashboard stops on Ctrl-C without an error."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from emqfast import Queue, Worker

from test_cli import cli_env, emq
from test_hostile_cli import assert_nothing_raw, on_a_terminal

ID = re.compile(r"JOB[0-9A-Za-z_-]+")
FAR = 1_904_000_000_000  # 2030-05-03 UTC: a job due years from now
COMMANDS = ("", "demo", "stats", "jobs", "enqueue", "retry", "cancel", "schedules", "worker",
            "bench", "metrics", "server", "server start", "server status", "server stop",
            "server wipe", "dashboard")


def narrow(*args: str) -> subprocess.CompletedProcess:
    """``emqfast ARGS`` as an 80-column terminal would lay it out."""
    return emq(*args, env=cli_env(COLUMNS="80"))


def _failing(job):
    raise RuntimeError("smtp said no: mailbox unavailable for the recipient")


@pytest.fixture
def mixed(r, qname):
    """Jobs in most states, with minted ids: due in an hour and in 2030, waiting, done,
    failed."""
    q = Queue(qname, r)
    failed = q.enqueue({"n": 0}, attempts=1)
    Worker(q, _failing).run_until_idle(timeout_s=30)
    q.enqueue_many([{"n": 1}, {"n": 2}], priority=7)
    q.enqueue_in({"n": 3}, 3_600_000)
    q.enqueue_at({"n": 4}, FAR)
    return q, failed.id


def _every_id(q: Queue) -> list:
    return [i for state in ("scheduled", "pending", "failed") for i in q.job_ids(state)]


# --- a queue that does not exist --------------------------------------------------------

@pytest.mark.parametrize("args", [("stats", "{typo}"), ("jobs", "{typo}"),
                                  ("jobs", "{typo}", "--json"), ("schedules", "{typo}"),
                                  ("schedules", "{typo}", "remove", "digest"),
                                  ("retry", "{typo}", "--all"),
                                  ("cancel", "{typo}", "JOBx"),
                                  ("stats", "{typo}", "--watch", "--count", "1")])
def test_a_queue_that_does_not_exist_is_said_with_close_names(redis_url, r, qname, args):
    q = Queue(qname + "-mail", r)
    q.enqueue({"to": "ada"})
    typo = qname + "-mial"
    out = emq("--url", redis_url, *(a.format(typo=typo) for a in args))
    assert out.returncode == 1, out
    assert out.stdout == "", out.stdout
    assert out.stderr.startswith(f"no queue {typo} on redis://"), out.stderr
    assert f"did you mean {q.name}" in out.stderr and len(out.stderr.splitlines()) == 1
    assert not r.exists(f"emq:{{{typo}}}:meta")  # reading it wrote nothing


def test_removing_a_schedule_that_does_not_exist_fails_naming_close_ones(redis_url, r, qname):
    Queue(qname, r).schedules.upsert("digest", every_ms=60_000, payload={})
    out = emq("--url", redis_url, "schedules", qname, "remove", "digets")
    assert out.returncode == 1 and "no schedule digets" in out.stderr
    assert "did you mean digest?" in out.stderr


# --- --help at 80 columns ---------------------------------------------------------------

@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_cuts_nothing(command):
    out = narrow(*command.split(), "--help")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout  # a terminal would break it
    listed = lines[lines.index("Commands:") + 1:] if "Commands:" in lines else []
    assert listed == [] or all(not line.rstrip().endswith(("...", "…")) for line in listed), \
        out.stdout


# --- the dashboard stops on Ctrl-C ------------------------------------------------------

def test_dashboard_ctrl_c_exits_0_quietly(redis_url):
    pytest.importorskip("uvicorn")
    proc = subprocess.Popen([sys.executable, "-m", "emqfast", "dashboard", "--url", redis_url,
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cli_env())
    try:
        assert "emqfast dashboard on http://" in proc.stdout.readline()
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "Aborted" not in out + err and "Traceback" not in err, err
