"""The asyncio twin of tests/test_multi_queue.py: ``emqfast.aio.Worker([q1, q2, q3], h)``."""
from __future__ import annotations

import asyncio
import random
import uuid
from collections import Counter
from typing import Any, List

import emqfast.aio as emq
from waiting import wait_until_async


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def _queues(redis_url: str, n: int = 3) -> List[emq.Queue]:
    base = "mqa-" + uuid.uuid4().hex[:8]
    client = emq.connect(redis_url)
    return [emq.Queue(f"{base}-{i}", client) for i in range(n)]


def test_strict_order_and_burst_over_every_queue(redis_url):
    async def main():
        qs = _queues(redis_url)
        for i, q in enumerate(qs):
            await q.enqueue_many([{"q": i}] * 30)
        seen: List[int] = []

        async def handler(job):
            seen.append(job.payload["q"])
        w = emq.Worker(qs, handler, concurrency=1)
        stats = await w.run_until_idle(timeout_s=30)
        assert seen == [0] * 30 + [1] * 30 + [2] * 30
        assert stats.completed == 90
        assert [(await q.counts())["completed"] for q in qs] == [30, 30, 30]
        await qs[0].aclose()
    run(main())


def test_weighted_order(redis_url):
    async def main():
        qs = _queues(redis_url)
        for i, q in enumerate(qs):
            await q.enqueue_many([{"q": i}] * 200)
        seen: List[int] = []

        async def handler(job):
            seen.append(job.payload["q"])
        w = emq.Worker(qs, handler, order="weighted", weights=[1, 1, 2], concurrency=1,
                       prefetch=0)
        w.order.rng = random.Random(3)
        task = asyncio.ensure_future(w.run())

        async def enough():
            return len(seen) >= 240
        await wait_until_async(enough, 30, "240 jobs run")
        w.stop()
        await task
        share = Counter(seen[:240])
        for i, expected in enumerate((0.25, 0.25, 0.5)):
            assert abs(share[i] / 240 - expected) < 0.08, share
        await qs[0].aclose()
    run(main())


def test_idle_worker_wakes_for_any_queue_and_a_paused_queue_waits(redis_url):
    async def main():
        qs = _queues(redis_url)
        seen: List[int] = []

        async def handler(job):
            seen.append(job.payload["q"])
        w = emq.Worker(qs, handler)
        task = asyncio.ensure_future(w.run())
        await qs[1].pause()
        await asyncio.sleep(0.05)  # let the loops block on their markers
        await qs[2].enqueue({"q": 2})

        async def ran(want):
            return Counter(seen) == want
        await wait_until_async(lambda: ran({2: 1}), 5, "the low queue's job")
        await qs[1].enqueue({"q": 1})
        await qs[0].enqueue({"q": 0})
        await wait_until_async(lambda: ran({2: 1, 0: 1}), 5, "the high queue's job")
        assert (await qs[1].counts())["pending"] == 1  # paused: only that queue waits
        await qs[1].resume()
        await wait_until_async(lambda: ran({2: 1, 0: 1, 1: 1}), 5, "the resumed queue's job")
        w.stop()
        stats = await task
        assert stats.completed == 3
        assert {n: s.completed for n, s in w.stats_by_queue.items()} == \
            {q.name: 1 for q in qs}
        await qs[0].aclose()
    run(main())


def test_concurrency_is_one_budget_for_all_queues(redis_url):
    async def main():
        qs = _queues(redis_url)
        for i, q in enumerate(qs):
            await q.enqueue_many([{"q": i}] * 30)
        running, peak = [0], [0]

        async def handler(job):
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.002)
            running[0] -= 1
        w = emq.Worker(qs, handler, concurrency=3)
        assert (await w.run_until_idle(timeout_s=30)).completed == 90
        assert peak[0] == 3
        await qs[0].aclose()
    run(main())
