"""Engine contract: the Worker. Wake marker, concurrency, graceful SIGTERM, results,
retention, pause/resume, cancel."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import emqfast
from conftest import dump_queue
from emqfast import Unrecoverable
from engine_util import blocked_on_marker, claim, make_queue, running_worker, server_ms
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the worker script imports from: this checkout, and tests/ (it waits with waiting.py)
CHILD_PATH = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])
# A generous bound (noisy shared 2-core machine): without the wake marker, the worker below
# would sleep out its whole 1 s beat. The strict latency target lives in bench/.
WAKE_BOUND_S = 0.5


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


@pytest.fixture
def idle_worker(redis_url, qname):
    """A worker (lease 30 s, so a 1 s beat) running in a thread on its own named connection;
    yields (queue, started) where started maps payload -> (monotonic s, server ms) at start."""
    name = "w-" + qname
    wq = make_queue(redis_url, qname, client_name=name)
    started = {}

    def handler(job):
        started[job.payload] = (time.monotonic(), server_ms(wq.redis))

    worker = emqfast.Worker(wq, handler, concurrency=1, lease_ms=30_000)
    with running_worker(worker):
        yield name, started, worker


# --- the wake marker ---------------------------------------------------------------

def test_blocked_worker_wakes_on_enqueue(r, q, idle_worker):
    name, started, _ = idle_worker
    for i in range(3):
        wait_until(lambda: blocked_on_marker(r, name), what="worker blocked on the marker")
        t0 = time.monotonic()
        q.enqueue(i)
        wait_until(lambda: i in started, what=f"job {i} started")
        assert started[i][0] - t0 < WAKE_BOUND_S


def test_blocked_worker_wakes_when_a_delayed_job_is_due(r, q, idle_worker):
    name, started, _ = idle_worker
    for i, delay in enumerate((300, 150)):
        wait_until(lambda: blocked_on_marker(r, name), what="worker blocked on the marker")
        ref = q.enqueue_in(i, delay)
        run_at = q.get(ref.id).run_at_ms
        wait_until(lambda: i in started, what=f"delayed job {i} started")
        late_ms = started[i][1] - run_at
        assert 0 <= late_ms < WAKE_BOUND_S * 1000


def test_resume_wakes_a_blocked_worker(r, q, idle_worker):
    name, started, _ = idle_worker
    wait_until(lambda: blocked_on_marker(r, name), what="worker blocked")
    q.pause()
    assert q.is_paused()
    ref = q.enqueue("while paused")  # wakes the worker, which must find the queue paused
    wait_until(lambda: r.zscore(q.keys.marker, "0") is None, what="worker took the wake-up")
    wait_until(lambda: blocked_on_marker(r, name), what="worker blocked again")
    assert "while paused" not in started
    assert q.get(ref.id).state == "pending" and q.job_ids("pending") == [ref.id]
    t0 = time.monotonic()
    q.resume()
    assert not q.is_paused()
    wait_until(lambda: "while paused" in started, what="job started after resume")
    assert started["while paused"][0] - t0 < WAKE_BOUND_S


# --- concurrency and outcomes -----------------------------------------------------------

def test_handlers_really_overlap(q):
    n = 4
    barrier = threading.Barrier(n, timeout=20)  # passes only if n handlers run at once
    q.enqueue_many(range(n), attempts=1)
    stats = emqfast.Worker(q, lambda job: barrier.wait(), concurrency=n).run_until_idle(30)
    assert (stats.completed, stats.failed) == (n, 0)
    assert not barrier.broken


def test_concurrency_is_a_cap(q):
    cap, running, peak = 3, [0], [0]
    lock = threading.Lock()
    gate = threading.Event()

    def handler(job):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            if running[0] == cap:
                gate.set()
        gate.wait(20)  # hold slots until the cap is reached once
        with lock:
            running[0] -= 1

    q.enqueue_many(range(12))
    stats = emqfast.Worker(q, handler, concurrency=cap).run_until_idle(timeout_s=30)
    assert stats.completed == 12 and peak[0] == cap


def test_return_values_are_stored_as_json(r, q):
    values = [{"n": 1, "l": [1, "x", None]}, "ünïcode ✓", None, 2 ** 60, 1.5, True, [], {}]
    refs = q.enqueue_many(range(len(values)))
    emqfast.Worker(q, lambda job: values[job.payload]).run_until_idle(timeout_s=30)
    for ref, value in zip(refs, values):
        raw = r.hget(q.keys.job(ref.id), "result")
        assert json.loads(raw) == value
        job = q.get(ref.id)
        assert (job.state, job.result) == ("completed", value)


def test_unserialisable_result_fails_without_retry(q):
    refs = q.enqueue_many(["object", "nan"], attempts=3)
    calls = []

    def handler(job):
        calls.append(job.payload)
        return object() if job.payload == "object" else float("nan")

    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert sorted(calls) == ["nan", "object"] and stats.failed == 2
    for ref in refs:
        job = q.get(ref.id)
        assert job.state == "failed" and job.error.startswith("PayloadError")


def test_handler_exception_is_a_failure(q):
    ref = q.enqueue("x", attempts=1)

    def handler(job):
        raise ZeroDivisionError("division by zero")

    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    job = q.get(ref.id)
    assert stats.failed == 1
    assert (job.state, job.error) == ("failed", "ZeroDivisionError: division by zero")


# --- retention ---------------------------------------------------------------------------

def _finish(q, n_ok, n_bad):
    ok = [ref.id for ref in q.enqueue_many([f"ok{i}" for i in range(n_ok)])]
    bad = [ref.id for ref in q.enqueue_many([f"bad{i}" for i in range(n_bad)])]

    def handler(job):
        if job.payload.startswith("bad"):
            raise Unrecoverable("no")
        return job.payload

    emqfast.Worker(q, handler, concurrency=1).run_until_idle(timeout_s=30)
    return ok, bad


def test_trim_keeps_the_newest_finished_jobs(r, q):
    ok, bad = _finish(q, 6, 4)
    newest_ok = q.job_ids("completed", 0, 1)
    newest_bad = q.job_ids("failed", 0, 0)
    assert q.trim(keep_completed=2, keep_failed=1) == 4 + 3
    assert q.job_ids("completed") == newest_ok and q.job_ids("failed") == newest_bad
    for gone in set(ok + bad) - set(newest_ok + newest_bad):
        assert q.get(gone) is None and not r.exists(q.keys.job(gone))
    assert q.trim(keep_completed=2, keep_failed=1) == 0


def test_trim_by_age(r, q):
    _finish(q, 3, 2)
    assert q.trim(keep_completed=100, keep_failed=100, max_age_ms=3_600_000) == 0
    assert q.trim(keep_completed=100, keep_failed=100, max_age_ms=0) == 5
    assert q.counts()["completed"] == q.counts()["failed"] == 0


def test_worker_applies_retention(r, redis_url, qname):
    q = make_queue(redis_url, qname)
    ok, bad = _finish(q, 8, 5)
    assert q.counts()["completed"] == 8 and q.counts()["failed"] == 5
    newest_ok, newest_bad = q.job_ids("completed", 0, 2), q.job_ids("failed", 0, 1)
    emqfast.Worker(q, lambda job: None, keep_completed=3, keep_failed=2).run_until_idle(10)
    assert q.job_ids("completed") == newest_ok and q.job_ids("failed") == newest_bad
    assert sum(r.exists(q.keys.job(i)) for i in ok + bad) == 5


# --- cancel ----------------------------------------------------------------------------

def test_cancel_scheduled_and_pending(r, q):
    later = q.enqueue_in("later", 3_600_000)
    now = q.enqueue("now")
    keep = q.enqueue("keep")
    assert q.cancel(later.id) is True
    assert q.cancel(now.id) is True
    # a cancelled job keeps a record: state, cancelled set, counts
    assert q.get(later.id).state == "cancelled" and q.get(now.id).state == "cancelled"
    assert sorted(q.job_ids("cancelled")) == sorted([later.id, now.id])
    assert q.counts()["cancelled"] == 2
    assert q.job_ids("scheduled") == [] and q.job_ids("pending") == [keep.id]
    assert q.cancel(now.id) is False  # already cancelled
    seen = []
    emqfast.Worker(q, lambda job: seen.append(job.payload)).run_until_idle(timeout_s=30)
    assert seen == ["keep"]


def test_cancel_refuses_finished_jobs_and_only_marks_active_ones(r, q, qname):
    done = q.enqueue("done")
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    running = q.enqueue("running")
    claim(q, "w", lease_ms=60_000)
    before = dump_queue(r, qname)
    assert q.cancel(done.id) is False
    with pytest.raises(emqfast.JobNotFound):  # the missing-id rule
        q.cancel("JOB-never-existed")
    assert dump_queue(r, qname) == before
    # an active job is only marked and its worker told (the lease holder ends
    # it); it stays active here, with its lease
    assert q.cancel(running.id) == emqfast.CancelResult.REQUESTED
    assert r.hget(q.keys.job(running.id), "cancel") == b"1"
    assert q.get(running.id).state == "active" and r.hexists(q.keys.leases, running.id)


def test_cancel_of_a_retry_waiting_job(q):
    ref = q.enqueue("x", attempts=2, backoff=emqfast.Backoff.fixed(3_600_000))
    emqfast.Worker(q, lambda job: 1 / 0).run_until_idle(timeout_s=30)
    assert q.get(ref.id).state == "scheduled"
    assert q.cancel(ref.id) is True
    assert q.get(ref.id).state == "cancelled" and q.counts()["scheduled"] == 0


# --- graceful shutdown -------------------------------------------------------------------

_SIGTERM_WORKER = textwrap.dedent("""
    import json, os, sys
    import redis, emqfast
    from waiting import wait_until
    url, qname, go, slow_go = sys.argv[1:5]
    q = emqfast.Queue(qname, redis.Redis.from_url(url))

    def handler(job):
        path = slow_go if job.payload == "slow" else go
        wait_until(lambda: os.path.exists(path), 60, f"the test to create {path}")
        return "done " + job.payload

    w = emqfast.Worker(q, handler, concurrency=3, shutdown_timeout_s=1.5)
    stop = w.stop

    def stop_and_say():  # proof for the test that the signal was handled
        stop()
        open(go + ".stopped", "w").close()
    w.stop = stop_and_say
    stats = w.run()
    print(json.dumps(stats.__dict__))
""")


def test_sigterm_finishes_in_flight_jobs_and_never_releases_a_running_one(r, redis_url, qname, tmp_path):
    q = make_queue(redis_url, qname)
    refs = {p: q.enqueue(p).id for p in ("a", "b", "slow")}
    go, slow_go = tmp_path / "go", tmp_path / "slow-go"
    proc = subprocess.Popen([sys.executable, "-c", _SIGTERM_WORKER, redis_url, qname,
                             str(go), str(slow_go)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": CHILD_PATH})
    try:
        wait_until(lambda: all(q.get(i).state == "active" for i in refs.values()),
                   what="all three jobs running")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: os.path.exists(str(go) + ".stopped"), what="SIGTERM handled")
        go.touch()  # the in-flight a and b may now finish: they must be recorded
        wait_until(lambda: all(q.get(refs[p]).state == "completed" for p in ("a", "b")),
                   what="a and b recorded")
        # past shutdown_timeout_s the slow handler still runs: its job is NOT released (it
        # would run twice): it stays active under this worker's lease
        time.sleep(2.0)
        slow = q.get(refs["slow"])
        assert (slow.state, slow.attempts) == ("active", 1)
        assert proc.poll() is None
        slow_go.touch()  # the late handler returns: its outcome is written, then run() returns
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert (stats["completed"], stats["released"], stats["claimed"]) == (3, 0, 3)
    for p in ("a", "b", "slow"):
        job = q.get(refs[p])
        assert (job.state, job.result, job.attempts) == ("completed", "done " + p, 1)
    assert q.counts()["active"] == 0 and r.hlen(q.keys.leases) == 0


def test_acker_survives_an_unexpected_error_and_the_job_is_rerun(q, monkeypatch):
    """If writing a batch of outcomes fails in an unexpected way (a bug, not a lost
    connection), the acker thread must not die silently leaving the worker hung with
    leases renewed forever: the jobs are handed back to the reaper and re-run."""
    ref = q.enqueue({"n": 1})
    runs = []
    original = emqfast.Worker._ack_outcomes
    broken = {"left": 1}

    def flaky_write(self, batch):
        if broken["left"]:
            broken["left"] -= 1
            raise RuntimeError("unexpected failure while writing outcomes")
        return original(self, batch)

    monkeypatch.setattr(emqfast.Worker, "_ack_outcomes", flaky_write)
    worker = emqfast.Worker(q, lambda job: runs.append(job.id) or "ok", lease_ms=300)
    worker.run_until_idle(timeout_s=20)

    def rerun_until_completed() -> bool:  # the reaper hands the job back after the lease
        if q.get(ref.id).state == "completed":
            return True
        worker.run_until_idle(timeout_s=20)
        return False
    wait_until(rerun_until_completed, 20, "the reaped job to be re-run and completed")
    assert runs == [ref.id, ref.id]
    assert q.get(ref.id).result == "ok"
