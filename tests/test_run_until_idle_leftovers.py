"""``run_until_idle()`` says what it leaves: a script that drains a queue with failing jobs
returns while their retries wait out their backoff, and is told so (a warning naming the
queue and when the next is due) instead of finding them ``scheduled`` afterwards;
``wait_scheduled=True`` waits for the retries and runs them."""
from __future__ import annotations

import asyncio
import logging

import pytest

import emqfast
import emqfast.aio
from engine_util import make_queue


def _flaky(job: emqfast.Job) -> None:
    if job.payload["n"] % 5 == 0 and job.attempts == 1:
        raise RuntimeError("first attempt fails")


@pytest.mark.parametrize("facade", ["thread", "aio"])
def test_retries_left_scheduled_are_said_and_wait_scheduled_runs_them(redis_url, qname,
                                                                      facade, caplog):
    q = make_queue(redis_url, qname)
    q.enqueue_many([{"n": n} for n in range(10)], attempts=2,
                   backoff=emqfast.Backoff.fixed(1_500))
    caplog.set_level(logging.INFO, logger="emqfast.worker")
    if facade == "thread":
        stats = emqfast.Worker(q, _flaky, concurrency=2).run_until_idle(timeout_s=30)
    else:
        async def drain() -> emqfast.WorkerStats:
            aq = emqfast.aio.Queue(qname, redis_url)
            try:
                return await emqfast.aio.Worker(aq, _flaky, concurrency=2).run_until_idle(
                    timeout_s=30)
            finally:
                await aq.aclose()
        stats = asyncio.run(drain())
    assert (stats.completed, stats.retried) == (8, 2)
    assert q.counts()["scheduled"] == 2  # the retries, waiting out their backoff
    said = [r for r in caplog.records if "scheduled jobs" in r.getMessage()]
    assert said and said[-1].levelno == logging.WARNING, [r.getMessage() for r in caplog.records]
    assert repr(qname) in said[-1].getMessage() and "wait_scheduled" in said[-1].getMessage()

    again = emqfast.Worker(q, _flaky, concurrency=2).run_until_idle(timeout_s=30,
                                                                    wait_scheduled=True)
    assert again.completed == 2
    assert q.counts()["scheduled"] == 0 and q.counts()["completed"] == 10


def test_a_job_scheduled_on_purpose_is_said_quietly(redis_url, qname, caplog):
    """No retries of this Worker's among what is left: INFO, not a warning (a script that
    schedules a reminder for later has nothing to be warned about)."""
    q = make_queue(redis_url, qname)
    q.enqueue_in({"remind": 7}, 30_000)
    q.enqueue({"now": 1})
    caplog.set_level(logging.INFO, logger="emqfast.worker")
    assert emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30).completed == 1
    said = [r for r in caplog.records if "scheduled jobs" in r.getMessage()]
    assert said and all(r.levelno == logging.INFO for r in said)
