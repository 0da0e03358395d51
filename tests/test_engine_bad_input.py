"""Engine contract: bad input raises a typed emqfast error and leaves Redis byte-for-byte
unchanged, on an empty queue and on one that already holds jobs in every state."""
from __future__ import annotations

import pytest

import emqfast
from conftest import dump_queue
from emqfast.core.scores import MAX_OFFSET_MS, MAX_RUN_AT_MS
from emqfast.core.errors import (EmqError, InvalidInput, JobNotFound, JobStateError, KindError,
    PayloadError, RangeError)
from engine_util import make_queue

UNKNOWN = "JOB-does-not-exist"

# (label, call(q, ids) -> None, expected error class). ``ids`` holds one id per state.
BAD_CALLS = [
    ("wrong brand", lambda q, i: q.enqueue("x", job_id="task-1"), KindError),
    ("id not text", lambda q, i: q.enqueue("x", job_id=17), InvalidInput),
    ("id too long", lambda q, i: q.enqueue("x", job_id="JOB" + "x" * 300), InvalidInput),
    ("negative delay", lambda q, i: q.enqueue_in("x", -1), RangeError),
    ("float delay", lambda q, i: q.enqueue_in("x", 1.5), InvalidInput),
    ("delay past range", lambda q, i: q.enqueue_in("x", MAX_OFFSET_MS), RangeError),
    ("negative run-at", lambda q, i: q.enqueue_at("x", -5), RangeError),
    ("run-at past range", lambda q, i: q.enqueue_at("x", MAX_RUN_AT_MS + 1), RangeError),
    ("delay and run-at", lambda q, i: q.enqueue("x", delay_ms=1, run_at_ms=1), InvalidInput),
    ("priority -1", lambda q, i: q.enqueue("x", priority=-1), RangeError),
    ("priority 2**21", lambda q, i: q.enqueue("x", priority=2 ** 21), RangeError),
    ("priority bool", lambda q, i: q.enqueue("x", priority=True), InvalidInput),
    ("priority float", lambda q, i: q.enqueue("x", priority=2.0), InvalidInput),
    ("attempts 0", lambda q, i: q.enqueue("x", attempts=0), RangeError),
    ("backoff not Backoff", lambda q, i: q.enqueue("x", backoff=1000), InvalidInput),
    ("payload object", lambda q, i: q.enqueue(object()), PayloadError),
    ("payload nan", lambda q, i: q.enqueue({"v": float("nan")}), PayloadError),
    ("retry unknown job", lambda q, i: q.retry(UNKNOWN), JobNotFound),
    ("retry pending job", lambda q, i: q.retry(i["pending"]), JobStateError),
    ("retry scheduled job", lambda q, i: q.retry(i["scheduled"]), JobStateError),
    ("retry completed job", lambda q, i: q.retry(i["completed"]), JobStateError),
    ("retry wrong brand", lambda q, i: q.retry("x"), KindError),
    ("cancel wrong brand", lambda q, i: q.cancel("x"), KindError),
    ("get wrong brand", lambda q, i: q.get("nope"), KindError),
    ("unknown state", lambda q, i: q.job_ids("done"), InvalidInput),
    ("promote limit 0", lambda q, i: q.promote(limit=0), RangeError),
    ("reap max_stalled -1", lambda q, i: q.reap(max_stalled=-1), RangeError),
    ("trim keep_failed -1", lambda q, i: q.trim(keep_completed=0, keep_failed=-1), RangeError),
    ("trim keep not int", lambda q, i: q.trim(keep_completed="all"), InvalidInput),
    ("trim max_age -1", lambda q, i: q.trim(keep_completed=0, max_age_ms=-1), RangeError),
    ("trim max_age text", lambda q, i: q.trim(max_age_ms="1d"), InvalidInput),
]

BAD_MANY = [
    ("many: bad payload", lambda q, i: q.enqueue_many(["ok", object(), "ok"]), PayloadError),
    ("many: bad id", lambda q, i: q.enqueue_many(["a", "b"], job_ids=["JOBa", "b"]), KindError),
    ("many: id count", lambda q, i: q.enqueue_many(["a", "b"], job_ids=["JOBa"]), InvalidInput),
    ("many: priority", lambda q, i: q.enqueue_many(["a"], priority=-1), RangeError),
    ("many: delay", lambda q, i: q.enqueue_many(["a"], delay_ms=-1), RangeError),
    ("many: run-at", lambda q, i: q.enqueue_many(["a"], run_at_ms=MAX_RUN_AT_MS + 1), RangeError),
    ("many: far delay", lambda q, i: q.enqueue_many(["a", "b"], delay_ms=MAX_OFFSET_MS),
     RangeError),
    ("many: attempts", lambda q, i: q.enqueue_many(["a"], attempts=True), InvalidInput),
    ("many: not iterable", lambda q, i: q.enqueue_many(5), TypeError),
]


def _populate(q: emqfast.Queue) -> dict:
    """One job in every state (completed and failed ones really ran through a Worker)."""
    done, doomed = q.enqueue("c").id, q.enqueue("f", attempts=1).id

    def handler(job):
        if job.id == doomed:
            raise RuntimeError("no")
        return "ok"
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    ids = {"pending": q.enqueue("p").id, "scheduled": q.enqueue_in("s", 3_600_000).id,
           "completed": done, "failed": doomed}
    assert q.counts() == {"scheduled": 1, "pending": 1, "grouped": 0, "active": 0,
                          "completed": 1, "failed": 1, "cancelled": 0, "waiting_deps": 0, "expired": 0}
    return ids


def _check(r, redis_url, qname, populated, call, exc):
    q = make_queue(redis_url, qname)
    ids = _populate(q) if populated else {"pending": "JOBp", "scheduled": "JOBs",
                                           "completed": "JOBc", "failed": "JOBf"}
    if not populated and exc is JobStateError:
        exc = JobNotFound  # on an empty queue those ids do not exist
    before = dump_queue(r, qname)
    with pytest.raises(exc) as info:
        call(q, ids)
    if exc is not TypeError:
        assert isinstance(info.value, EmqError)
    assert dump_queue(r, qname) == before
    if not populated:
        assert before == {}


@pytest.mark.parametrize("populated", [False, True], ids=["empty", "populated"])
@pytest.mark.parametrize("label, call, exc", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_input_is_typed_and_writes_nothing(r, redis_url, qname, populated, label, call, exc):
    _check(r, redis_url, qname, populated, call, exc)


@pytest.mark.parametrize("populated", [False, True], ids=["empty", "populated"])
@pytest.mark.parametrize("label, call, exc", BAD_MANY, ids=[c[0] for c in BAD_MANY])
def test_bad_enqueue_many_is_typed_and_writes_nothing(r, redis_url, qname, backend, populated,
                                                      label, call, exc):
    _check(r, redis_url, qname, populated, call, exc)


def test_cancel_of_unknown_or_started_jobs_writes_nothing(r, redis_url, qname):
    q = make_queue(redis_url, qname)
    ids = _populate(q)
    before = dump_queue(r, qname)
    for job_id in (ids["completed"], ids["failed"]):
        assert q.cancel(job_id) is False
    for job_id in (UNKNOWN, UNKNOWN + "2"):  # the missing-id rule
        with pytest.raises(JobNotFound):
            q.cancel(job_id)
    assert dump_queue(r, qname) == before
    empty = make_queue(redis_url, qname + "-empty")
    with pytest.raises(JobNotFound):
        empty.cancel(UNKNOWN)
    assert dump_queue(r, qname + "-empty") == {}


@pytest.mark.parametrize("name", ["", "a{b", "a}b", "x" * 201, "bad \udc80", 5])
def test_bad_queue_names(redis_url, name):
    with pytest.raises(InvalidInput):
        make_queue(redis_url, name)


def test_worker_arguments_are_validated(redis_url, qname):
    q = make_queue(redis_url, qname)
    with pytest.raises(TypeError):
        emqfast.Worker("not a queue", lambda job: None)
    with pytest.raises(TypeError):
        emqfast.Worker(q, "not callable")
    for kwargs in ({"concurrency": 0}, {"lease_ms": 10}, {"max_stalled": -1},
                   {"concurrency": 1.5}):
        with pytest.raises(InvalidInput):
            emqfast.Worker(q, lambda job: None, **kwargs)


@pytest.mark.parametrize("lone", ["abc", b"abc", {"a": 1}])
def test_enqueue_many_refuses_a_lone_payload(r, qname, lone):
    """A single payload passed to enqueue_many would be split into parts: refused, nothing written."""
    q = emqfast.Queue(qname, r)
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.InvalidInput):
        q.enqueue_many(lone)
    assert dump_queue(r, qname) == before
