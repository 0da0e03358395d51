"""The asyncio Worker's plain (sync) handlers run in an executor of its own, sized to
``concurrency`` (one per many-queue Worker, shared like its slots): ``concurrency`` plain
handlers really run at once. Real redis-server, real threads."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, List

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
