"""What a running job lends its handler (``job.extend_lease``, ``job.progress`` and their
awaitable twins) works where it should and says why where it cannot, on both Workers."""
from __future__ import annotations

import asyncio

import pytest

import emqfast
import emqfast.aio as emq


def test_a_thread_handler_extends_and_reports_but_has_no_awaitable_twins(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    ref = q.enqueue({"n": 1})
    seen = {}

    def handler(job):
        job.extend_lease(600_000)
        seen["deadline"] = r.zscore(q.keys.active, job.id)
        job.progress({"pct": 50})
        for twin in (job.extend_lease_async(1000), job.progress_async(1)):
            with pytest.raises(RuntimeError, match="running aio handler"):
                asyncio.run(twin)
        return "ok"

    assert emqfast.Worker(q, handler).run_until_idle(timeout_s=30).completed == 1
    done = q.get(ref.id)
    assert done.state == "completed" and done.last_progress == {"pct": 50}
    assert seen["deadline"] > 0


def test_a_job_read_back_is_not_running_anywhere(redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    job = q.get(q.enqueue("x").id)
    with pytest.raises(RuntimeError, match="running handler"):
        job.extend_lease(1000)
    with pytest.raises(RuntimeError, match="running handler"):
        job.progress(1)
    for twin in (job.extend_lease_async(1000), job.progress_async(1)):
        with pytest.raises(RuntimeError, match="running aio handler"):
            asyncio.run(twin)


def test_aio_handlers_get_the_form_their_kind_can_use(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        coro_ref = await q.enqueue({"kind": "coro"})
        plain_ref = await q.enqueue({"kind": "plain"})
        told = []

        async def coro_handler(job):
            await job.progress_async({"from": "coro"})
            with pytest.raises(RuntimeError) as exc:
                job.progress(1)  # blocking form: would deadlock the loop
            told.append(str(exc.value))

        def plain_handler(job):  # in the executor: the blocking forms work
            job.extend_lease(60_000)
            job.progress({"from": "plain"})

        def handler(job):
            return coro_handler(job) if job.payload["kind"] == "coro" else plain_handler(job)
        stats = await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        jobs = [await q.get(ref.id) for ref in (coro_ref, plain_ref)]
        await q.aclose()
        return stats, jobs, told
    stats, (coro_job, plain_job), told = asyncio.run(asyncio.wait_for(main(), 60))
    assert stats.completed == 2
    assert coro_job.last_progress == {"from": "coro"}
    assert plain_job.last_progress == {"from": "plain"}
    assert told == ["in a coroutine handler use `await job.progress_async(value)`"]
