"""Promote one scheduled job now and delete one job: ``q.promote_job(id)`` and
``q.delete(id)`` on both facades and both backends. A promoted job moves to pending (or its
group lane) as promote.lua moves a due job, keeping its priority score; a delete removes the
hash and its set membership. A refusal (wrong state, unknown id, malformed id) is typed and
leaves Redis byte-identical; each move writes its event."""
from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from engine_util import claim

HOUR_MS = 3_600_000
SETS = ("pending", "delayed", "active", "completed", "failed", "cancelled")


@pytest.fixture(params=["sync", "aio"])
def call(request, redis_url, backend):
    """``call(q, method, *args)`` on the facade under test; ``call.make(name)`` its Queue."""
    def run(q: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(q, method)(*args, **kwargs)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out

    def make(name: str) -> Any:
        if request.param == "sync":
            return emqfast.Queue(name, redis_url)
        return emqfast.aio.Queue(name, emqfast.aio.connect(redis_url))
    run.make = make  # type: ignore[attr-defined]
    return run


def _states(q: emqfast.Queue) -> Dict[str, str]:
    """A job in each state (active: claimed and left running), made with the sync facade."""
    done = q.enqueue("done")
    doomed = q.enqueue("doomed", attempts=1)
    emqfast.Worker(q, lambda job: 1 / 0 if job.payload == "doomed" else None
                   ).run_until_idle(timeout_s=30)
    cancelled = q.enqueue("cancelled")
    assert q.cancel(cancelled.id)
    active = q.enqueue("active")
    claim(q, "w", lease_ms=60_000)
    return {"completed": done.id, "failed": doomed.id, "cancelled": cancelled.id,
            "active": active.id, "pending": q.enqueue("pending").id,
            "scheduled": q.enqueue_in("scheduled", HOUR_MS).id}


def _holders(r: Any, q: emqfast.Queue, job_id: str) -> List[str]:
    """The queue's sets (and group lanes) that hold ``job_id``."""
    keys = [getattr(q.keys, s) for s in SETS]
    keys += [k.decode() for k in r.scan_iter(match=q.keys.base + "g:*:pending")]
    return [k for k in keys if r.zscore(k, job_id) is not None]


def _events(q: emqfast.Queue, name: str) -> List[str]:
    return [e.job_id for e in q.read_events("0-0", count=10_000) if e.name == name]


def test_promote_runs_a_scheduled_job_now_in_its_priority_tier(call, r, qname):
    q, sync = call.make(qname), emqfast.Queue(qname, r)
    later = call(q, "enqueue", "later", delay_ms=HOUR_MS, priority=3)
    first = call(q, "enqueue", "first", priority=3)
    urgent = call(q, "enqueue", "urgent", priority=1)
    ps = r.hget(sync.keys.job(later.id), "ps")
    assert call(q, "promote_job", later.id) is True
    assert r.zscore(sync.keys.pending, later.id) == float(ps)  # its score kept
    assert r.zscore(sync.keys.delayed, later.id) is None
    # mint order within its tier: minted before `first`, so it runs before it
    assert [i.decode() for i in r.zrange(sync.keys.pending, 0, -1)] == [
        urgent.id, later.id, first.id]
    assert sync.get(later.id).state == "pending"
    assert r.zscore(sync.keys.marker, "0") == 0  # a blocked worker is woken
    ran: List[Any] = []
    # one handler at a time: with several, jobs started in order may finish in any order
    emqfast.Worker(sync, lambda job: ran.append(job.payload), concurrency=1
                   ).run_until_idle(timeout_s=30)
    assert ran == ["urgent", "later", "first"]  # long before its run-at
    assert _events(sync, "promoted") == [later.id]


def test_promote_puts_a_grouped_job_in_its_lane(call, r, qname):
    q, sync = call.make(qname), emqfast.Queue(qname, r)
    job = call(q, "enqueue", "g", delay_ms=HOUR_MS, group="tenant-a")
    assert call(q, "promote_job", job.id) is True
    lane = sync.keys.group_pending("tenant-a")
    assert _holders(r, sync, job.id) == [lane]
    assert r.zscore(sync.keys.groups, "tenant-a") is not None  # its group is on the ring
    ran: List[Any] = []
    emqfast.Worker(sync, lambda j: ran.append(j.id)).run_until_idle(timeout_s=30)
    assert ran == [job.id]


def test_promote_a_retry_waiting_on_its_backoff(call, r, qname):
    q, sync = call.make(qname), emqfast.Queue(qname, r)
    job = sync.enqueue("flaky", attempts=2, backoff=emqfast.Backoff.fixed(HOUR_MS))
    runs: List[int] = []

    def flaky(j: Any) -> None:
        runs.append(j.attempts)
        if len(runs) == 1:
            raise RuntimeError("first run fails")
    emqfast.Worker(sync, flaky).run_until_idle(timeout_s=30)
    assert sync.get(job.id).state == "scheduled"  # the retry waits an hour
    assert call(q, "promote_job", job.id) is True
    assert _holders(r, sync, job.id) == [sync.keys.pending]
    emqfast.Worker(sync, flaky).run_until_idle(timeout_s=30)
    assert len(runs) == 2 and sync.get(job.id).state == "completed"


@pytest.mark.parametrize("state", ["pending", "active", "completed", "failed", "cancelled"])
def test_promote_refuses_a_job_not_on_the_delayed_set(call, r, qname, state):
    q = call.make(qname)
    ids = _states(emqfast.Queue(qname, r))
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.JobStateError) as err:
        call(q, "promote_job", ids[state])
    assert state in str(err.value) and ids[state] in str(err.value)
    assert dump_queue(r, qname) == before


@pytest.mark.parametrize("state", ["pending", "scheduled", "completed", "failed", "cancelled"])
def test_delete_removes_a_job_in_each_state(call, r, qname, state):
    q, sync = call.make(qname), emqfast.Queue(qname, r)
    ids = _states(sync)
    job_id = ids[state]
    assert _holders(r, sync, job_id)
    assert call(q, "delete", job_id) is True
    assert not r.exists(sync.keys.job(job_id)) and _holders(r, sync, job_id) == []
    assert call(q, "get", job_id) is None
    assert _events(sync, "deleted") == [job_id]
    others = {s: i for s, i in ids.items() if s != state}
    assert all(r.exists(sync.keys.job(i)) for i in others.values())  # only that one went
    with pytest.raises(emqfast.JobNotFound):  # a second delete: it is gone
        call(q, "delete", job_id)


def test_delete_a_grouped_job_leaves_its_lane(call, r, qname):
    q, sync = call.make(qname), emqfast.Queue(qname, r)
    job = call(q, "enqueue", "g", group="tenant-b")
    keep = call(q, "enqueue", "g2", group="tenant-b")
    assert call(q, "delete", job.id) is True
    assert _holders(r, sync, job.id) == [] and not r.exists(sync.keys.job(job.id))
    assert _holders(r, sync, keep.id) == [sync.keys.group_pending("tenant-b")]


def test_delete_refuses_an_active_job(call, r, qname):
    q = call.make(qname)
    ids = _states(emqfast.Queue(qname, r))
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.JobStateError) as err:
        call(q, "delete", ids["active"])
    assert "active" in str(err.value) and ids["active"] in str(err.value)
    assert dump_queue(r, qname) == before


@pytest.mark.parametrize("method", ["promote_job", "delete"])
def test_unknown_and_malformed_ids(call, r, qname, method):
    q = call.make(qname)
    call(q, "enqueue", "seed")
    before = dump_queue(r, qname)
    with pytest.raises(emqfast.JobNotFound) as err:
        call(q, method, "JOBnever-enqueued")
    assert "JOBnever-enqueued" in str(err.value) and qname in str(err.value)
    with pytest.raises(emqfast.KindError):
        call(q, method, "not-a-job-id")
    assert dump_queue(r, qname) == before
