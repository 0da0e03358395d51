"""The asyncio Worker's plain (sync) handlers run in an executor of its own, sized to
``concurrency`` (one per many-queue Worker, shared like its slots): ``concurrency`` plain
handlers really run at once, and a job's timeout clock starts when its handler does, never
while it waits for a slot or a thread. Real redis-server, real threads."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List

import emqfast
import emqfast.aio as emq
from waiting import wait_until, wait_until_async


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 90))


class Peak:
    """How many handlers run at once (at most, so far), and on which threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0
        self.threads: Dict[int, threading.Thread] = {}

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.threads[threading.get_ident()] = threading.current_thread()

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


def _at_once(n: int, peak: Peak) -> Any:
    """A handler that returns only once ``n`` handlers wait at once (or fails after 20 s)."""
    barrier = threading.Barrier(n)

    def handler(job: Any) -> Any:
        peak.enter()
        try:
            barrier.wait(20)  # BrokenBarrierError: fewer than n ever ran at once
        finally:
            peak.leave()
        return job.payload
    return handler


def test_concurrency_plain_handlers_run_at_once(redis_url, qname):
    peak = Peak()

    async def main() -> Any:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(20)))
        w = emq.Worker(q, _at_once(20, peak), concurrency=20)
        stats = await w.run_until_idle(timeout_s=60)
        await q.aclose()
        return stats
    stats = run(main())
    assert (stats.completed, stats.failed) == (20, 0)
    assert peak.peak == 20 and len(peak.threads) == 20
    # the Worker's executor is shut down at the end of the run: its threads exit
    wait_until(lambda: not any(t.is_alive() for t in peak.threads.values()), 15,
               "the executor's threads to exit")


def test_a_many_queue_worker_shares_one_executor_of_its_concurrency(redis_url, qname):
    peak = Peak()
    pools: List[Any] = []

    async def main() -> Any:
        conn = emq.connect(redis_url)
        qs = [emq.Queue(f"{qname}-{i}", conn) for i in range(2)]
        for q in qs:
            await q.enqueue_many(list(range(3)))  # 6 jobs, 3 per queue: 2 rounds of 3
        w = emq.Worker(qs, _at_once(3, peak), concurrency=3)
        task = asyncio.ensure_future(w.run_until_idle(timeout_s=60))
        crew = w._led
        await wait_until_async(lambda: crew.pool is not None, 30, "the crew's executor")
        pools.append(crew.pool)
        await wait_until_async(lambda: all(m._pool is not None for m in crew.members), 30,
                               "every member running on the crew's executor")
        pools.extend(m._pool._real for m in crew.members)
        stats = await task
        await conn.aclose()
        return stats, crew
    stats, crew = run(main())
    assert (stats.completed, stats.failed) == (6, 0)
    assert peak.peak == 3  # three at once across both queues, never more
    assert all(p is pools[0] for p in pools) and pools[0]._max_workers == 3
    assert crew.pool is None  # shut down at the end of the run
    wait_until(lambda: not any(t.is_alive() for t in peak.threads.values()), 15,
               "the executor's threads to exit")


# Slots of the Workers whose jobs must be started ahead of a free slot: the prefetch starts
# about SLOTS * 2 ms of handler time ahead, so some even when handlers are timed slow
SLOTS = 8


async def _warm_up(q: Any, w: Any, began: List[str], n: int = 30) -> None:
    """Run ``n`` quick jobs first: the Worker times its handlers, and then starts jobs a
    little ahead of its free slots (its prefetch), so some wait for a slot."""
    await q.enqueue_many(["warm"] * n)
    await wait_until_async(lambda: began.count("warm") == n, 30, "the warm-up jobs to run")
    await wait_until_async(lambda: w.stats.completed == n, 30, "the warm-up jobs written")


def test_quick_jobs_behind_abandoned_handlers_wait_for_a_slot_and_run(redis_url, qname, r):
    """Two handlers ignore their timeout and are abandoned (their jobs fail JobTimeout):
    they keep both slots. Quick jobs with a short timeout wait for a slot, their clocks
    stopped; none fails without its handler running. Once a stuck thread returns, they run."""
    gate = threading.Event()
    began: List[str] = []

    def handler(job: Any) -> Any:
        began.append(job.payload)
        if job.payload == "stuck":
            gate.wait(60)  # ignores job.cancelled
            return "late"
        return job.payload

    async def main() -> Any:
        q = emq.Queue(qname, emq.connect(redis_url))
        w = emq.Worker(q, handler, concurrency=2, cancel_grace_ms=50)
        task = asyncio.ensure_future(w.run())
        try:
            await _warm_up(q, w, began)
            stuck = [await q.enqueue("stuck", timeout_ms=100, attempts=1) for _ in range(2)]

            async def abandoned() -> bool:
                return await _all_in(q, [s.id for s in stuck], ("failed",))
            await wait_until_async(abandoned, 30, "both stuck runs abandoned")
            quick = [await q.enqueue("quick", timeout_ms=100, attempts=1) for _ in range(4)]
            # what happens to them meanwhile: claimed (held, or started by the prefetch and
            # waiting for a slot), none run
            await wait_until_async(lambda: all(x.id in w._running or x.id in w._held
                                               for x in quick), 30, "the quick jobs claimed")
            waited_from = time.monotonic()
            await wait_until_async(lambda: time.monotonic() - waited_from > 0.5, 5,
                                   "five times the quick jobs' timeout")
            states = [(await q.get(x.id)).state for x in quick]
            assert "failed" not in states and "quick" not in began, states
            gate.set()

            await wait_until_async(lambda: _all_in(q, [x.id for x in quick], ("completed",)),
                                   30, "the quick jobs run")
            assert began.count("quick") == 4
            return [s.id for s in stuck]
        finally:
            gate.set()
            w.stop()
            await task
            await q.aclose()
    stuck_ids = run(main())
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    for job_id in stuck_ids:
        job = q.get(job_id)
        assert job.state == "failed" and job.error.startswith("JobTimeout"), job.error


async def _all_in(q: Any, ids: List[str], states: Any) -> bool:
    """Whether every job of ``ids`` is in one of ``states``."""
    return all([(await q.get(i)).state in states for i in ids])


def test_the_timeout_clock_starts_when_the_handler_does(redis_url, qname, r):
    """A job started while every slot is busy waits there longer than its timeout, then
    runs: its handler gets its whole timeout, counted from its own start."""
    gate = threading.Event()
    began: List[str] = []
    ran_for: List[float] = []

    def handler(job: Any) -> Any:
        began.append(job.payload)
        if job.payload == "busy":
            gate.wait(60)
            return "done"
        if job.payload == "timed":
            start = time.monotonic()
            while not job.cancelled and time.monotonic() - start < 30:
                time.sleep(0.001)
            ran_for.append(time.monotonic() - start)
            job.raise_if_cancelled()
        return job.payload

    async def main() -> Any:
        q = emq.Queue(qname, emq.connect(redis_url))
        w = emq.Worker(q, handler, concurrency=SLOTS)
        task = asyncio.ensure_future(w.run())
        try:
            await _warm_up(q, w, began)
            await q.enqueue_many(["busy"] * SLOTS)
            await wait_until_async(lambda: began.count("busy") == SLOTS, 30, "every slot busy")
            quick = await q.enqueue("quick", timeout_ms=200, attempts=1)
            timed = await q.enqueue("timed", timeout_ms=300, attempts=1)
            await wait_until_async(lambda: quick.id in w._running and timed.id in w._running,
                                   30, "both jobs started, waiting for a slot")
            waited_from = time.monotonic()
            await wait_until_async(lambda: time.monotonic() - waited_from > 0.6, 5,
                                   "twice the longest timeout")
            assert "quick" not in began and "timed" not in began
            gate.set()

            await wait_until_async(lambda: _all_in(q, [quick.id, timed.id],
                                                   ("completed", "failed")),
                                   30, "both jobs ended")
            return (await q.get(quick.id)), (await q.get(timed.id))
        finally:
            gate.set()
            w.stop()
            await task
            await q.aclose()
    quick, timed = run(main())
    assert quick.state == "completed" and quick.result == "quick"
    assert timed.state == "failed" and timed.error.startswith("JobTimeout"), timed.error
    assert len(ran_for) == 1 and 0.29 <= ran_for[0] < 5, ran_for  # from its own start


def test_a_cancel_ends_a_job_waiting_for_a_slot_at_once_unrun(redis_url, qname, r):
    """A job started behind busy handlers, cancelled while it waits for a slot, ends
    ``cancelled`` at once (not after the grace), and its handler is never called."""
    gate = threading.Event()
    began: List[str] = []

    def handler(job: Any) -> Any:
        began.append(job.payload)
        if job.payload == "busy":
            gate.wait(60)
        return job.payload

    async def main() -> Any:
        q = emq.Queue(qname, emq.connect(redis_url))
        w = emq.Worker(q, handler, concurrency=SLOTS, cancel_grace_ms=60_000)
        task = asyncio.ensure_future(w.run())
        try:
            await _warm_up(q, w, began)
            await q.enqueue_many(["busy"] * SLOTS)
            await wait_until_async(lambda: began.count("busy") == SLOTS, 30, "every slot busy")
            waiting = await q.enqueue("waiting")
            await wait_until_async(lambda: waiting.id in w._running, 30,
                                   "the job started, waiting for a slot")
            assert await q.cancel(waiting.id) == "requested"
            await wait_until_async(lambda: _all_in(q, [waiting.id], ("cancelled",)), 10,
                                   "the job cancelled within the grace")
            gate.set()
            await wait_until_async(lambda: w.stats.completed == 30 + SLOTS, 30,
                                   "the busy jobs end")
            return waiting.id
        finally:
            gate.set()
            w.stop()
            await task
            await q.aclose()
    job_id = run(main())
    assert "waiting" not in began
    assert emqfast.Queue(qname, emqfast.connect(redis_url)).get(job_id).attempts == 1
