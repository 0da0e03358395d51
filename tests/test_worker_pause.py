"""A paused queue starts no held job: jobs a worker claimed beyond its
running ones are held unstarted (start.lua runs only into a free handler slot, and a
pause fences it), and go back to the queue instead of running after ``pause()``."""
from __future__ import annotations

import asyncio
import threading
from typing import List

import emqfast
import emqfast.aio as emq
from engine_util import make_queue, running_worker
from waiting import wait_until, wait_until_async


def _held_worker(q, runs, began, gate):
    def handler(job):
        runs.append(job.id)
        began.set()
        gate.wait(30)
    # one handler thread, ten jobs held for it; a short lease: the beat runs every 0.25 s
    return emqfast.Worker(q, handler, concurrency=1, prefetch=10, lease_ms=1000,
                          shutdown_timeout_s=5)


def test_thread_worker_holds_prefetched_jobs_unstarted_and_hands_them_back_on_pause(
        redis_url, qname, r):
    q = make_queue(redis_url, qname)
    refs = q.enqueue_many(list(range(11)))
    gate, began = threading.Event(), threading.Event()
    runs: List[str] = []
    w = _held_worker(q, runs, began, gate)
    with running_worker(w):
        wait_until(lambda: r.zcard(q.keys.active) == 11 and began.is_set(),
                   what="1 running, 10 held (claimed, leased)")
        # held jobs are leased but not started: no attempt counted; like the running one
        # they read 'active', as counts() counts them
        jobs = [q.get(ref.id) for ref in refs]
        assert sum(job.attempts == 1 for job in jobs) == 1
        assert all(job.state == "active" for job in jobs)
        q.pause()
        # the claim loop has no free slot (it claims nothing): its beat sees the pause
        wait_until(lambda: r.zcard(q.keys.pending) == 10, what="the 10 held jobs back")
        assert len(runs) == 1
        gate.set()
        wait_until(lambda: q.counts()["completed"] == 1, what="the running job finishes")
        assert len(runs) == 1  # none of the held jobs ran while paused
        q.resume()
        wait_until(lambda: q.counts()["completed"] == 11, what="all done after resume")
    assert sorted(runs) == sorted(ref.id for ref in refs)
    assert all(q.get(ref.id).attempts == 1 for ref in refs)  # a held job lost no attempt


def test_a_slot_freed_right_after_pause_starts_no_held_job(redis_url, qname, r):
    """The held jobs' start is fenced by the pause: a handler slot that frees the instant
    pause() returned (before any beat could notice the pause) begins nothing."""
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(11)))
    gate, began = threading.Event(), threading.Event()
    runs: List[str] = []
    w = _held_worker(q, runs, began, gate)
    with running_worker(w):
        wait_until(lambda: r.zcard(q.keys.active) == 11 and began.is_set(),
                   what="1 running, 10 held")
        q.pause()
        gate.set()  # the running handler returns at once: its slot is free
        wait_until(lambda: q.counts()["completed"] == 1 and r.zcard(q.keys.active) == 0,
                   what="the running job done, the held ones handed back")
        assert len(runs) == 1
        q.resume()
        wait_until(lambda: q.counts()["completed"] == 11, what="all done after resume")
    assert len(runs) == 11


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


def test_aio_worker_holds_prefetched_jobs_unstarted_and_starts_none_after_pause(
        redis_url, qname, r):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(11)))
        gate = asyncio.Event()
        runs: List[str] = []

        async def handler(job):
            runs.append(job.id)
            await gate.wait()

        w = emq.Worker(q, handler, concurrency=1, prefetch=10, lease_ms=1000,
                       shutdown_timeout_s=5)
        task = asyncio.create_task(w.run())
        await wait_until_async(lambda: r.zcard(q.keys.active) == 11 and len(runs) == 1,
                               what="1 running, 10 held (claimed, leased)")
        assert len(w._held) == 10  # claimed, not started
        await q.pause()
        gate.set()  # the slot frees right after pause(): its next start is fenced
        await wait_until_async(lambda: r.zcard(q.keys.active) == 0,
                               what="the running job done, the held ones handed back")
        assert len(runs) == 1
        await q.resume()
        await wait_until_async(lambda: w.stats.completed == 11, what="all done after resume")
        w.stop()
        await task
        await q.aclose()
        return runs
    runs = asyncio.run(asyncio.wait_for(main(), 60))
    assert len(set(runs)) == 11
