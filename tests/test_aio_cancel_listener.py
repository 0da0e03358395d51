"""The asyncio Worker's cancel listener always stops when asked.

redis.asyncio can swallow a cancel that lands just as a pub/sub read's own timeout fires,
and then read on with no timeout. In CI that left a Worker's listener alive after
``run_until_idle`` returned, and ``asyncio.run``'s teardown waited on it forever. Here the
listener's read timeout is shrunk to 1 ms so that race comes up within a few hundred
stops (before the fix: about 3 in 100 hung), whether stopped by the Worker's ``close`` or
by a bare cancel as a loop's teardown sends.
"""
from __future__ import annotations

import asyncio
import random
import uuid

import pytest
import redis.asyncio as aredis

import emqfast.aio as emq
from emqfast.aio import cancel_listener

STOPS = 300


@pytest.fixture
def tight_poll(monkeypatch):
    monkeypatch.setattr(cancel_listener, "_POLL_S", 0.001)


def _listener(client: aredis.Redis, heard: list) -> cancel_listener.AioCancelListener:
    async def subscribed() -> None:
        pass
    return cancel_listener.AioCancelListener(client, {"emq-test-cancels": heard.append},
                                             subscribed, "test")


def test_close_ends_the_listener_at_any_moment(redis_url, tight_poll):
    async def main():
        client = aredis.Redis.from_url(redis_url)
        rng, heard = random.Random(7), []
        try:
            for _ in range(STOPS):
                listener = _listener(client, heard)
                listener.start()
                task = listener._task
                await asyncio.sleep(rng.uniform(0.0, 0.01))
                await asyncio.wait_for(listener.close(), 5)
                assert task is not None and task.done()
        finally:
            await client.aclose()
    asyncio.run(asyncio.wait_for(main(), 120))


def test_one_cancel_ends_the_listener_at_any_moment(redis_url, tight_poll):
    """What ``asyncio.run`` does to tasks left at its end: one cancel each."""
    async def main():
        client = aredis.Redis.from_url(redis_url)
        rng, heard, hung = random.Random(11), [], 0
        try:
            for _ in range(STOPS):
                listener = _listener(client, heard)
                listener.start()
                task = listener._task
                assert task is not None
                await asyncio.sleep(rng.uniform(0.0, 0.01))
                task.cancel()
                done, _ = await asyncio.wait([task], timeout=2.0)
                if not done:
                    hung += 1
                    await listener.close()  # (so the run can go on)
            assert hung == 0
        finally:
            await client.aclose()
    asyncio.run(asyncio.wait_for(main(), 300))


def test_a_listener_still_hears_cancels_between_stops(redis_url):
    """The flag that stops it does not stop a fresh one: a message published is heard."""
    async def main():
        client = aredis.Redis.from_url(redis_url)
        heard: list = []
        try:
            for _ in range(3):
                listener = _listener(client, heard)
                listener.start()
                await asyncio.wait_for(listener.subscribed.wait(), 5)
                before = len(heard)
                await client.publish("emq-test-cancels", "job-1")
                for _ in range(500):
                    if len(heard) > before:
                        break
                    await asyncio.sleep(0.01)
                assert heard[before:] == ["job-1"]
                await listener.close()
        finally:
            await client.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_worker_run_leaves_no_task_behind(redis_url):
    """After ``run_until_idle`` the Worker's own tasks have ended: nothing for the loop's
    teardown to wait on."""
    async def main():
        q = emq.Queue("cl-" + uuid.uuid4().hex[:8], emq.connect(redis_url))
        await q.enqueue_many([{"n": i} for i in range(20)])
        before = asyncio.all_tasks()

        async def handler(job):
            pass
        stats = await emq.Worker(q, handler, concurrency=2).run_until_idle(timeout_s=30)
        assert stats.completed == 20
        left = [t for t in asyncio.all_tasks() - before if not t.done()]
        assert [t.get_coro() for t in left] == []
        await q.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))
