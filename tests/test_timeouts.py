"""Timeouts. ``enqueue(..., timeout_ms=N)`` (or the Worker's ``job_timeout_ms``):
an async handler is cancelled at N; a sync handler is signalled as for a cancel
(``job.cancelled``, reason ``timeout``) and, if it keeps running past the grace, its run is
abandoned; the job fails (or retries) with error ``timeout``, and the lease is never left
dangling."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from waiting import wait_until, wait_until_async


def _run_until_idle(w) -> None:
    w.run_until_idle(timeout_s=60, wait_scheduled=True)


def _timed_out(q, r, job_id: str, attempts: int) -> None:
    job = q.get(job_id)
    assert job.state == "failed" and job.attempts == attempts
    assert job.error.startswith("JobTimeout: timeout"), job.error
    assert not r.hexists(q.keys.leases, job_id) and r.zscore(q.keys.active, job_id) is None
    assert job.result is None


def test_a_cooperative_sync_handler_stops_at_its_timeout(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    reasons = []

    def handler(job):
        while not job.cancelled:
            time.sleep(0.001)
        reasons.append(job.cancel_reason)
        job.raise_if_cancelled()

    ref = q.enqueue("slow", timeout_ms=100, attempts=1)
    assert q.get(ref.id).extra.get("t") == 100
    _run_until_idle(emqfast.Worker(q, handler))
    _timed_out(q, r, ref.id, 1)
    assert reasons == ["timeout"]


def test_a_timed_out_job_retries_per_its_attempts(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    runs = []

    def handler(job):
        runs.append(job.attempts)
        while not job.cancelled:
            time.sleep(0.001)
        return "swallowed: still a timeout"

    ref = q.enqueue("slow", timeout_ms=50, attempts=3, backoff=emqfast.Backoff.fixed(1))
    w = emqfast.Worker(q, handler)
    _run_until_idle(w)
    assert runs == [1, 2, 3]
    _timed_out(q, r, ref.id, 3)
    assert w.stats.retried == 2 and w.stats.failed == 1


def test_a_sync_handler_past_the_grace_is_abandoned_and_its_late_return_ignored(
        redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    gate = threading.Event()
    began = []

    def handler(job):
        began.append(job.payload)
        if job.payload == "stuck":
            gate.wait(30)  # ignores job.cancelled
            return "late"
        return job.payload

    w = emqfast.Worker(q, handler, concurrency=1, prefetch=0, cancel_grace_ms=50)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        stuck = q.enqueue("stuck", timeout_ms=50, attempts=1)
        wait_until(lambda: q.get(stuck.id).state == "failed", 30, "abandoned as timed out")
        _timed_out(q, r, stuck.id, 1)
        nxt = q.enqueue("next")
        assert began == ["stuck"]  # its thread still holds the only slot
        gate.set()
        wait_until(lambda: q.get(nxt.id).state == "completed", 30, "next job ran")
    finally:
        gate.set()
        w.stop()
        t.join(30)
    _timed_out(q, r, stuck.id, 1)  # the late "late" was not written


def test_the_worker_default_applies_to_jobs_without_their_own(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))

    def handler(job):
        if job.payload == "quick":
            return "ok"
        while not job.cancelled:
            time.sleep(0.001)
        job.raise_if_cancelled()

    slow = q.enqueue("slow", attempts=1)
    quick = q.enqueue("quick", timeout_ms=60_000)  # its own limit wins
    _run_until_idle(emqfast.Worker(q, handler, job_timeout_ms=80))
    _timed_out(q, r, slow.id, 1)
    assert q.get(quick.id).state == "completed"


@pytest.mark.parametrize("swallow", [False, True])
def test_an_async_handler_is_cancelled_at_its_timeout(redis_url, qname, r, swallow):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        seen = []

        async def handler(job):
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                seen.append(job.cancel_reason)
                if swallow:
                    return "swallowed"
                raise

        ref = await q.enqueue("slow", timeout_ms=80, attempts=2,
                              backoff=emqfast.Backoff.fixed(1))
        w = emqfast.aio.Worker(q, handler)
        await w.run_until_idle(timeout_s=60, wait_scheduled=True)
        return ref.id, seen, w.stats
    job_id, seen, stats = asyncio.run(main())
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    _timed_out(q, r, job_id, 2)
    assert seen == ["timeout", "timeout"] and stats.retried == 1 and stats.failed == 1


def test_a_plain_handler_in_the_aio_worker_is_signalled_then_abandoned(redis_url, qname, r):
    gate = threading.Event()

    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        seen = []

        def handler(job):  # runs in the executor
            deadline = time.monotonic() + 10
            while not job.cancelled and time.monotonic() < deadline:
                time.sleep(0.001)
            seen.append(job.cancel_reason)
            gate.wait(30)  # then ignores it
            return "late"

        w = emqfast.aio.Worker(q, handler, cancel_grace_ms=50)
        task = asyncio.ensure_future(w.run())
        ref = await q.enqueue("slow", timeout_ms=50, attempts=1)

        async def failed():
            return (await q.get(ref.id)).state == "failed"
        await wait_until_async(failed, 30, "abandoned as timed out")
        gate.set()
        w.stop()
        await task
        return ref.id, seen
    try:
        job_id, seen = asyncio.run(main())
    finally:
        gate.set()
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    _timed_out(q, r, job_id, 1)
    assert seen == ["timeout"]


@pytest.mark.parametrize("bad", [0, -5, 1.5, "100", True, 1 << 41])
def test_a_bad_timeout_is_typed_and_writes_nothing(redis_url, qname, r, bad):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    q.enqueue("keep")
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.InvalidInput):
        q.enqueue("x", timeout_ms=bad)
    with pytest.raises(emqfast.InvalidInput):
        q.enqueue_many(["x", "y"], timeout_ms=bad)
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker(q, lambda job: None, job_timeout_ms=bad)
    assert dump_queue(r, qname) == before


def test_a_thread_workers_timeout_counts_from_its_handlers_start(redis_url, qname):
    """Jobs started ahead of a free handler thread wait for one without their timeout
    running: a quick job queued behind two slow ones completes, its handler called."""
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    called = []

    def handler(job):
        called.append(job.payload)
        if job.payload == "slow":
            time.sleep(1.0)

    slow = [q.enqueue("slow") for _ in range(2)]
    quick = [q.enqueue("quick", timeout_ms=200, attempts=1) for _ in range(4)]
    w = emqfast.Worker(q, handler, concurrency=2, prefetch=8, cancel_grace_ms=100)
    _run_until_idle(w)
    assert [q.get(ref.id).state for ref in slow + quick] == ["completed"] * 6
    assert called.count("quick") == 4
