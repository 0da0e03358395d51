"""A paused queue starts no held job (issue 18 item 8): jobs a worker claimed and started
but no handler has begun go back (release.lua) instead of running after ``pause()``."""
from __future__ import annotations

import asyncio
import threading
from typing import List

import emqfast
import emqfast.aio as emq
from engine_util import make_queue, running_worker
from waiting import wait_until, wait_until_async


def test_thread_worker_releases_prefetched_jobs_when_the_queue_is_paused(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    refs = q.enqueue_many(list(range(11)))
    gate, began = threading.Event(), threading.Event()
    runs: List[str] = []

    def handler(job):
        runs.append(job.id)
        began.set()
        gate.wait(30)

    # one handler thread, ten jobs held for it; a short lease: the beat runs every 0.25 s
    w = emqfast.Worker(q, handler, concurrency=1, prefetch=10, lease_ms=1000,
                       shutdown_timeout_s=5)
    with running_worker(w):
        wait_until(lambda: w.stats.claimed == 11 and began.is_set(), what="1 running, 10 held")
        q.pause()
        # the claim loop has no free slot (it claims nothing): its beat sees the pause
        wait_until(lambda: w.stats.released == 10, what="the 10 held jobs released")
        assert r.zcard(q.keys.pending) == 10 and len(runs) == 1
        gate.set()
        wait_until(lambda: q.counts()["completed"] == 1, what="the running job finishes")
        assert len(runs) == 1  # none of the held jobs ran while paused
        q.resume()
        wait_until(lambda: q.counts()["completed"] == 11, what="all done after resume")
    assert sorted(runs) == sorted(ref.id for ref in refs)
    assert all(q.get(ref.id).attempts == 1 for ref in refs)  # a released job lost no attempt


def test_aio_worker_starts_nothing_after_pause(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(6)))
        gate = asyncio.Event()
        runs: List[str] = []

        async def handler(job):
            runs.append(job.id)
            await gate.wait()

        w = emq.Worker(q, handler, concurrency=2, lease_ms=1000, shutdown_timeout_s=5)
        task = asyncio.create_task(w.run())
        await wait_until_async(lambda: len(runs) == 2, what="two handlers running")
        assert w._take_held() == []  # a task per job at once: nothing is ever held back
        await q.pause()
        seq = w._claim_seq
        gate.set()
        # the worker has claimed again since (slots freed) and been told the queue is paused
        await wait_until_async(lambda: w._claim_seq > seq + 1 and w.stats.completed == 2,
                               what="claims after the pause")
        assert len(runs) == 2 and (await q.counts())["pending"] == 4
        await q.resume()
        await wait_until_async(lambda: w.stats.completed == 6, what="all done after resume")
        w.stop()
        await task
        await q.aclose()
        return runs
    runs = asyncio.run(asyncio.wait_for(main(), 60))
    assert len(set(runs)) == 6
