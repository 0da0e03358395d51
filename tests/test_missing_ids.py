"""One missing-id rule across the by-id methods of both facades:
reading a job that is not there answers None (``q.get``); acting on one (``cancel``,
``retry``) raises ``emqfast.JobNotFound`` naming the id and the queue; an id without the
JOB brand is a ``KindError`` for all of them. A refused call names the job's state and
writes nothing; a cancelled job keeps a record (state, set, counts, retention)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from engine_util import claim

MISSING = "JOBnever-enqueued"


@pytest.fixture(params=["sync", "aio"])
def call(request, redis_url):
    """``call(q, method, *args)`` on the facade under test; ``make(name)`` its Queue."""
    def run(q: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(q, method)(*args, **kwargs)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out

    def make(name: str) -> Any:
        if request.param == "sync":
            return emqfast.Queue(name, redis_url)
        return emqfast.aio.Queue(name, emqfast.aio.connect(redis_url))
    run.make = make  # type: ignore[attr-defined]
    return run


def _states(q_sync: emqfast.Queue) -> dict:
    """A job in each state (active: claimed and left running)."""
    done = q_sync.enqueue("done")
    doomed = q_sync.enqueue("doomed", attempts=1)
    emqfast.Worker(q_sync, lambda job: 1 / 0 if job.payload == "doomed" else None
                   ).run_until_idle(timeout_s=30)
    cancelled = q_sync.enqueue("cancelled")
    assert q_sync.cancel(cancelled.id)
    active = q_sync.enqueue("active")
    claim(q_sync, "w", lease_ms=60_000)
    return {"completed": done.id, "failed": doomed.id, "cancelled": cancelled.id,
            "active": active.id, "pending": q_sync.enqueue("pending").id,
            "scheduled": q_sync.enqueue_in("scheduled", 3_600_000).id}


def test_get_answers_none_and_writes_act_with_job_not_found(call, r, qname):
    q = call.make(qname)
    call(q, "enqueue", "seed")
    before = dump_queue(r, qname)
    assert call(q, "get", MISSING) is None
    for method in ("cancel", "retry"):
        with pytest.raises(emqfast.JobNotFound) as err:
            call(q, method, MISSING)
        assert MISSING in str(err.value) and qname in str(err.value)
        assert isinstance(err.value, emqfast.EmqError) and isinstance(err.value, LookupError)
    assert dump_queue(r, qname) == before


def test_missing_ids_on_a_queue_never_written(call, r, qname):
    q = call.make(qname)
    assert call(q, "get", MISSING) is None
    for method in ("cancel", "retry"):
        with pytest.raises(emqfast.JobNotFound):
            call(q, method, MISSING)
    assert dump_queue(r, qname) == {}


@pytest.mark.parametrize("bad", ["order-42", "", "job-lowercase"])
def test_an_id_without_the_brand_is_a_kind_error_everywhere(call, r, qname, bad):
    q = call.make(qname)
    for method in ("get", "cancel", "retry"):
        with pytest.raises(emqfast.KindError, match="JOB"):
            call(q, method, bad)
    assert dump_queue(r, qname) == {}


def test_retry_names_the_state_of_a_job_that_is_not_failed(call, r, qname):
    ids = _states(emqfast.Queue(qname, r))
    q = call.make(qname)
    before = dump_queue(r, qname)
    for state in ("completed", "cancelled", "active", "pending", "scheduled"):
        with pytest.raises(emqfast.JobStateError, match=f"it is {state}, and only failed"):
            call(q, "retry", ids[state])
    assert dump_queue(r, qname) == before
    call(q, "retry", ids["failed"])  # the one state it takes
    assert call(q, "get", ids["failed"]).state == "pending"


def test_cancel_refuses_finished_and_cancelled_jobs_and_asks_for_started_ones(call, r, qname):
    ids = _states(emqfast.Queue(qname, r))
    q = call.make(qname)
    before = dump_queue(r, qname)
    for state in ("completed", "failed", "cancelled"):
        assert call(q, "cancel", ids[state]) is False
        assert call(q, "get", ids[state]).state == state  # what to tell the user
    assert dump_queue(r, qname) == before
    # an active job's worker is asked to stop it; it stays active until then
    assert call(q, "cancel", ids["active"]) == emqfast.CancelResult.REQUESTED
    assert call(q, "get", ids["active"]).state == "active"


def test_a_cancelled_job_keeps_a_record(call, r, qname):
    q = call.make(qname)
    waiting = call(q, "enqueue", {"n": 1})
    later = call(q, "enqueue_in", {"n": 2}, 3_600_000)
    grouped = call(q, "enqueue", {"n": 3}, group="g")
    for ref in (waiting, later, grouped):
        assert call(q, "cancel", ref.id) is True
    counts = call(q, "counts")
    assert counts["cancelled"] == 3 and counts["pending"] == counts["scheduled"] == 0
    assert sorted(call(q, "job_ids", "cancelled")) == sorted([waiting.id, later.id, grouped.id])
    job = call(q, "get", later.id)
    assert job.state == "cancelled" and job.payload == {"n": 2} and job.finished_ms
    assert call(q, "enqueue", {"n": 1}, job_id=waiting.id).status == "duplicate"
    assert call(q, "trim", keep_cancelled=1) == 2  # retention covers the records
    assert call(q, "counts")["cancelled"] == 1
