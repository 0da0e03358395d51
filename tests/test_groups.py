"""Group lanes: grouped jobs wait in their group's lane, workers serve ready groups in
turn (a big tenant cannot starve a small one), per-group concurrency caps hold across
workers, and promote / reap / retry / cancel keep grouped jobs in their lanes."""
from __future__ import annotations

import asyncio
import threading

import pytest

import emqfast
import emqfast.aio as emq
from emqfast.core.errors import InvalidInput, RangeError
from conftest import dump_queue
from engine_util import make_queue, wait_server_past
from waiting import wait_until

BIG, SMALL = 5000, 10
# The Worker's beat trims completed jobs to keep_completed (default 1,000) every 5 s: a run
# slower than that on a loaded host would trim the jobs the tests count.
KEEP_ALL = 100_000


def _fair_handler(q_counts, seen: dict):
    """Count the small tenant's jobs; when its last one runs, note the big lane's size."""
    def handler(job):
        if job.extra["g"] == "small":
            seen["small"] += 1
            if seen["small"] == SMALL:
                seen["big_pending"] = q_counts()
    return handler


def test_small_tenant_finishes_while_big_one_still_has_thousands_pending(redis_url, qname,
                                                                          backend):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(BIG)), group="big")  # the big tenant arrives first
    q.enqueue_many(list(range(SMALL)), group="small")
    assert q.groups.counts("big") == {"pending": BIG, "active": 0}
    # grouped jobs wait in lanes, not the flat set; counts() includes them in pending
    assert q.redis.zcard(q.keys.pending) == 0
    assert q.counts()["pending"] == q.counts()["grouped"] == BIG + SMALL
    seen = {"small": 0}
    w = emqfast.Worker(q, _fair_handler(lambda: q.groups.counts("big")["pending"], seen),
                       concurrency=4, keep_completed=KEEP_ALL)
    w.run_until_idle(timeout_s=120)
    assert seen["small"] == SMALL
    assert seen["big_pending"] >= 3000, seen  # thousands of the big tenant still waiting
    assert q.counts()["completed"] == BIG + SMALL
    assert q.groups.list() == []  # drained lanes leave the ring


def test_fairness_under_the_aio_worker(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(BIG)), group="big")
        await q.enqueue_many(list(range(SMALL)), group="small")
        sync_q = make_queue(redis_url, qname)  # read the lane from the handler (a thread-free call)
        seen = {"small": 0}
        handler = _fair_handler(lambda: sync_q.groups.counts("big")["pending"], seen)
        await emq.Worker(q, handler, concurrency=4,
                         keep_completed=KEEP_ALL).run_until_idle(timeout_s=120)
        return seen, await q.counts()
    seen, counts = asyncio.run(asyncio.wait_for(main(), 150))
    assert seen["small"] == SMALL
    assert seen["big_pending"] >= 3000, seen
    assert counts["completed"] == BIG + SMALL


def test_flat_and_grouped_jobs_are_interleaved(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(50)), group="a")
    q.enqueue_many([f"flat{i}" for i in range(50)])
    order = []
    emqfast.Worker(q, lambda job: order.append(job.extra.get("g", "flat")),
                   concurrency=1).run_until_idle(timeout_s=60)
    assert len(order) == 100
    # the flat set is one more "group": neither side waits for the other to drain
    assert 15 <= order[:40].count("a") <= 25, order[:40]


def test_group_cap_holds_across_two_workers(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("t", 2)
    assert q.groups.concurrency("t") == 2
    q.enqueue_many(list(range(40)), group="t")
    q.enqueue_many(list(range(40)), group="free")  # uncapped: may run alongside
    lock = threading.Lock()
    now = {"t": 0, "free": 0}
    peak = {"t": 0, "free": 0}
    both = threading.Barrier(2, timeout=0.02)  # keeps jobs overlapping without sleeping

    def handler(job):
        g = job.extra["g"]
        with lock:
            now[g] += 1
            peak[g] = max(peak[g], now[g])
        try:
            both.wait()
        except threading.BrokenBarrierError:
            both.reset()
        with lock:
            now[g] -= 1
    workers = [emqfast.Worker(make_queue(redis_url, qname), handler, concurrency=4)
               for _ in range(2)]
    threads = [threading.Thread(target=w.run_until_idle, kwargs={"timeout_s": 60})
               for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert q.counts()["completed"] == 80
    assert peak["t"] <= 2, peak
    assert peak["t"] == 2  # the cap admits two at once, not fewer
    q.groups.set_concurrency("t", None)
    assert q.groups.concurrency("t") is None


def test_promoted_grouped_job_rejoins_its_lane(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    ref = q.enqueue_in("later", 30, group="g1")
    assert ref.status == "scheduled"
    assert q.groups.counts("g1")["pending"] == 0 and q.groups.list() == []
    wait_server_past(r, q.get(ref.id).run_at_ms)
    assert q.promote() == 1
    assert r.zrange(q.keys.pending, 0, -1) == []  # not on the flat set (job_ids lists lanes too)
    assert r.zrange(q.keys.group_pending("g1"), 0, -1) == [ref.id.encode()]
    assert q.groups.list() == ["g1"]
    assert q.get(ref.id).state == "pending"


def test_reaped_grouped_job_frees_its_slot_and_returns_to_its_lane(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("g1", 1)
    first = q.enqueue("one", group="g1")
    second = q.enqueue("two", group="g1")
    from emqfast.worker import calls as w
    call = w.claim_call(q.keys, 5, 50, "zombie", ["g1"])
    reply = call.script(q.redis, call.keys, call.args)
    _, _, _, pairs = w.parse_claim(reply)
    assert [i for i, _ in pairs] == [first.id]  # the cap admits one
    assert q.groups.counts("g1") == {"pending": 1, "active": 1}
    # at its cap: a second claim takes nothing and says to poll again soon
    call = w.claim_call(q.keys, 5, 10_000, "other", ["g1"])
    now, status, next_due, pairs = w.parse_claim(call.script(q.redis, call.keys, call.args))
    assert pairs == [] and status == 1 and now < next_due <= now + w.CAP_POLL_MS
    wait_server_past(r, int(r.zscore(q.keys.active, first.id)))
    assert q.reap() == (1, 0)
    assert sorted(r.zrange(q.keys.group_pending("g1"), 0, -1)) == \
        sorted([first.id.encode(), second.id.encode()])
    assert r.zcard(q.keys.pending) == 0  # back in the lane, not the flat set
    assert q.counts()["pending"] == q.counts()["grouped"] == 2
    # the slot is free again: the next claim takes one job of the group
    call = w.claim_call(q.keys, 5, 10_000, "other", ["g1"])
    _, _, _, pairs = w.parse_claim(call.script(q.redis, call.keys, call.args))
    assert len(pairs) == 1


def test_cancel_removes_a_grouped_job_from_its_lane(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    keep = q.enqueue("keep", group="g1")
    gone = q.enqueue("gone", group="g1")
    assert q.cancel(gone.id)
    assert q.get(gone.id).state == "cancelled"  # its record stays
    assert r.zrange(q.keys.group_pending("g1"), 0, -1) == [keep.id.encode()]
    assert not q.cancel(gone.id)


def test_retry_of_a_failed_grouped_job_goes_to_its_lane(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("boom", group="g1", attempts=1)

    def handler(job):
        raise RuntimeError("boom")
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    assert q.job_ids("failed") == [ref.id]
    assert q.groups.list() == []
    q.retry(ref.id)
    assert r.zrange(q.keys.group_pending("g1"), 0, -1) == [ref.id.encode()]
    assert q.groups.list() == ["g1"]
    assert r.zrange(q.keys.pending, 0, -1) == []  # not on the flat set (job_ids lists lanes too)


def test_zero_delay_retry_of_a_grouped_job_stays_in_its_lane(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("g1", 1)
    ref = q.enqueue("flaky", group="g1", attempts=3, backoff=emqfast.Backoff.fixed(0))
    runs = []

    def handler(job):
        runs.append(job.attempts)
        if job.attempts < 3:
            raise RuntimeError("again")
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert runs == [1, 2, 3]
    assert q.get(ref.id).state == "completed"


@pytest.mark.parametrize("group, error", [
    ("", InvalidInput), ("a{b}", InvalidInput), ("x\0y", InvalidInput), ("é" * 101, InvalidInput),
    (42, InvalidInput)])
def test_bad_group_names_are_typed_errors_and_write_nothing(redis_url, qname, r, group, error):
    q = make_queue(redis_url, qname)
    q.enqueue("seed", group="ok")
    before = dump_queue(r, qname)
    with pytest.raises(error):
        q.enqueue("x", group=group)
    with pytest.raises(error):
        q.enqueue_many(["x", "y"], group=group)
    with pytest.raises(error):
        q.groups.set_concurrency(group, 2)
    assert dump_queue(r, qname) == before


def test_bad_concurrency_is_a_typed_error_and_writes_nothing(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("seed", group="ok")
    before = dump_queue(r, qname)
    for bad, error in ((0, RangeError), (-1, RangeError), (1.5, InvalidInput), (True, InvalidInput)):
        with pytest.raises(error):
            q.groups.set_concurrency("ok", bad)
    assert dump_queue(r, qname) == before


def test_released_grouped_job_returns_to_its_lane(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("busy")  # takes the only handler slot, so "held" waits claimed, not started
    ref = q.enqueue("held", group="g1")
    gate = threading.Event()
    w = emqfast.Worker(q, lambda job: gate.wait(20), concurrency=1, prefetch=1,
                       shutdown_timeout_s=0.1)
    t = threading.Thread(target=w.run)
    t.start()
    wait_until(lambda: w.stats.claimed >= 2, what="held job claimed")
    w.stop()
    wait_until(lambda: w.stats.released == 1, what="held job released")
    gate.set()  # a running handler is never released (it would run twice): let "busy" finish
    t.join(30)
    assert w.stats.released == 1
    assert r.zrange(q.keys.group_pending("g1"), 0, -1) == [ref.id.encode()]
    assert q.groups.list() == ["g1"] and r.zrange(q.keys.pending, 0, -1) == []


def test_promote_many_sends_grouped_jobs_to_their_lanes(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    flat = q.enqueue_in("flat", 30)
    grouped = q.enqueue_in("grouped", 30, group="g1")
    wait_server_past(r, q.get(grouped.id).run_at_ms)
    assert emqfast.promote_many(r, [q]) == {qname: 2}
    assert r.zrange(q.keys.pending, 0, -1) == [flat.id.encode()]
    assert q.job_ids("pending") == [flat.id, grouped.id]  # the flat set, then the lanes
    assert r.zrange(q.keys.group_pending("g1"), 0, -1) == [grouped.id.encode()]
    assert q.groups.list() == ["g1"]


def test_retry_of_a_grouped_job_that_did_not_fail_writes_nothing(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("waiting", group="g1")
    r.zrem(q.keys.groups, "g1")  # so a stray ring join would show in the dump
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.errors.JobStateError):
        q.retry(ref.id)
    assert dump_queue(r, qname) == before


def test_a_batch_claim_of_flat_jobs_is_one_pop(redis_url, qname, r):
    """With no ready group the flat set is the last open source: one pop (a ZRANGE of
    the lowest ids and one ZREM of them) takes the whole batch (the hot path stays a
    single pop, not one per job)."""
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(60)))
    from emqfast.worker import calls as w

    def removals(n: int) -> int:
        """ZREM calls of a claim of ``n`` jobs (it must claim them all)."""
        before = r.info("commandstats").get("cmdstat_zrem", {}).get("calls", 0)
        call = w.claim_call(q.keys, n, 10_000, "w", [])
        _, _, _, pairs = w.parse_claim(call.script(q.redis, call.keys, call.args))
        assert len(pairs) == n
        return r.info("commandstats")["cmdstat_zrem"]["calls"] - before
    # as many removals for 25 jobs as for 30: none per job
    assert removals(25) == removals(30) <= 2
