"""A process Worker's handler processes where people and programs look: its heartbeat
record (children, child events), ``emqfast workers`` (80 columns, hostile strings shown
as escapes), and the Prometheus families read from those records. Real redis-server, a
real process Worker whose children import :mod:`procobs_handlers` by name."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import pytest

import emqfast
from emqfast.core.keys import QueueKeys
from emqfast.facade.workers import QueueWorkers, worker_key
from emqfast.worker.calls import beat_call
from emqfast.worker.heartbeat import IDS_PER_CHILD, children_fields
from procobs_handlers import handle
from test_cli import cli_env, emq
from test_hostile_cli import CONTROLS, RAW, assert_nothing_raw, on_a_terminal
from waiting import wait_until

TESTS = Path(__file__).resolve().parent


def _began(mark: Path, n: int) -> bool:
    return mark.exists() and len(mark.read_text().splitlines()) >= n


@pytest.fixture
def busy(conn, qname, tmp_path) -> Iterator[Tuple[emqfast.Worker, Any]]:
    """A process Worker (2 children, 1 handler each) running one long job."""
    q = emqfast.Queue(qname, conn)
    mark = tmp_path / "began"
    q.enqueue({"k": "nap", "s": 30, "mark": str(mark)})
    w = emqfast.Worker(q, handle, processes=2, shutdown_timeout_s=0.5)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(lambda: _began(mark, 1), 30, "the handler to begin")
        yield w, q
    finally:
        w.stop()
        t.join(30)


def _listed(q: Any, name: str) -> Any:
    """The worker's record once it lists its two children, one holding the job."""
    def ready() -> Any:
        for info in QueueWorkers(q).list():
            if info.token == name and sorted(c.held for c in info.children) == [0, 1]:
                return info
        return None
    return wait_until(ready, 30, "a heartbeat with the job in a child")


def test_the_record_lists_children_and_their_jobs(busy):
    w, q = busy
    info = _listed(q, w.name)
    assert info.kind == "process" and info.concurrency == 2 and len(info.children) == 2
    pids = {c.pid for c in info.children}
    assert pids == {c["pid"] for c in w._children_report()["children"]}
    assert all(c.pid != os.getpid() and c.rss_kb and c.rss_kb > 1000 for c in info.children)
    assert sorted(i for c in info.children for i in c.running) == sorted(q.job_ids("active"))
    assert info.child_events == {}


def test_emqfast_workers_shows_the_children_in_80_columns(busy, redis_url, qname):
    w, q = busy
    info = _listed(q, w.name)
    out = emq("--url", redis_url, "workers", qname, env=cli_env(COLUMNS="80"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), out.stdout
    assert f"{w.name} (process, 2 × concurrency 1)" in lines, out.stdout
    busy_child = next(c for c in info.children if c.held)
    idle_child = next(c for c in info.children if not c.held)
    assert any(line.startswith(f"  child {busy_child.pid}: 0 jobs run, RSS ") and
               line.endswith("MB, in hand 1:") for line in lines), out.stdout
    assert any(line.startswith(f"  child {idle_child.pid}: 0 jobs run, RSS ") and
               line.endswith("MB, idle") for line in lines), out.stdout
    (job_id,) = q.job_ids("active")
    assert f"    {job_id}" in lines, out.stdout  # whole, on a line of its own
    assert "  child events: none" in lines
    data = json.loads(emq("--url", redis_url, "workers", "--json").stdout)
    mine = next(x for x in data if x["token"] == w.name)
    assert mine["kind"] == "process" and len(mine["children"]) == 2


def test_emqfast_workers_of_a_missing_queue_says_so(redis_url, qname):
    out = emq("--url", redis_url, "workers", qname + "-nope")
    assert out.returncode == 1 and "no queue" in out.stderr, out.stderr


def _plant(conn: Any, qname: str, token: str, fields: Dict[str, Any]) -> None:
    """A heartbeat record as anyone with write access to the queue could leave it."""
    keys = QueueKeys(qname)
    conn.hset(keys.meta, "version", emqfast.core.version.KEYSPACE_VERSION)
    q = emqfast.Queue(qname, conn)

    def op() -> Any:
        return (yield beat_call(keys, token, 30_000, fields))
    q._drive(op())


HOSTILE_CHILDREN = json.dumps([
    {"pid": 7, "jobs": 3, "rss_kb": 2048, "running": ["JOB" + CONTROLS, 5, None], "held": 9},
    {"pid": "x", "jobs": -1, "rss_kb": True, "running": "JOBnot-a-list"},
    "not a child", [1, 2]])
HOSTILE_EVENTS = json.dumps({"crash": 2, CONTROLS: 1, "kill:timeout": "many", "restarts": -3})


def test_a_hostile_record_is_read_safely(conn, qname):
    token = "evil" + CONTROLS
    _plant(conn, qname, token, {"host": CONTROLS, "kind": "process",
                                "children": HOSTILE_CHILDREN, "child_events": HOSTILE_EVENTS})
    _plant(conn, qname, "garbage", {"kind": "process", "children": "{not json",
                                    "child_events": "[1]"})
    infos = {i.token: i for i in QueueWorkers(emqfast.Queue(qname, conn)).list()}
    evil, junk = infos[token], infos["garbage"]
    first, second = evil.children
    assert (first.pid, first.jobs, first.rss_kb, first.held) == (7, 3, 2048, 9)
    assert first.running == ["JOB" + CONTROLS]  # kept as text: shown escaped where shown
    assert (second.pid, second.jobs, second.rss_kb, second.running, second.held) == \
        (None, None, None, [], 0)
    assert evil.child_events == {"crash": 2, CONTROLS: 1}
    assert junk.children == [] and junk.child_events == {}


def test_emqfast_workers_shows_hostile_strings_as_escapes(conn, redis_url, qname):
    _plant(conn, qname, "evil" + CONTROLS, {"host": CONTROLS, "kind": "process",
                                            "queues": qname + CONTROLS,
                                            "children": HOSTILE_CHILDREN,
                                            "child_events": HOSTILE_EVENTS})
    code, out = on_a_terminal("--url", redis_url, "workers", qname, columns=80)
    assert code == 0, out
    assert_nothing_raw(out)
    assert b"evil\\x1b[2J" in out and b"JOB\\x1b[2J" in out and b"(+8 more)" in out, out
    piped = emq("--url", redis_url, "workers", qname)
    assert piped.returncode == 0 and not any(s.decode("latin-1") in piped.stdout for s in RAW)
    as_json = emq("--url", redis_url, "workers", qname, "--json")
    assert as_json.returncode == 0 and "\x1b" not in as_json.stdout
    assert any(w["token"] == "evil" + CONTROLS for w in json.loads(as_json.stdout))


def test_the_record_keeps_a_few_ids_per_child():
    ids = [f"JOB{i:023d}" for i in range(40)]
    report = {"children": [{"pid": 1, "jobs": 0, "rss_kb": None, "running": ids}],
              "child_events": {"restarts": 1}}
    fields = children_fields(report)
    child = json.loads(fields["children"])[0]
    assert child["running"] == ids[:IDS_PER_CHILD] and child["held"] == 40
    assert json.loads(fields["child_events"]) == {"restarts": 1}
    assert children_fields(None) == {}


def test_a_thread_workers_record_has_no_children(conn, qname):
    q = emqfast.Queue(qname, conn)
    w = emqfast.Worker(q, handle)
    w.run_until_idle(timeout_s=10)  # beats once at least
    keys = QueueKeys(qname)
    assert not conn.exists(worker_key(keys, w.name))  # signed off
    _plant(conn, qname, "t", {"kind": "thread"})
    info = QueueWorkers(q).list()[0]
    assert info.children == [] and info.child_events == {}


def _series(text: str, name: str) -> Dict[str, float]:
    """``{labels: value}`` of one family's samples in a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line[len(name):].rpartition(" ")
            out[labels] = float(value)
    return out


def test_metrics_count_kills_crashes_and_restarts(conn, redis_url, qname):
    q = emqfast.Queue(qname, conn)
    hung = q.enqueue({"k": "nap", "s": 60}, attempts=1)
    dead = q.enqueue({"k": "exit"}, attempts=1)
    w = emqfast.Worker(q, handle, processes=1, job_timeout_ms=300, cancel_grace_ms=100)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(lambda: {q.get(hung.id).state, q.get(dead.id).state} == {"failed"}, 60,
                   "both jobs to fail")

        def counted() -> Any:
            infos = [i for i in QueueWorkers(q).list() if i.token == w.name]
            ev = infos[0].child_events if infos else {}
            return ev.get("restarts", 0) >= 2 and ev
        events = wait_until(counted, 30, "the heartbeat to count both replacements")
        assert events["kill:timeout"] == 1 and events["crash"] == 1, events
        out = emq("--url", redis_url, "metrics", qname)
        assert out.returncode == 0, out.stderr
        text = out.stdout
    finally:
        w.stop()
        t.join(30)
    who = f'queue="{qname}",worker="{w.name}"'
    by = f'queue="{qname}",reason="%s",worker="{w.name}"'  # labels in name order
    assert _series(text, "emqfast_worker_child_kills_total") == {
        "{%s}" % (by % r): n for r, n in (("timeout", 1.0), ("cancel", 0.0), ("shutdown", 0.0))}
    assert _series(text, "emqfast_worker_child_crashes_total") == {"{%s}" % who: 1.0}
    assert _series(text, "emqfast_worker_child_restarts_total")["{%s}" % who] >= 2
    assert _series(text, "emqfast_worker_child_recycles_total") == {
        "{%s}" % (by % "jobs"): 0.0, "{%s}" % (by % "memory"): 0.0}
    assert _series(text, "emqfast_worker_children") == {"{%s}" % who: 1.0}
    assert _series(text, "emqfast_worker_children_rss_bytes")["{%s}" % who] > 1 << 20
    assert "# TYPE emqfast_worker_child_kills_total counter" in text


def test_metrics_leave_thread_workers_out_and_quote_hostile_names(conn, qname):
    from emqfast.facade import metrics

    _plant(conn, qname, "thread-w", {"kind": "thread"})
    _plant(conn, qname, 'evil"}\n', {"kind": "process", "children": HOSTILE_CHILDREN,
                                     "child_events": HOSTILE_EVENTS})
    text = metrics.exposition(conn, [qname])
    assert "thread-w" not in text
    crashes = _series(text, "emqfast_worker_child_crashes_total")
    assert crashes == {f'{{queue="{qname}",worker="evil\\"}}\\n"}}': 2.0}, text
    assert _series(text, "emqfast_worker_children_rss_bytes") == \
        {f'{{queue="{qname}",worker="evil\\"}}\\n"}}': 2048 * 1024.0}
