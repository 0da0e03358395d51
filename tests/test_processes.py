"""Handlers in supervised child processes (``Worker(processes=N)``), with real processes,
real signals and a real Redis: a handler that ignores its stop is killed after the grace
and its attempt ends as promised, a crash fails only its own attempt, children are
recycled by jobs and memory, the shutdown bound is kept, and no child outlives its
Worker. Every run is reconciled from a ledger the handlers write outside Redis."""
from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import emqfast
from proc_handlers import coro, raw, read_ledger, work
from waiting import wait_until

TESTS = Path(__file__).resolve().parent
FAST = emqfast.Backoff.fixed(10)


@pytest.fixture
def ledger(tmp_path):
    return str(tmp_path / "ledger")


def _begins(ledger, job_id):
    return [row for row in read_ledger(ledger) if row[0] == "begin" and row[1] == job_id]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited
    except OSError:
        return False


@pytest.mark.parametrize("kind,error", [
    ("spin", "JobTimeout: timeout"),
    ("sleep", "JobTimeout: timeout"),
    ("select", "JobTimeout: timeout"),
    ("exit", "WorkerCrashed: child exited with code 1 while running"),
    ("segv", "WorkerCrashed: child exited with signal 11 (SIGSEGV) while running"),
])
def test_a_misbehaving_handler_ends_as_promised_on_every_attempt(redis_url, qname, ledger,
                                                                 kind, error):
    q = emqfast.Queue(qname, redis_url)
    bad = q.enqueue({"k": kind, "ledger": ledger}, timeout_ms=300, attempts=2, backoff=FAST)
    good = [q.enqueue({"k": "echo", "n": n, "ledger": ledger}) for n in range(4)]
    w = emqfast.Worker(q, work, processes=2, cancel_grace_ms=200)
    stats = w.run_until_idle(timeout_s=120, wait_scheduled=True)
    job = q.get(bad.id)
    assert job.state == "failed" and job.attempts == 2, (job.state, job.error)
    assert job.error.startswith(error), job.error
    if kind in ("exit", "segv"):
        assert job.error.endswith(bad.id)
    # the retry was stopped too: two attempts, each begun once, in two children, never ended
    begins = _begins(ledger, bad.id)
    assert [b[2] for b in begins] == [1, 2] and begins[0][3] != begins[1][3]
    assert not [row for row in read_ledger(ledger) if row[0] == "end" and row[1] == bad.id]
    # the Worker kept serving
    assert [q.get(r.id).state for r in good] == ["completed"] * 4
    assert stats.completed == 4 and stats.failed == 1 and stats.retried == 1
    events = w._children_report()["child_events"]
    if kind in ("exit", "segv"):
        assert events["crash"] == 2
    else:
        assert events["kill:timeout"] == 2


def test_a_cancel_of_a_handler_that_ignores_it_kills_its_child(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    w = emqfast.Worker(q, work, processes=1, cancel_grace_ms=300)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        ref = q.enqueue({"k": "spin", "ledger": ledger}, attempts=3)
        wait_until(lambda: _begins(ledger, ref.id), 60, "the spinning handler began")
        pid = _begins(ledger, ref.id)[0][3]
        assert q.cancel(ref.id) == "requested"
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "cancelled")
        wait_until(lambda: not _alive(pid), 10, "its child gone")
        after = q.enqueue({"k": "echo"})
        wait_until(lambda: q.get(after.id).state == "completed", 60, "the next job ran")
    finally:
        w.stop()
        t.join(30)
    assert q.get(ref.id).attempts == 1 and len(_begins(ledger, ref.id)) == 1
    assert w._children_report() is not None and w.stats.cancelled == 1


def test_a_polite_handler_stops_when_asked_and_keeps_its_child(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"k": "polite", "ledger": ledger}, timeout_ms=200, attempts=1)
    after = q.enqueue({"k": "echo"})
    w = emqfast.Worker(q, work, processes=1, cancel_grace_ms=30_000)
    w.run_until_idle(timeout_s=60, wait_scheduled=True)
    assert q.get(ref.id).error.startswith("JobTimeout")
    assert q.get(after.id).state == "completed"
    assert "kill:timeout" not in w._children_report()["child_events"]


def test_results_errors_progress_and_async_handlers_cross_as_bytes_or_json(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    prog = q.enqueue({"k": "progress", "n": 3})
    boom = q.enqueue({"k": "boom", "n": 7}, attempts=1)
    w = emqfast.Worker(q, work, processes=1)
    w.run_until_idle(timeout_s=60, wait_scheduled=True)
    job = q.get(prog.id)
    assert job.state == "completed" and job.result["n"] == 3
    assert job.last_progress == {"half": True}
    assert job.result["pid"] != os.getpid()
    failed = q.get(boom.id)
    assert failed.error == "ValueError: bad input 7"
    assert "proc_handlers.py" in failed.traceback and "raise ValueError" in failed.traceback

    raw_ref = q.enqueue(b"\x00\x01\xffabc")
    emqfast.Worker(q, raw, processes=1).run_until_idle(timeout_s=60, wait_scheduled=True)
    assert q.get(raw_ref.id).result == b"cba\xff\x01\x00"

    async_ref = q.enqueue({"k": "x"})
    emqfast.Worker(q, coro, processes=1).run_until_idle(timeout_s=60, wait_scheduled=True)
    done = q.get(async_ref.id)
    assert done.result["async"] is True and done.last_progress == 1


def test_an_async_handler_in_a_child_is_cancelled_on_its_timeout(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"k": "sleep"}, timeout_ms=200, attempts=1)
    w = emqfast.Worker(q, coro, processes=1, cancel_grace_ms=30_000)
    w.run_until_idle(timeout_s=60, wait_scheduled=True)
    assert q.get(ref.id).error.startswith("JobTimeout")
    assert "kill:timeout" not in w._children_report()["child_events"]  # its task ended


def test_threads_in_each_child_run_at_once(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    refs = [q.enqueue({"k": "nap", "s": 1.0, "ledger": ledger}) for _ in range(3)]
    emqfast.Worker(q, work, processes=1, concurrency=3).run_until_idle(timeout_s=60, wait_scheduled=True)
    rows = read_ledger(ledger)
    begins = [at for event, _, _, _, at in rows if event == "begin"]
    ends = [at for event, _, _, _, at in rows if event == "end"]
    assert len({pid for _, _, _, pid, _ in rows}) == 1
    assert max(begins) < min(ends)  # all three ran at once, in one child
    assert all(q.get(r.id).state == "completed" for r in refs)


def test_children_are_recycled_after_max_jobs(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    refs = [q.enqueue({"k": "echo", "ledger": ledger}) for _ in range(10)]
    w = emqfast.Worker(q, work, processes=1, max_jobs_per_child=3)
    w.run_until_idle(timeout_s=120, wait_scheduled=True)
    assert all(q.get(r.id).state == "completed" for r in refs)
    per_pid = collections.Counter(pid for event, _, _, pid, _ in read_ledger(ledger)
                                  if event == "begin")
    assert sorted(per_pid.values()) == [1, 3, 3, 3]
    assert w._children_report()["child_events"]["recycled:jobs"] >= 3


def test_a_leaking_handler_is_recycled_by_memory(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    refs = [q.enqueue({"k": "leak", "ledger": ledger}) for _ in range(5)]
    w = emqfast.Worker(q, work, processes=1, max_memory_per_child_mb=100)
    w.run_until_idle(timeout_s=120, wait_scheduled=True)
    assert all(q.get(r.id).state == "completed" for r in refs)
    pids = [pid for event, _, _, pid, _ in read_ledger(ledger) if event == "begin"]
    # ~50 MB a job over a 20-50 MB interpreter: each child serves one or two jobs
    assert 3 <= len(set(pids)) <= 5 and len(pids) == 5
    assert w._children_report()["child_events"]["recycled:memory"] >= 2


def test_a_handler_that_cannot_be_imported_stops_the_worker_at_once(redis_url, qname,
                                                                     tmp_path, monkeypatch):
    (tmp_path / "gpu_only.py").write_text(textwrap.dedent("""
        import sys
        if sys.argv[0] == "-c":  # in a handler process
            raise RuntimeError("no GPU in this process")
        def handle(job):
            return 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import gpu_only
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue("x")
    started = time.monotonic()
    with pytest.raises(emqfast.HandlerNotImportable, match="no GPU in this process"):
        emqfast.Worker(q, gpu_only.handle, processes=2).run_until_idle(timeout_s=60, wait_scheduled=True)
    assert time.monotonic() - started < 30
    assert q.get(ref.id).state == "pending" and q.get(ref.id).attempts == 0


def test_what_a_process_worker_refuses(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    with pytest.raises(emqfast.InputTypeError, match="import"):
        emqfast.Worker(q, lambda job: 1, processes=1)
    with pytest.raises(emqfast.InvalidInput, match="one queue"):
        emqfast.Worker([q, emqfast.Queue(qname + "b", redis_url)], work, processes=1)
    with pytest.raises(emqfast.InvalidInput, match="processes"):
        emqfast.Worker(q, work, max_jobs_per_child=3)
    with pytest.raises(emqfast.RangeError):
        emqfast.Worker(q, work, processes=0)


_SCRIPT = """
import logging, sys
sys.path.insert(0, {tests!r})
logging.basicConfig(level=logging.INFO)
import emqfast
from proc_handlers import work
q = emqfast.Queue({queue!r}, {url!r})
w = emqfast.Worker(q, work, processes={processes}, shutdown_timeout_s={timeout},
                   lease_ms={lease})
print("ready", flush=True)
w.run()
print("released", w.stats.released, flush=True)
"""


def _worker_process(redis_url, qname, processes=1, timeout=1.0, lease=30_000):
    script = _SCRIPT.format(tests=str(TESTS), queue=qname, url=redis_url,
                            processes=processes, timeout=timeout, lease=lease)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_shutdown_timeout_kills_the_handler_and_gives_its_job_back(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"k": "nap", "s": 6, "ledger": ledger})
    proc = _worker_process(redis_url, qname, timeout=1.0)
    try:
        wait_until(lambda: _begins(ledger, ref.id), 60, "the handler began")
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - asked
    finally:
        proc.kill()
    print(f"exit {took:.2f} s after SIGTERM")
    assert proc.returncode == 0, err
    assert took < 5.0, err  # the 6 s handler did not hold it: killed after 1 s
    assert "released 1" in out and "killed 1 handler process" in err
    job = q.get(ref.id)
    assert job.state == "pending" and job.attempts == 0  # no attempt counted
    emqfast.Worker(q, work, processes=1).run_until_idle(timeout_s=60, wait_scheduled=True)
    rows = [row for row in read_ledger(ledger) if row[1] == ref.id]
    assert [row[0] for row in rows] == ["begin", "begin", "end"]  # one completed run
    assert q.get(ref.id).state == "completed"


def test_a_second_signal_kills_at_once(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"k": "sleep", "ledger": ledger})
    proc = _worker_process(redis_url, qname, timeout=600.0)
    try:
        wait_until(lambda: _begins(ledger, ref.id), 60, "the handler began")
        pid = _begins(ledger, ref.id)[0][3]
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "signal 15" in (proc.stderr.readline() or ""), 30,
                   "the first signal heard")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        proc.kill()
    wait_until(lambda: not _alive(pid), 10, "the child gone")
    job = q.get(ref.id)
    assert job.state == "pending" and job.attempts == 0


def test_no_child_outlives_a_killed_worker_and_its_jobs_come_back(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    refs = [q.enqueue({"k": "hang_once", "ledger": ledger}) for _ in range(2)]
    proc = _worker_process(redis_url, qname, processes=2, lease=1000)
    try:
        wait_until(lambda: all(_begins(ledger, r.id) for r in refs), 60, "both began")
        pids = {_begins(ledger, r.id)[0][3] for r in refs}
        assert len(pids) == 2
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
    wait_until(lambda: not any(_alive(pid) for pid in pids), 10, "no orphan left")
    # their leases lapse and another worker runs them (second begin, then end)
    w = emqfast.Worker(q, work, processes=1)
    w.run_until_idle(timeout_s=90, wait_active=True, wait_scheduled=True)
    for r in refs:
        assert q.get(r.id).state == "completed"
        assert [row[0] for row in read_ledger(ledger) if row[1] == r.id] == \
            ["begin", "begin", "end"]


def test_children_killed_at_random_lose_no_job_and_rerun_only_killed_attempts(
        redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    n = 20_000
    q.enqueue_many([{"k": "echo", "n": i, "ledger": ledger} for i in range(n)], attempts=10,
                   backoff=FAST)
    w = emqfast.Worker(q, work, processes=2, keep_completed=n)
    done = threading.Event()
    kills = []

    def killer():
        rng = random.Random(7)
        while not done.wait(0.25):
            report = w._children_report()
            children = report["children"] if report else []
            if children:
                pid = rng.choice(children)["pid"]
                try:
                    os.kill(pid, signal.SIGKILL)
                    kills.append(pid)
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    try:
        stats = w.run_until_idle(timeout_s=600, wait_scheduled=True)
    finally:
        done.set()
        t.join()
    print(f"{len(kills)} children killed; {stats}")
    assert len(kills) >= 5
    counts = q.counts()
    assert counts["completed"] == n and counts.get("failed", 0) == 0
    rows = [row for row in read_ledger(ledger) if row[0] == "begin"]
    begins = collections.Counter((job_id, attempt) for _, job_id, attempt, _, _ in rows)
    assert len({job_id for job_id, _ in begins}) == n  # every job ran
    assert max(begins.values()) == 1  # no attempt ran twice
    # a job ran again only when a kill ended its previous attempt (in its handler, or
    # taken by a child that died before the handler's first line)
    pid_of = {(job_id, attempt): pid for _, job_id, attempt, pid, _ in rows}
    for (job_id, attempt) in begins:
        if attempt > 1:
            assert pid_of.get((job_id, attempt - 1), kills[0]) in kills, (job_id, attempt)
    assert stats.completed == n


def test_stop_with_a_timeout_bounds_the_exit(redis_url, qname, ledger):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"k": "nap", "s": 30, "ledger": ledger})
    w = emqfast.Worker(q, work, processes=1)  # shutdown_timeout_s 30 s, unless told
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    wait_until(lambda: _begins(ledger, ref.id), 60, "the handler began")
    asked = time.monotonic()
    w.stop(timeout=0.5)
    t.join(30)
    assert not t.is_alive() and time.monotonic() - asked < 10
    job = q.get(ref.id)
    assert job.state == "pending" and job.attempts == 0 and w.stats.released == 1
    with pytest.raises(emqfast.InvalidInput):
        w.stop(timeout=-1)


def test_an_exception_that_cannot_be_printed_fails_its_job_not_the_child(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    bad = q.enqueue({"k": "badstr"}, attempts=1)
    after = [q.enqueue({"k": "echo"}) for _ in range(3)]
    emqfast.Worker(q, work, processes=1).run_until_idle(timeout_s=60)
    assert q.get(bad.id).error.startswith("_Unprintable: <str() failed")
    assert [q.get(r.id).state for r in after] == ["completed"] * 3
