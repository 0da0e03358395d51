"""Engine contract: leases and the reaper. Only the lease holder finishes a job; expired
leases return jobs to pending on the server clock; repeated stalls fail the job."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import emqfast
from conftest import dump_queue
from emqfast.core.errors import LeaseLost
from engine_util import skewed_local_clock  # noqa: F401 (fixture)
from engine_util import (claim, complete, extend, fail, make_queue, running_worker, server_ms,
                         wait_server_past)
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what the worker scripts import from: this checkout, and tests/ (they wait with waiting.py)
CHILD_PATH = os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


def _deadline(r, q, job_id) -> int:
    return int(r.zscore(q.keys.active, job_id))


# --- tokens -------------------------------------------------------------------------

def test_complete_and_fail_require_the_token(r, q, qname):
    ref = q.enqueue("x")
    [(job_id, token)] = claim(q, "w1", lease_ms=60_000)
    assert job_id == ref.id and token.startswith("w1:")
    before = dump_queue(r, qname)
    for forged in ("", "w1:0", token + "0", "w2:" + token.split(":")[-1]):
        with pytest.raises(LeaseLost):
            complete(q, job_id, forged, b'"stolen"')
        with pytest.raises(LeaseLost):
            fail(q, job_id, forged)
        assert extend(q, 60_000, (job_id, forged)) == [0]
    assert dump_queue(r, qname) == before
    wait_ms, run_ms = complete(q, job_id, token, b'"mine"')  # the run's times, for the worker
    assert wait_ms >= 0 and run_ms >= 0
    job = q.get(job_id)
    assert (job.state, job.result) == ("completed", "mine")
    finished = dump_queue(r, qname)
    # the holder's re-sent ack (reply lost) is idempotent; nobody else can finish it again
    assert complete(q, job_id, token, b'"again"') == [-1, -1]  # timed already: not twice
    with pytest.raises(LeaseLost):
        complete(q, job_id, "w1:" + token, b'"again"')
    with pytest.raises(LeaseLost):
        fail(q, job_id, token)
    assert dump_queue(r, qname) == finished
    assert q.get(job_id).result == "mine"


def test_one_complete_call_settles_each_job_by_its_own_lease(r, q, qname):
    """Workers acknowledge a batch in one complete.lua call; each job in it is still
    judged by its own lease: a lost one is refused and left untouched, the others
    complete, and a job named twice completes once."""
    from emqfast.backends.scripts import load
    from emqfast.core.version import KEYSPACE_VERSION

    refs = q.enqueue_many(["a", "b", "c"])
    pairs = claim(q, "w", lease_ms=60_000, n=3)
    assert [j for j, _ in pairs] == [ref.id for ref in refs]
    (a, ta), (b, tb), (c, tc) = pairs
    k = q.keys
    triples = [(a, ta, b'"A"'), (b, tb + "0", b'"stolen"'), (c, tc, b'"C"'), (c, tc, b'"C2"')]
    reply = load("complete")(r, [k.active, k.leases, k.completed, k.meta, k.events, k.metrics,
                                 k.waiters, k.dependents, k.outbox, *k.jobs([t[0] for t in triples])],
                             [KEYSPACE_VERSION, *[x for t in triples for x in (*t, "")]])
    assert reply[0][1] >= 0 and reply[2][1] >= 0  # timed runs
    assert reply[1].startswith(b"EMQLEASE")
    assert reply[3] == [-1, -1]  # the second mention: already completed by this token
    assert [q.get(j).state for j in (a, b, c)] == ["completed", "active", "completed"]
    assert (q.get(a).result, q.get(c).result) == ("A", "C")
    assert r.hget(k.leases, b) == tb.encode() and r.zscore(k.active, b) is not None
    assert r.hlen(k.leases) == 1 and r.zcard(k.active) == 1
    assert int(r.hget(k.metrics, "completed")) == 2
    assert q.counts()["completed"] == 2


def test_tokens_are_unique_per_claim(q):
    q.enqueue_many(range(20))
    tokens = [t for _ in range(4) for _, t in claim(q, "w", lease_ms=60_000, n=5)]
    assert len(tokens) == len(set(tokens)) == 20


def test_a_batch_claim_stores_exactly_its_leases_and_deadlines(r, q):
    """A claim of many jobs keeps its leases hash and active zset hashed (lookups by id
    stay O(1) with hundreds in flight) and holds nothing but the claimed jobs."""
    q.enqueue_many([str(i) for i in range(40)])
    first = claim(q, "w1", lease_ms=60_000, n=30)
    second = claim(q, "w2", lease_ms=60_000, n=3)  # a small claim adds to the same sets
    pairs = dict(first + second)
    assert len(pairs) == 33
    assert {k.decode(): v.decode() for k, v in r.hgetall(q.keys.leases).items()} == pairs
    assert {m.decode() for m in r.zrange(q.keys.active, 0, -1)} == set(pairs)
    assert r.object("encoding", q.keys.leases) == b"hashtable"
    assert r.object("encoding", q.keys.active) == b"skiplist"


def test_taken_over_lease_cannot_overwrite_new_owner(r, q):
    ref = q.enqueue({"n": 1})
    [(job_id, old)] = claim(q, "zombie", lease_ms=200)
    wait_server_past(r, _deadline(r, q, job_id))
    assert q.reap() == (1, 0)
    [(again, new)] = claim(q, "fresh", lease_ms=60_000)
    assert again == job_id and new != old
    with pytest.raises(LeaseLost):
        complete(q, job_id, old, b'"zombie"')
    with pytest.raises(LeaseLost):
        fail(q, job_id, old, delay=0)
    assert extend(q, 60_000, (job_id, old)) == [0]
    assert q.get(job_id).state == "active"
    assert complete(q, job_id, new, b'"fresh"')[1] >= 0
    job = q.get(ref.id)
    assert (job.state, job.result, job.attempts, job.stalls) == ("completed", "fresh", 1, 1)
    assert r.hget(q.keys.job(job_id), "worker") == new.encode()


# --- the reaper ----------------------------------------------------------------------

def test_reaper_uses_the_server_clock(r, q, skewed_local_clock):
    long_ref = q.enqueue("long")
    [(long_id, _)] = claim(q, "w", lease_ms=3_600_000)
    short_ref = q.enqueue("short")
    [(short_id, _)] = claim(q, "w", lease_ms=150)
    assert (long_id, short_id) == (long_ref.id, short_ref.id)
    q.reap()  # with the local clock a day ahead, a local-clock reaper would take both
    wait_server_past(r, _deadline(r, q, short_id))
    q.reap()
    assert q.get(long_id).state == "active"
    assert q.get(short_id).state == "pending"
    assert q.job_ids("pending") == [short_id]
    assert q.job_ids("active") == [long_id]
    assert r.hget(q.keys.leases, short_id) is None


def test_stalls_beyond_max_stalled_fail_the_job(r, q):
    ref = q.enqueue("fragile", attempts=5)
    for round_ in (1, 2):
        [(job_id, _)] = claim(q, f"w{round_}", lease_ms=100)
        assert q.get(job_id).attempts == 1
        wait_server_past(r, _deadline(r, q, job_id))
        requeued, failed = q.reap(max_stalled=1)
        if round_ == 1:
            assert (requeued, failed) == (1, 0)
            job = q.get(ref.id)
            # the stalled run is not counted as an attempt
            assert (job.state, job.stalls, job.attempts) == ("pending", 1, 0)
        else:
            assert (requeued, failed) == (0, 1)
    job = q.get(ref.id)
    assert (job.state, job.error, job.stalls) == ("failed", "stalled", 2)
    assert q.job_ids("failed") == [ref.id]
    assert q.counts() == {"scheduled": 0, "pending": 0, "grouped": 0, "active": 0,
                          "completed": 0, "failed": 1, "cancelled": 0, "waiting_deps": 0, "expired": 0}
    assert r.hlen(q.keys.leases) == 0


def test_max_stalled_zero_fails_on_first_stall(r, q):
    ref = q.enqueue("x")
    [(job_id, _)] = claim(q, "w", lease_ms=100)
    wait_server_past(r, _deadline(r, q, job_id))
    assert q.reap(max_stalled=0) == (0, 1)
    assert q.get(ref.id).error == "stalled"


def test_reaped_job_keeps_its_place_in_its_tier(r, q):
    first = q.enqueue("first", priority=2)
    [(job_id, _)] = claim(q, "w", lease_ms=100)
    later = [q.enqueue(i, priority=2).id for i in range(3)]
    better = q.enqueue("better", priority=1).id
    wait_server_past(r, _deadline(r, q, job_id))
    assert q.reap() == (1, 0)
    assert q.job_ids("pending") == [better, first.id, *later]


# --- leases held by real Workers ----------------------------------------------------------

def test_handler_extends_its_own_lease(r, redis_url, qname):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("long")
    seen = {}

    def handler(job):
        job.extend_lease(5_000)
        seen["manual"], seen["now"] = _deadline(r, q, job.id), server_ms(r)
        # let the worker beat (and auto-extend, 300 ms leases) several times:
        # an automatic renewal must never shorten the lease the handler asked for
        wait_server_past(r, q.get(job.id).started_ms + 1_000)
        seen["after"] = _deadline(r, q, job.id)
        return "ok"

    stats = emqfast.Worker(q, handler, lease_ms=300).run_until_idle(timeout_s=30)
    assert seen["manual"] >= seen["now"] + 4_000
    assert seen["after"] >= seen["manual"]
    assert (stats.completed, stats.lease_lost) == (1, 0)
    assert q.get(ref.id).state == "completed"


def test_extend_lease_outside_a_handler_is_refused(q):
    q.enqueue("x")
    job = q.get(q.job_ids("pending")[0])
    with pytest.raises(RuntimeError):
        job.extend_lease(1_000)


def test_long_handler_completes_exactly_once(r, redis_url, qname):
    """A handler running 4x lease_ms keeps its job: the worker renews the lease, and a second
    worker reaping the same queue all along never takes the job over."""
    q = make_queue(redis_url, qname)
    ref = q.enqueue("slow")
    calls = []
    lock = threading.Lock()

    def handler(job):
        with lock:
            calls.append(job.id)
        wait_server_past(r, q.get(job.id).started_ms + 1_200)
        return len(calls)

    # either may claim it; the other keeps reaping the queue on its 75 ms beat
    one = emqfast.Worker(q, handler, lease_ms=300)
    two = emqfast.Worker(make_queue(redis_url, qname), handler, lease_ms=300)
    with running_worker(one), running_worker(two):
        wait_until(lambda: q.get(ref.id).state == "completed", what="slow job completed")
    job = q.get(ref.id)
    assert calls == [ref.id]
    assert (job.attempts, job.stalls, job.result) == (1, 0, 1)
    assert job.finished_ms - job.started_ms >= 1_200  # it really outlived 4 leases
    assert one.stats.lease_lost == two.stats.lease_lost == 0
    assert one.stats.completed + two.stats.completed == 1
    assert one.stats.claimed + two.stats.claimed == 1


_FROZEN_WORKER = textwrap.dedent("""
    import json, sys
    import redis, emqfast
    from emqfast.core.errors import LeaseLost
    from waiting import wait_until
    url, qname = sys.argv[1:3]
    q = emqfast.Queue(qname, redis.Redis.from_url(url))
    report = {}

    def handler(job):
        q.redis.set(qname + ":began", job.id)  # the test freezes us inside the handler
        # runs until somebody else finished this job (we get frozen meanwhile)
        wait_until(lambda: q.get(job.id).state == "completed", 60,
                   "another worker to complete the job", interval=0.01)
        try:
            job.extend_lease(1_000)
            report["extend"] = "ok"
        except LeaseLost:
            report["extend"] = "LeaseLost"
        return "from-frozen"

    stats = emqfast.Worker(q, handler, lease_ms=300).run_until_idle(timeout_s=60)
    report.update(stats.__dict__)
    print(json.dumps(report))
""")


def test_frozen_worker_loses_its_lease_to_a_live_one(r, redis_url, qname):
    """A worker frozen (SIGSTOP) past its lease is reaped; a live worker runs the job; when
    the frozen one thaws, its extension and its outcome are refused (LeaseLost)."""
    q = make_queue(redis_url, qname)
    ref = q.enqueue("contended")
    frozen = subprocess.Popen([sys.executable, "-c", _FROZEN_WORKER, redis_url, qname],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": CHILD_PATH})
    try:
        # frozen inside its handler (frozen between claim and start, it would never run it)
        wait_until(lambda: r.get(qname + ":began") == ref.id.encode(),
                   what="frozen worker's handler began")
        frozen.send_signal(signal.SIGSTOP)
        ran = []
        live = emqfast.Worker(make_queue(redis_url, qname),
                              lambda job: ran.append(job.id) or "from-live", lease_ms=300)
        with running_worker(live):
            wait_until(lambda: q.get(ref.id).state == "completed", what="live worker finished")
        frozen.send_signal(signal.SIGCONT)
        out, err = frozen.communicate(timeout=60)
    finally:
        if frozen.poll() is None:
            frozen.send_signal(signal.SIGCONT)
            frozen.kill()
            frozen.wait()
    assert frozen.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["extend"] == "LeaseLost"
    assert report["lease_lost"] == 1 and report["completed"] == 0
    assert ran == [ref.id] and live.stats.completed == 1
    job = q.get(ref.id)
    assert (job.state, job.result, job.stalls) == ("completed", "from-live", 1)
    assert q.counts()["completed"] == 1 and r.hlen(q.keys.leases) == 0


_DYING_WORKER = textwrap.dedent("""
    import sys, time
    import redis, emqfast
    url, qname = sys.argv[1:3]
    q = emqfast.Queue(qname, redis.Redis.from_url(url))

    def handler(job):
        time.sleep(3600)  # killed mid-job

    emqfast.Worker(q, handler, lease_ms=300).run()
""")


def test_killed_worker_job_is_reaped_and_rerun(redis_url, qname):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("survivor")
    dying = subprocess.Popen([sys.executable, "-c", _DYING_WORKER, redis_url, qname],
                             env={**os.environ, "PYTHONPATH": CHILD_PATH})
    try:
        wait_until(lambda: q.get(ref.id).state == "active", what="dying worker claimed")
    finally:
        dying.kill()
        dying.wait()
    # the dead worker's lease runs out on the server clock; then a new worker reaps it
    wait_server_past(q.redis, _deadline(q.redis, q, ref.id))
    stats = emqfast.Worker(q, lambda job: "rerun", lease_ms=300).run_until_idle(timeout_s=30)
    job = q.get(ref.id)
    assert (job.state, job.result, job.attempts, job.stalls) == ("completed", "rerun", 1, 1)
    assert stats.completed == 1


def test_acks_are_cut_into_calls_no_command_can_outgrow(q):
    """A Worker's ack batch becomes complete.lua calls of at most COMPLETE_CHUNK jobs and ~1 MB of
    results (Redis drops a client whose single command outgrows its query buffer), with
    each failure in a call of its own; every outcome maps back to its own reply."""
    from emqfast.worker import calls as acks, outcomes
    from emqfast.facade.job import Job

    def job(i: int) -> Job:
        return Job(id=f"JOB{i:024d}", queue=q.name, state="active", payload=None, attempts=1,
                   max_attempts=3, priority=0, backoff=None)

    small = [outcomes.success(job(i), f"w:{i}", i) for i in range(450)]
    big = [outcomes.success(job(1000 + i), f"w:{i}", "x" * 600_000) for i in range(4)]
    failed = outcomes.failure(job(2000), "w:f", RuntimeError("no"), "tb")
    plan = acks.AckPlan(q.keys, [*small[:100], failed, *small[100:], *big])
    per_call = [(len(c.keys) - 9, sum(len(a) for a in c.args[3::6])) for c in plan.calls
                if c.script.name == "complete"]
    c = acks.COMPLETE_CHUNK  # full calls of small results, then the rest shares a call
    assert [n for n, _ in per_call] == [c] * (450 // c) + [450 % c + 1, 1, 1, 1]  # with a big one
    assert all(size <= acks.COMPLETE_CHUNK_BYTES or n == 1 for n, size in per_call)
    assert sum(c.script.name == "fail" for c in plan.calls) == 1
    assert plan.retrying.count(None) == 454 and plan.retrying[100] is True
    # replies map back in batch order: the failure's own, then each job's entry
    replies = [[1, 2, 3] if c.script.name == "fail" else
               [[i, i] for i in range(len(c.keys) - 6)] for c in plan.calls]
    mapped = plan.replies(replies)
    assert mapped[100] == [1, 2, 3] and mapped[0] == [0, 0] and mapped[101] == [100, 100]
