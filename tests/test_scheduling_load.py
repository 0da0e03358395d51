"""Scheduling promises under load: due jobs run on time behind a backlog, the
flat pending set takes turns with group lanes, idle workers do not spin on rate-limited
groups, a freed cap slot wakes a worker, a new group is found past many capped groups,
priority holds within a lane (lanes take turns), and job_ids agrees with counts.

Assertions are on ordering and on counts of calls, never on elapsed time (figures go to
bench/scheduling.py)."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import List, Tuple

import pytest

import emqfast
import emqfast.aio as emq
from emqfast.facade.options import Backoff
from engine_util import make_queue, running_worker
from waiting import wait_until

BACKLOG = 6000
DELAY_MS = 800  # longer than enqueueing the backlog takes, shorter than draining it
# Runs that may start after a job became due and before it runs: the jobs a worker already
# holds plus one claim's batch (it is promoted by the claim that saw it due).
CONCURRENCY, PREFETCH, BATCH = 4, 8, 16
DUE_SLACK = 3 * (CONCURRENCY + PREFETCH + BATCH)


class RunLog:
    """Every handler start, in order: (job id, local monotonic s)."""

    def __init__(self) -> None:
        self.runs: List[Tuple[str, float]] = []
        self.lock = threading.Lock()

    def note(self, job_id: str) -> None:
        with self.lock:
            self.runs.append((job_id, time.monotonic()))

    def started_after(self, instant: float, before_id: str) -> int:
        """How many runs started after ``instant`` and before ``before_id``'s (last) start."""
        last = max(i for i, (jid, _) in enumerate(self.runs) if jid == before_id)
        return sum(1 for jid, t in self.runs[:last] if t >= instant)

    def position(self, job_id: str) -> int:
        return max(i for i, (jid, _) in enumerate(self.runs) if jid == job_id)


# --- due jobs do not wait behind a backlog ------------------------------------------------

# The delayed job is enqueued first: promoted, it keeps its arrival place at the head of
# priority 0. Its delay must outlast enqueueing the backlog (else it is due before any job
# runs and proves nothing); on a loaded host that can take longer than DELAY_MS, so the
# set-up starts over with a longer delay (the drain still outlasts it several times).
_DELAYS_MS = (DELAY_MS, 2 * DELAY_MS, 4 * DELAY_MS)


def _delayed_then_backlog(q) -> Tuple[str, float]:
    for delay_ms in _DELAYS_MS:
        delayed = q.enqueue("late", delay_ms=delay_ms).id
        due_at = time.monotonic() + delay_ms / 1000
        q.enqueue_many(["x"] * BACKLOG)
        if time.monotonic() < due_at - 0.2:
            return delayed, due_at
        q.obliterate()
    pytest.fail("enqueueing the backlog outlasted every delay tried")


async def _delayed_then_backlog_async(q) -> Tuple[str, float]:
    for delay_ms in _DELAYS_MS:
        delayed = (await q.enqueue("late", delay_ms=delay_ms)).id
        due_at = time.monotonic() + delay_ms / 1000
        await q.enqueue_many(["x"] * BACKLOG)
        if time.monotonic() < due_at - 0.2:
            return delayed, due_at
        await q.obliterate()
    pytest.fail("enqueueing the backlog outlasted every delay tried")


def test_due_delayed_job_runs_long_before_the_backlog_drains(redis_url, qname):
    q = make_queue(redis_url, qname)
    delayed, due_at = _delayed_then_backlog(q)
    log = RunLog()

    def handler(job):
        log.note(job.id)
        time.sleep(0.001)  # 6,000 jobs at 4 threads: the backlog outlasts the delay
    w = emqfast.Worker(q, handler, concurrency=CONCURRENCY, prefetch=PREFETCH,
                       batch_size=BATCH)
    w.run_until_idle(timeout_s=120)
    assert len(log.runs) == BACKLOG + 1
    assert log.runs[0][1] < due_at  # it fell due while the backlog was draining
    late = log.started_after(due_at, delayed)
    assert late <= DUE_SLACK, (late, log.position(delayed))
    assert log.position(delayed) < BACKLOG // 2


def test_due_retry_runs_long_before_the_backlog_drains(redis_url, qname):
    q = make_queue(redis_url, qname)
    flaky = q.enqueue("flaky", attempts=2, backoff=Backoff.fixed(100)).id
    q.enqueue_many(["x"] * BACKLOG)
    log = RunLog()
    failed_at: List[float] = []

    def handler(job):
        log.note(job.id)
        if job.id == flaky and job.attempts == 1:
            failed_at.append(time.monotonic())
            raise RuntimeError("first attempt fails")
        time.sleep(0.0005)
    w = emqfast.Worker(q, handler, concurrency=CONCURRENCY, prefetch=PREFETCH,
                       batch_size=BATCH)
    w.run_until_idle(timeout_s=120)
    assert w.stats.retried == 1 and len(log.runs) == BACKLOG + 2
    late = log.started_after(failed_at[0] + 0.1, flaky)
    assert late <= DUE_SLACK, (late, log.position(flaky))
    assert log.position(flaky) < BACKLOG // 2


def test_due_delayed_job_behind_a_backlog_aio_worker(redis_url, qname):
    log = RunLog()

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        delayed, due_at = await _delayed_then_backlog_async(q)

        async def handler(job):
            log.note(job.id)
            await asyncio.sleep(0.001)
        await emq.Worker(q, handler, concurrency=CONCURRENCY,
                         batch_size=BATCH).run_until_idle(timeout_s=120)
        return delayed, due_at
    delayed, due_at = asyncio.run(asyncio.wait_for(main(), 150))
    assert len(log.runs) == BACKLOG + 1
    assert log.runs[0][1] < due_at  # it fell due while the backlog was draining
    late = log.started_after(due_at, delayed)
    assert late <= DUE_SLACK, (late, log.position(delayed))
    assert log.position(delayed) < BACKLOG // 2


# --- the flat pending set takes turns with group lanes -------------------------------------

def _first_grouped_run(order: List[str]) -> int:
    return next(i for i, g in enumerate(order) if g is not None)


def test_ungrouped_backlog_does_not_starve_group_lanes(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.enqueue_many(["flat"] * 200)
    for g in ("a", "b", "c"):
        q.enqueue_many([g] * 20, group=g)
    order: List[str] = []
    emqfast.Worker(q, lambda job: order.append(job.extra.get("g")),
                   concurrency=1, prefetch=0).run_until_idle(timeout_s=60)  # one per claim
    assert len(order) == 260
    assert _first_grouped_run(order) <= 4, order[:10]
    # the flat set is one more lane: while every lane has jobs, no lane runs twice in a row
    # more than its turn allows (four lanes: each appears in every window of 8 runs)
    window = order[_first_grouped_run(order):][:60]
    for lane in (None, "a", "b", "c"):
        assert all(lane in window[i:i + 8] for i in range(0, 40)), (lane, window)


def test_ungrouped_backlog_does_not_starve_group_lanes_aio_worker(redis_url, qname):
    order: List[str] = []

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(["flat"] * 200)
        for g in ("a", "b", "c"):
            await q.enqueue_many([g] * 20, group=g)

        async def handler(job):
            order.append(job.extra.get("g"))
        await emq.Worker(q, handler, concurrency=1).run_until_idle(timeout_s=60)
    asyncio.run(asyncio.wait_for(main(), 90))
    assert len(order) == 260
    assert _first_grouped_run(order) <= 4, order[:10]


# --- idle workers sleep while every group's window is full ----------------------------------

def test_idle_worker_does_not_spin_on_many_full_group_windows(redis_url, qname, monkeypatch):
    from emqfast.worker import calls as worker_core
    q = make_queue(redis_url, qname)
    groups = [f"rl{i}" for i in range(40)]
    for g in groups:
        q.groups.set_rate_limit(g, 1, 60_000)  # one job a minute: the second waits
        q.enqueue_many([g, g], group=g)
    claims = []
    real = worker_core.claim_call
    monkeypatch.setattr(worker_core, "claim_call",
                        lambda *a, **kw: claims.append(1) or real(*a, **kw))
    w = emqfast.Worker(q, lambda job: None, concurrency=4)
    with running_worker(w):
        wait_until(lambda: q.counts()["completed"] == 40, timeout=30, what="one job per group")
        # every window is full for a minute now: an idle worker sleeps on the marker
        wait_until(lambda: w._waiter is not None, what="the worker waits")
        before = len(claims)
        time.sleep(0.5)  # a bounded observation period: count the claims made in it
        made = len(claims) - before
    assert made <= 5, made  # a spinning worker made ~1,500 in this half second
    assert q.counts()["pending"] == 40


# --- a freed slot of a capped group wakes a worker ----------------------------------------

def test_capped_group_runs_at_its_cap_woken_by_freed_slots(redis_url, qname, monkeypatch):
    from emqfast.worker import wake
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("one", 1)
    jobs = 40
    q.enqueue_many(list(range(jobs)), group="one")
    waits = {"timed_out": 0, "woken": 0}
    real = wake.MarkerWaiter.wait

    def counted(self, key, timeout_s):
        got = real(self, key, timeout_s)
        waits["timed_out" if got is None else "woken"] += 1
        return got
    monkeypatch.setattr(wake.MarkerWaiter, "wait", counted)

    def handler(job):
        time.sleep(0.002)
    w = emqfast.Worker(q, handler, concurrency=4)
    with running_worker(w):
        wait_until(lambda: q.counts()["completed"] == jobs, timeout=60, what="all jobs")
    # each freed slot ended the wait at once; before, every job waited out a 50 ms re-check
    assert waits["timed_out"] <= 3, waits



# --- a new group is found past any number of capped groups ---------------------------------

def _raw_claim(q: emqfast.Queue, worker: str, groups: List[str], n: int = 1000):
    """One claim.lua call as a Worker makes it: (pairs, the ready groups it names next)."""
    from emqfast.worker import calls as worker_core
    call = worker_core.claim_call(q.keys, n, 60_000, worker, groups)
    reply = call.script(q.redis, call.keys, call.args)
    return worker_core.parse_claim(reply)[3], worker_core.claim_groups(reply)


def test_new_group_is_found_past_a_thousand_capped_groups(redis_url, qname):
    q = make_queue(redis_url, qname)
    capped = [f"c{i}" for i in range(1000)]
    for g in capped:
        q.groups.set_concurrency(g, 1)
        q.enqueue_many([g, g], group=g)
    # a worker that never finishes holds every capped group's one slot
    held, names = 0, []
    for _ in range(200):
        pairs, names = _raw_claim(q, "holder", names)
        held += len(pairs)
        if held == len(capped) and not names:
            break
    assert held == len(capped)
    q.enqueue("new", group="fresh")
    names, claims = [], 0
    while claims < 100:
        claims += 1
        pairs, names = _raw_claim(q, "other", names)
        if pairs:
            break
    assert [q.get(i).extra["g"] for i, _ in pairs] == ["fresh"]
    assert claims <= 3, claims  # before: a full turn of the ring, 16 capped groups a claim
    assert q.counts()["pending"] == len(capped)  # parked lanes still count as pending


# --- priority orders jobs within a lane; lanes take turns ----------------------------------

def test_priority_holds_within_a_lane_and_lanes_take_turns(redis_url, qname):
    q = make_queue(redis_url, qname)
    for g in ("A", "C"):
        q.enqueue_many([f"{g}9"] * 3, group=g, priority=9)
    q.enqueue("B0", group="B", priority=0)
    q.enqueue("A1", group="A", priority=1)  # enqueued last, runs first in lane A
    order: List[str] = []
    emqfast.Worker(q, lambda job: order.append(job.payload), concurrency=1,
                   prefetch=0).run_until_idle(timeout_s=30)
    assert order.index("A1") < order.index("A9")  # priority within a lane
    # across lanes, priority does not jump the turn order: B's priority-0 job waits its
    # turn (at most one job of each other lane first), it does not run before all of them
    assert order.index("B0") <= 2, order
    assert order[:3] != ["B0", "B0", "B0"]
    assert sorted(order) == sorted(["A9"] * 3 + ["C9"] * 3 + ["B0", "A1"])


# --- job_ids("pending") agrees with counts()["pending"] ------------------------------------

def test_pending_job_ids_include_grouped_jobs(redis_url, qname):
    q = make_queue(redis_url, qname)
    flat = [r.id for r in q.enqueue_many(["f"] * 3)]
    a = [r.id for r in q.enqueue_many(["a"] * 2, group="a")]
    b = [r.id for r in q.enqueue_many(["b"] * 4, group="b")]
    ids = q.job_ids("pending")
    assert len(ids) == q.counts()["pending"] == 9
    assert set(ids) == set(flat + a + b)
    assert ids[:3] == flat  # the flat set first, then each lane in ring order
    assert ids[3:5] == a and ids[5:] == b
    assert q.job_ids("pending", 2, 4) == ids[2:5]
    assert q.job_ids("pending", -2, -1) == ids[-2:]
    assert q.job_ids("pending", 5, 100) == ids[5:]
    assert q.job_ids("pending", 7, 3) == []


# --- a capped group's active count is kept by the finishing jobs --------------------------

def test_finished_jobs_leave_their_capped_groups_active_count(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("g", 3)
    q.enqueue_many(list(range(20)), group="g")
    emqfast.Worker(q, lambda job: None, concurrency=4).run_until_idle(timeout_s=30)
    assert q.counts()["completed"] == 20
    # no claim had to re-read leases to find the slots free: group_free removed each member
    assert r.zcard(q.keys.gactive) == 0


# --- a job claimed before pause() is not started after it ----------------------------------

def test_start_after_pause_hands_claimed_jobs_back(redis_url, qname):
    from emqfast.worker import calls as worker_core
    q = make_queue(redis_url, qname)
    ids = [r.id for r in q.enqueue_many(["a", "b", "c"])]
    call = worker_core.claim_call(q.keys, 3, 60_000, "w", [], "r1")
    pairs = worker_core.parse_claim(call.script(q.redis, call.keys, call.args))[3]
    assert sorted(i for i, _ in pairs) == sorted(ids)
    q.pause()
    start = worker_core.start_call(q.keys, pairs)
    rows = worker_core.start_rows(start.script(q.redis, start.keys, start.args))
    assert rows == [0, 0, 0]  # nothing starts on a paused queue: the Worker runs none
    assert q.counts()["active"] == 0
    assert all(q.get(i).attempts == 0 for i in ids)  # no attempt counted
    q.resume()
    ran: List[str] = []
    emqfast.Worker(q, lambda job: ran.append(job.id)).run_until_idle(timeout_s=30,
                                                                     wait_scheduled=True)
    assert sorted(ran) == sorted(ids)
    assert all(q.get(i).attempts == 1 for i in ids)
