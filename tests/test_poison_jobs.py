"""A job hash edited or corrupted outside emqfast (a payload that is not JSON, an unknown
encoding tag) must not stop a worker: that job fails for good with a typed PayloadError,
the others run, nothing stays leased. Before this, the JSONDecodeError escaped the start
path: the worker died and left its healthy claimed jobs active until their leases ran out,
and the same poison job then killed the next worker."""
from __future__ import annotations

import asyncio

import pytest
import redis

import emqfast
import emqfast.aio as emq
from emqfast.errors import PayloadError

CORRUPTIONS = {"bad-json": {"payload": b"{not json"}, "unknown-enc": {"enc": "p"},
               "bad-options": {"opts": b'{"a": "three"'}}


def _poison(r: redis.Redis, q, job_id: str, how: str) -> None:
    r.hset(q.keys.job(job_id), mapping=CORRUPTIONS[how])


def _check(r, q, refs, poisoned: str, seen) -> None:
    assert sorted(seen) == [0, 2, 3]  # every healthy job ran, the poisoned one did not
    counts = q.counts()
    assert counts["completed"] == 3 and counts["failed"] == 1 and counts["active"] == 0
    assert r.hlen(q.keys.leases) == 0
    failed = r.hgetall(q.keys.job(poisoned))
    assert failed[b"state"] == b"failed" and b"PayloadError" in failed[b"error"]
    assert failed[b"attempts"] == b"1"  # failed for good: no retry of an undecodable job


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_thread_worker_fails_a_poisoned_job_and_goes_on(redis_url, qname, r, how):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url), attempts=3)
    refs = [q.enqueue(i) for i in range(4)]
    _poison(r, q, refs[1].id, how)
    seen = []
    stats = emqfast.Worker(q, lambda job: seen.append(job.payload),
                           concurrency=2).run_until_idle(timeout_s=20)
    assert stats.failed == 1 and stats.retried == 0
    _check(r, q, refs, refs[1].id, seen)


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_aio_worker_fails_a_poisoned_job_and_goes_on(redis_url, qname, r, how):
    seen = []

    async def handler(job):
        seen.append(job.payload)

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url), attempts=3)
        refs = [await q.enqueue(i) for i in range(4)]
        _poison(r, q, refs[1].id, how)
        await emq.Worker(q, handler, concurrency=2).run_until_idle(timeout_s=20)
        await q.aclose()
        return refs
    refs = asyncio.run(main())
    _check(r, q=emqfast.Queue(qname, r), refs=refs, poisoned=refs[1].id, seen=seen)


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_reading_a_poisoned_job_is_a_typed_error(r, qname, how):
    q = emqfast.Queue(qname, r)
    ref = q.enqueue({"n": 1})
    _poison(r, q, ref.id, how)
    with pytest.raises(PayloadError, match="stored"):
        q.get(ref.id)
