"""Engine contract: the boot fence. A queue whose meta hash records another keyspace major
refuses every writing call with VersionMismatch and nothing is written."""
from __future__ import annotations

import pytest

import emqfast
from conftest import dump_queue
from emqfast.core.errors import VersionMismatch
from emqfast.core.version import KEYSPACE_VERSION
from engine_util import (claim, complete, extend, fail, make_queue, release, server_ms,
                         wait_server_past)
from waiting import wait_until


@pytest.fixture
def foreign(r, redis_url, qname):
    """A queue with a job in every state (incl. one due and one with an expired lease),
    then stamped as written by keyspace major 9."""
    q = make_queue(redis_url, qname)
    done, doomed = q.enqueue("c").id, q.enqueue("f", attempts=1).id

    def handler(job):
        if job.id == doomed:
            raise RuntimeError("no")
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    due = q.enqueue_in("due", 50)
    stale_job = q.enqueue("stale", priority=0).id
    [(stale_id, stale_token)] = claim(q, "zombie", lease_ms=100)
    assert stale_id == stale_job
    held_job = q.enqueue("held").id
    [(held_id, held_token)] = claim(q, "holder", lease_ms=3_600_000)
    ids = {"pending": q.enqueue("p").id, "scheduled": q.enqueue_in("s", 3_600_000).id,
           "due": due.id, "completed": done, "failed": doomed,
           "stale": (stale_id, stale_token), "held": (held_job, held_token)}
    assert held_id == held_job
    wait_server_past(r, q.get(due.id).run_at_ms)
    wait_until(lambda: r.zrangebyscore(q.keys.active, "-inf", server_ms(r)), what="stale lease")
    r.hset(q.keys.meta, "version", "other:9.0")
    return q, ids


WRITES = [
    ("enqueue", lambda q, i: q.enqueue("x")),
    ("enqueue with id", lambda q, i: q.enqueue("x", job_id="JOB-new")),
    ("enqueue_in", lambda q, i: q.enqueue_in("x", 1_000)),
    ("enqueue_at", lambda q, i: q.enqueue_at("x", 0)),
    ("pause", lambda q, i: q.pause()),
    ("resume", lambda q, i: q.resume()),
    ("cancel pending", lambda q, i: q.cancel(i["pending"])),
    ("cancel scheduled", lambda q, i: q.cancel(i["scheduled"])),
    ("retry failed", lambda q, i: q.retry(i["failed"])),
    ("trim", lambda q, i: q.trim(keep_completed=0, keep_failed=0)),
    ("trim by age", lambda q, i: q.trim(max_age_ms=0)),
    ("promote", lambda q, i: q.promote()),
    ("reap", lambda q, i: q.reap()),
    ("worker", lambda q, i: emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=10)),
    ("complete", lambda q, i: complete(q, *i["held"])),
    ("fail", lambda q, i: fail(q, *i["held"], delay=-1)),
    ("fail and retry", lambda q, i: fail(q, *i["held"], delay=0)),
    ("extend", lambda q, i: extend(q, 60_000, i["held"])),
    ("release", lambda q, i: release(q, *i["held"])),
]


@pytest.mark.parametrize("label, call", WRITES, ids=[w[0] for w in WRITES])
def test_every_writing_call_is_fenced(r, qname, foreign, label, call):
    q, ids = foreign
    before = dump_queue(r, qname)
    with pytest.raises(VersionMismatch) as info:
        call(q, ids)
    assert "other:9.0" in str(info.value)
    assert dump_queue(r, qname) == before


def test_enqueue_many_is_fenced(r, qname, foreign, backend):
    q, _ = foreign
    before = dump_queue(r, qname)
    with pytest.raises(VersionMismatch):
        q.enqueue_many(["a", "b", "c"])
    with pytest.raises(VersionMismatch):
        q.enqueue_many(["a", "b"], delay_ms=1_000)
    assert dump_queue(r, qname) == before


def test_claim_is_fenced(r, qname, foreign):
    q, _ = foreign
    before = dump_queue(r, qname)
    with pytest.raises(VersionMismatch):
        claim(q, "w", lease_ms=1_000)
    assert dump_queue(r, qname) == before


def test_same_major_is_accepted_and_first_write_records_version(r, redis_url, qname):
    q = make_queue(redis_url, qname)
    assert r.exists(q.keys.meta) == 0
    ref = q.enqueue("x")
    assert r.hget(q.keys.meta, "version") == KEYSPACE_VERSION.encode()
    major = KEYSPACE_VERSION.split(".")[0]
    r.hset(q.keys.meta, "version", f"{major}.99")  # a later minor of the same major
    assert not q.enqueue("y").duplicate
    assert q.cancel(ref.id)
    q.pause()
    q.resume()
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=10)
    assert q.counts()["completed"] == 1
    assert r.hget(q.keys.meta, "version") == f"{major}.99".encode()  # not overwritten
