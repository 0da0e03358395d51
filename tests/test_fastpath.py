"""Throughput guarantees of the worker's fast path: batch claims and
prefetch keep one lease and one token per job, never run more than
``concurrency`` handlers at once, complete each job exactly once, hand
never-started jobs back on stop; the marker wait ends on our own deadline."""
from __future__ import annotations

import statistics
import threading
import time
from typing import Any, Callable, List

import pytest
import redis

import emqfast
from emqfast.worker.calls import JobRows
from emqfast.worker.leases import Prefetch
from emqfast.facade.job import Job
from emqfast.worker.wake import MarkerWaiter
from waiting import wait_until



@pytest.fixture
def q(redis_url, qname):
    client = redis.Redis.from_url(redis_url)
    yield emqfast.Queue(qname, client)
    client.close()


# --- batches and prefetch -------------------------------------------------------------
def test_prefetched_batches_keep_one_lease_and_token_per_job(q, backend):
    """A fixed prefetch claims far more than `concurrency` jobs per round trip; each
    claimed job has its own lease entry and its own token, and each completes once."""
    n = 300
    ids = [r.id for r in q.enqueue_many([{"i": i} for i in range(n)])]
    tokens = {}
    leases_seen: List[int] = []
    lock = threading.Lock()

    def handler(job):
        held = q.redis.hgetall(q.keys.leases)
        with lock:
            tokens[job.id] = held[job.id.encode()].decode()
            leases_seen.append(len(held))

    w = emqfast.Worker(q, handler, concurrency=2, prefetch=100, batch_size=100)
    stats = w.run_until_idle(timeout_s=60)
    assert stats.completed == n and stats.claimed == n
    assert sorted(tokens) == sorted(ids)
    assert len(set(tokens.values())) == n, "two jobs shared a lease token"
    assert max(leases_seen) > 2, "no job was ever held beyond concurrency (prefetch unused)"
    assert q.counts()["completed"] == n and q.redis.hlen(q.keys.leases) == 0
    for job_id in ids[:5]:
        assert q.get(job_id).state == "completed"
        assert q.get(job_id).attempts == 1


def test_never_more_handlers_than_concurrency(q, backend):
    """However many jobs are held, at most `concurrency` handlers run at the same time."""
    q.enqueue_many(list(range(400)))
    running, peak = [0], [0]
    lock = threading.Lock()

    def handler(job):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.0005)  # long enough for threads to overlap if they could
        with lock:
            running[0] -= 1

    w = emqfast.Worker(q, handler, concurrency=3, prefetch=200)
    assert w.run_until_idle(timeout_s=60).completed == 400
    assert peak[0] <= 3
    assert peak[0] >= 2, "handlers never overlapped: the pool is not used"


def test_adaptive_prefetch_grows_for_fast_handlers_only():
    """No prefetch until timed; whole batches for no-op handlers; none for slow ones."""
    p = Prefetch(concurrency=8, limit=None)
    assert p.extra() == 0 and p.capacity() == 8
    for _ in range(50):
        p.observe(2e-6)
    assert p.extra() >= 256
    slow = Prefetch(concurrency=8, limit=None)
    for _ in range(50):
        slow.observe(0.5)
    assert slow.extra() == 0
    assert Prefetch(concurrency=4, limit=0).capacity() == 4


def test_stop_hands_back_prefetched_jobs_without_counting_an_attempt(q, backend):
    """Jobs claimed ahead but not started go back to pending on stop, attempts untouched."""
    n = 50
    q.enqueue_many(list(range(n)))
    gate = threading.Event()
    entered = threading.Event()

    def handler(job):
        entered.set()
        gate.wait(20)

    w = emqfast.Worker(q, handler, concurrency=1, prefetch=n, batch_size=n)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        entered.wait(20)
        wait_until(lambda: q.counts()["pending"] == 0, what="the whole batch claimed")
        w.stop()
        # the waiting jobs are released while the one running handler is still blocked
        wait_until(lambda: q.counts()["pending"] == n - 1, what="prefetched jobs released")
    finally:
        gate.set()
        t.join(30)
    assert not t.is_alive()
    assert w.stats.released == n - 1 and w.stats.completed == 1
    pending = q.job_ids("pending")
    assert len(pending) == n - 1
    assert all(q.get(i).attempts == 0 for i in pending)
    assert q.redis.hlen(q.keys.leases) == 0


def test_outcomes_of_a_batch_are_written_per_job(q, backend):
    """Done, retried and failed outcomes in the same batches each land on their own job."""
    refs = q.enqueue_many([{"k": i % 3} for i in range(90)], attempts=2,
                          backoff=emqfast.Backoff.fixed(60_000))

    def handler(job):
        if job.payload["k"] == 1:
            raise ValueError("retry me")
        if job.payload["k"] == 2:
            raise emqfast.Unrecoverable("give up")
        return {"ok": job.payload["k"]}

    stats = emqfast.Worker(q, handler, concurrency=4, prefetch=64).run_until_idle(timeout_s=60)
    assert (stats.completed, stats.retried, stats.failed) == (30, 30, 30)
    states = {r.id: q.get(r.id) for r in refs}
    for i, r in enumerate(refs):
        job = states[r.id]
        assert job.state == ("completed", "scheduled", "failed")[i % 3]
        if i % 3 == 0:
            assert job.result == {"ok": 0}


def test_job_rows_match_job_from_hash():
    """The cached fast constructor builds exactly what Job.from_hash builds."""
    opts = b'{"a":5,"p":7,"b":[1,1000,60000,0.2,0],"tag":{"x":[1]}}'
    rows = JobRows("qq")
    for payload, enc in ((b'{"n":1}', b"j"), (b"\x00raw", b"b")):
        row = [2, payload, enc, opts, b"1700000000000"]
        fast = rows.job("JOB1", row)
        slow = Job.from_hash("qq", "JOB1", {
            b"state": b"active", b"payload": payload, b"enc": enc, b"opts": opts,
            b"attempts": 2, b"created": b"1700000000000"})
        assert fast == slow
    a, b = rows.job("JOB1", row), rows.job("JOB2", row)
    a.extra["tag"]["x"].append(2)
    assert b.extra["tag"] == {"x": [1]}, "jobs share mutable option values"
    plain = b'{"a":3,"p":0,"b":null}'
    c, d = rows.job("JOB3", [1, b"1", b"j", plain, b"1"]), rows.job("JOB4", [1, b"1", b"j", plain, b"1"])
    c.extra["mine"] = 1
    assert d.extra == {}


# --- waiting on the marker ----------------------------------------------------------------
def test_marker_wait_ends_on_our_deadline_not_redis_hz(redis_url, qname):
    """Redis fires a 10 ms BZPOPMIN timeout on its next hz tick (tens of ms late); the
    waiter ends within a few ms of its own deadline, and pops nothing when it does."""
    client = redis.Redis.from_url(redis_url)
    key = f"emq:{{{qname}}}:marker"
    waiter = MarkerWaiter(client)
    try:
        overshoot = []
        for _ in range(7):
            start = time.perf_counter()
            assert waiter.wait(key, 0.010) is None
            overshoot.append(time.perf_counter() - start - 0.010)
        assert statistics.median(overshoot) < 0.025, overshoot
        # a member that arrives while blocked still wakes it at once
        timer = threading.Timer(0.05, lambda: client.zadd(key, {"0": 0}))
        timer.start()
        start = time.perf_counter()
        assert waiter.wait(key, 5.0) == (b"0", 0.0)
        assert time.perf_counter() - start < 2.0
        timer.join()
        # ending a wait early never swallows a member added right after
        assert waiter.wait(key, 0.005) is None
        client.zadd(key, {"1": 123})
        assert waiter.wait(key, 1.0) == (b"1", 123.0)
        assert client.zcard(key) == 0
    finally:
        waiter.close()
        client.close()


def test_idle_worker_starts_a_delayed_job_on_time(redis_url, qname):
    """An idle worker blocked on the marker starts a job due in 300 ms within tens of ms
    of its run-at (the beat is 1 s and Redis' blocking timeouts fire on a 100 ms tick)."""
    client = redis.Redis.from_url(redis_url)
    q = emqfast.Queue(qname, client)
    lateness: List[float] = []

    def handler(job):
        sec, usec = client.time()
        lateness.append(sec * 1000 + usec / 1000 - job.payload["at"])

    w = emqfast.Worker(q, handler, concurrency=1, lease_ms=30_000)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        for i in range(5):
            sec, usec = client.time()
            at = sec * 1000 + usec // 1000 + 300
            q.enqueue_at({"at": at}, at)
            wait_until(lambda: len(lateness) == i + 1, what="the delayed job to run")
    finally:
        w.stop()
        t.join(30)
        client.close()
    assert min(lateness) >= 0, "a job ran before its run-at"
    assert statistics.median(lateness) < 40, lateness


def test_marker_wait_falls_back_when_acls_refuse_client_commands(redis_url, r, qname):
    """A user without CLIENT ID / UNBLOCK still gets woken by new work and by its timeout
    (on Redis' tick), with no error."""
    user, password = f"u-{qname}", "pw-" + qname
    r.acl_setuser(user, enabled=True, passwords=["+" + password], keys=["*"],
                  commands=["+@all", "-client"])
    try:
        url = redis_url.replace("redis://", f"redis://{user}:{password}@")
        client = redis.Redis.from_url(url)
        key = f"emq:{{{qname}}}:marker"
        waiter = MarkerWaiter(client)
        try:
            assert waiter.wait(key, 0.01) is None
            client.zadd(key, {"0": 0})
            assert waiter.wait(key, 5.0) == (b"0", 0.0)
        finally:
            waiter.close()
            client.close()
    finally:
        r.acl_deluser(user)
