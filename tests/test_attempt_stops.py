"""A stop (timeout, cancel) belongs to one run of a job, never to its id: when a run that
ignored its timeout is abandoned and its thread (or task) is still running, the job's
retry on the same Worker is stopped by its own timeout and by a cancel sent to it."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import emqfast
import emqfast.aio
from waiting import wait_until, wait_until_async

RETRY_NOW = emqfast.Backoff.fixed(1)


def _until_stopped(job, limit_s: float = 60.0) -> None:
    """A cooperative run: poll ``job.cancelled`` (bounded, so a broken stop fails the
    test instead of hanging it)."""
    end = time.monotonic() + limit_s
    while not job.cancelled and time.monotonic() < end:
        time.sleep(0.002)


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
def test_a_retry_on_the_same_thread_worker_is_stopped_by_its_own_stop(redis_url, qname, r,
                                                                      stop):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    stuck = threading.Event()  # attempt 1 ignores its stop until the test ends
    second: list = []

    def handler(job):
        if job.attempts == 1:
            stuck.wait(60)
            return "late"
        second.append(job)
        _until_stopped(job)
        job.raise_if_cancelled()
        return "ran to its end"

    # cancel: attempt 2's own timeout is far off, so only the cancel can stop it
    timeout_ms = 300 if stop == "timeout" else 1500
    ref = q.enqueue("x", timeout_ms=timeout_ms, attempts=2, backoff=RETRY_NOW)
    w = emqfast.Worker(q, handler, concurrency=2, cancel_grace_ms=100)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: second, 30, "the retry running beside the abandoned run")
        assert t.is_alive() and not stuck.is_set()
        if stop == "cancel":
            assert q.cancel(ref.id) == "requested"
        want = "failed" if stop == "timeout" else "cancelled"
        wait_until(lambda: q.get(ref.id).state == want, 30, f"the retry {want}")
    finally:
        stuck.set()
        w.stop()
        t.join(30)
    job = q.get(ref.id)
    assert job.attempts == 2 and job.result is None
    assert second[0].cancel_reason == ("timeout" if stop == "timeout" else "cancelled")
    if stop == "timeout":
        assert job.error.startswith("JobTimeout: timeout"), job.error
    assert not r.hexists(q.keys.leases, ref.id)


@pytest.mark.parametrize("stop", ["timeout", "cancel"])
def test_a_retry_on_the_same_aio_worker_is_stopped_by_its_own_stop(redis_url, qname, r, stop):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        stuck = asyncio.Event()
        second = asyncio.Event()
        reasons = []

        async def handler(job):
            if job.attempts == 1:
                try:
                    await asyncio.sleep(600)
                except asyncio.CancelledError:
                    await stuck.wait()  # swallows its stop and keeps running
                    return "late"
            second.set()
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                reasons.append(job.cancel_reason)
                raise
            return "ran to its end"

        timeout_ms = 300 if stop == "timeout" else 1500
        ref = await q.enqueue("x", timeout_ms=timeout_ms, attempts=2, backoff=RETRY_NOW)
        w = emqfast.aio.Worker(q, handler, concurrency=2, cancel_grace_ms=100)
        task = asyncio.ensure_future(w.run())
        try:
            await asyncio.wait_for(second.wait(), 30)
            if stop == "cancel":
                assert await q.cancel(ref.id) == "requested"
            want = "failed" if stop == "timeout" else "cancelled"

            async def ended():
                return (await q.get(ref.id)).state == want
            await wait_until_async(ended, 30, f"the retry {want}")
        finally:
            stuck.set()
            w.stop()
            await task
        return ref.id, reasons
    job_id, reasons = asyncio.run(main())
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    job = q.get(job_id)
    assert job.attempts == 2 and job.result is None
    assert reasons == ["timeout" if stop == "timeout" else "cancelled"]
    assert not r.hexists(q.keys.leases, job_id)
