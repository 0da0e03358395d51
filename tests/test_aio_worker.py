"""emqfast.aio.Worker: coroutine handlers, concurrency, background leases, shutdown."""
from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading

import pytest
import redis

import emqfast
import emqfast.aio as emq
from emqfast import Backoff
from emqfast.core.errors import LeaseLost
from engine_util import server_ms
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _queue(redis_url, qname, **opts):
    return emq.Queue(qname, emq.connect(redis_url), **opts)


class _Barrier:
    """Passes its waiters ``n`` at a time (asyncio.Barrier is Python 3.11+)."""

    def __init__(self, n):
        self.n, self.waiting, self.round = n, 0, asyncio.Event()

    async def wait(self):
        passed = self.round
        self.waiting += 1
        if self.waiting == self.n:
            self.waiting, self.round = 0, asyncio.Event()
            passed.set()
        await passed.wait()


def test_coroutine_handlers_overlap_up_to_concurrency(redis_url, qname):
    async def main():
        q = await _queue(redis_url, qname)
        await q.enqueue_many(list(range(9)))
        barrier = _Barrier(3)  # passes only when 3 handlers wait at once
        current = peak = 0

        async def handler(job):
            nonlocal current, peak
            current += 1
            peak = max(peak, current)
            try:
                await asyncio.wait_for(barrier.wait(), 10)
            finally:
                current -= 1
            return job.payload

        stats = await emq.Worker(q, handler, concurrency=3).run_until_idle(timeout_s=30)
        await q.aclose()
        return stats, peak
    stats, peak = run(main())
    assert (stats.completed, stats.failed) == (9, 0)
    assert peak == 3  # they truly overlap, and never more than concurrency


def test_lease_is_extended_in_the_background(redis_url, qname, r):
    async def main():
        q = await _queue(redis_url, qname)
        ref = await q.enqueue("long")
        runs = []
        reaped = []
        done = asyncio.Event()

        async def handler(job):
            runs.append(job.id)
            # run for 4 leases' worth, while a reaper keeps looking for expired leases
            end = asyncio.get_running_loop().time() + 1.2
            while asyncio.get_running_loop().time() < end:
                reaped.append(await q.reap())
                await asyncio.sleep(0.05)
            done.set()
            return "ok"

        worker = emq.Worker(q, handler, lease_ms=300)
        stats = await worker.run_until_idle(timeout_s=30)
        job = await q.get(ref.id)
        await q.aclose()
        return stats, runs, reaped, job
    stats, runs, reaped, job = run(main())
    assert len(runs) == 1 and stats.completed == 1 and stats.lease_lost == 0
    assert reaped and all(x == (0, 0) for x in reaped)
    assert (job.state, job.result, job.stalls, job.attempts) == ("completed", "ok", 0, 1)


def test_retry_with_backoff_on_coroutine_exception(redis_url, qname):
    async def main():
        q = await _queue(redis_url, qname)
        ref = await q.enqueue("x", attempts=3, backoff=Backoff.fixed(80))
        seen = []

        async def handler(job):
            seen.append((job.attempts, await q.server_time_ms()))
            if job.attempts == 1:
                raise ValueError("first try fails")
            return job.attempts

        stats = await emq.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
        job = await q.get(ref.id)
        await q.aclose()
        return stats, seen, job
    stats, seen, job = run(main())
    assert [a for a, _ in seen] == [1, 2]
    assert seen[1][1] - seen[0][1] >= 80  # waited the backoff, on the server clock
    assert (stats.retried, stats.completed, stats.failed) == (1, 1, 0)
    assert (job.state, job.result) == ("completed", 2)
    assert job.error is None and job.traceback is None  # a completed run clears the last error


def test_extend_lease_async_from_a_coroutine_handler(redis_url, qname, r):
    async def main():
        q = await _queue(redis_url, qname)
        ref = await q.enqueue("x")
        seen = {}

        async def handler(job):
            await job.extend_lease_async(600_000)
            seen["deadline"] = r.zscore(q.keys.active, job.id)
            seen["now"] = server_ms(r)
            with pytest.raises(RuntimeError):
                job.extend_lease(1000)  # the blocking form would deadlock the loop
            r.hset(q.keys.leases, job.id, "someone-else:1")  # the lease is taken away
            with pytest.raises(LeaseLost):
                await job.extend_lease_async(1000)
            seen["lost"] = True

        stats = await emq.Worker(q, handler, lease_ms=5_000).run_until_idle(timeout_s=30)
        await q.aclose()
        return stats, seen, ref
    stats, seen, ref = run(main())
    assert seen["deadline"] >= seen["now"] + 590_000
    assert seen["lost"] and stats.lease_lost == 1 and stats.completed == 0


def test_plain_handlers_run_in_the_executor(redis_url, qname):
    async def main():
        q = await _queue(redis_url, qname)
        await q.enqueue_many([1, 2, 3])
        threads = set()

        def handler(job):  # blocking code stays off the event loop
            threads.add(threading.current_thread().name)
            job.extend_lease(10_000)  # the blocking form works from the executor
            return job.payload + 1

        stats = await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        await q.aclose()
        return stats, threads
    stats, threads = run(main())
    assert stats.completed == 3
    assert threading.main_thread().name not in threads


@pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="redis-py 7 (the last for Python 3.9) makes asyncio locks when a client is built; "
           "on 3.9 that needs a current event loop")
def test_facades_do_not_mix(redis_url, qname):
    with pytest.raises(TypeError):
        emq.Worker(emqfast.Queue(qname, redis.Redis.from_url(redis_url)), lambda j: None)
    with pytest.raises(TypeError):
        emqfast.Worker(emq.Queue(qname, emq.connect(redis_url)), lambda j: None)
    with pytest.raises(emqfast.InvalidInput):
        emq.Queue(qname, redis.Redis.from_url(redis_url))


_WORKER = textwrap.dedent("""
    import asyncio, sys
    import emqfast.aio as emq

    async def handler(job):
        await asyncio.sleep(float(sys.argv[3]))
        return "done"

    async def main():
        q = emq.Queue(sys.argv[2], emq.connect(sys.argv[1]))
        w = emq.Worker(q, handler, concurrency=2, shutdown_timeout_s=float(sys.argv[4]),
                       name="aio-sigterm")
        stats = await w.run()
        print("stats", stats.completed, stats.released, flush=True)

    asyncio.run(main())
""")


@pytest.mark.parametrize("handler_s,timeout_s,finished", [(0.5, 20.0, True), (60.0, 0.3, False)],
                         ids=["finish-in-time", "release-after-timeout"])
def test_sigterm_mid_job_finishes_or_releases(r, redis_url, qname, tmp_path,
                                              handler_s, timeout_s, finished):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    refs = q.enqueue_many(list(range(5)))
    script = tmp_path / "aio_worker.py"
    script.write_text(_WORKER)
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen([sys.executable, str(script), redis_url, qname, str(handler_s),
                             str(timeout_s)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: q.counts()["active"] == 2, timeout=30, what="two jobs in flight")
        in_flight = set(q.job_ids("active"))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    counts = q.counts()
    assert counts["active"] == 0 and counts["failed"] == 0
    states = {ref.id: q.get(ref.id).state for ref in refs}
    assert set(states.values()) <= {"completed", "pending"}  # none lost
    done = {i for i, s in states.items() if s == "completed"}
    if finished:
        assert in_flight <= done  # the in-flight jobs finished during the grace period
        assert f"stats {len(done)} 0" in out
    else:
        assert not done and counts["pending"] == 5  # released, ready for another worker
        assert "stats 0 2" in out


def test_marker_wait_ends_on_our_deadline_and_loses_no_wakeup(redis_url, qname, r):
    from emqfast.aio.wake import MarkerWaiter
    key = f"emq:{{{qname}}}:marker"

    async def main():
        client = emq.connect(redis_url)
        waiter = MarkerWaiter(client)
        loop = asyncio.get_running_loop()
        try:
            overshoot = []
            for _ in range(7):
                start = loop.time()
                assert await waiter.wait(key, 0.010) is None
                overshoot.append(loop.time() - start - 0.010)
            # new work wakes it at once
            loop.call_later(0.05, lambda: r.zadd(key, {"0": 0}))
            start = loop.time()
            popped = await waiter.wait(key, 5.0)
            woke = loop.time() - start
            # a wait ended early never swallows a member added right after
            assert await waiter.wait(key, 0.005) is None
            r.zadd(key, {"1": 123})
            late = await waiter.wait(key, 1.0)
        finally:
            await waiter.close()
            await client.aclose()
        return overshoot, popped, woke, late
    overshoot, popped, woke, late = run(main())
    assert statistics.median(overshoot) < 0.025, overshoot  # not Redis' 100 ms hz tick
    assert popped == (b"0", 0.0) and woke < 2.0
    assert late == (b"1", 123.0) and r.zcard(key) == 0


def test_idle_aio_worker_starts_a_delayed_job_on_time(redis_url, qname, r):
    async def main():
        q = await _queue(redis_url, qname)
        lateness = []
        ran = asyncio.Event()

        async def handler(job):
            lateness.append(await q.server_time_ms() - job.payload["at"])
            ran.set()

        w = emq.Worker(q, handler, concurrency=1)
        task = asyncio.create_task(w.run())
        try:
            for _ in range(5):
                ran.clear()
                at = await q.server_time_ms() + 300
                await q.enqueue_at({"at": at}, at)
                await asyncio.wait_for(ran.wait(), 15)
        finally:
            w.stop()
            await asyncio.wait_for(task, 30)
            await q.aclose()
        return lateness
    lateness = run(main())
    assert min(lateness) >= 0, "a job ran before its run-at"
    assert statistics.median(lateness) < 40, lateness
