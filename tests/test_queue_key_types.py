"""A queue key of another type (something other than emqfast wrote a string where the
pending set goes, a hash where the counter goes) is refused with ``KeyTypeConflict``
before anything is written.

An enqueue, on every admission path and in both facades: no job hash left in no set, so
once the key is cleared the same call (same job id) admits the job instead of calling it a
duplicate. A Worker's claim and start: no job popped and leased to nobody; once the key is
cleared, the job runs exactly once. The outcome scripts (complete, fail, release, retry):
no job hash saying an outcome its sets do not; once the key is cleared, the same call
writes it."""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict

import pytest

from conftest import dump_queue
import emqfast
from emqfast.core.errors import KeyTypeConflict, translate
from emqfast.core.keys import QueueKeys
import engine_util
from engine_util import make_queue, running_worker
from test_contract_facades import Facade
from waiting import wait_until

HOUR_MS = 3_600_000


@pytest.fixture(params=["sync", "async"])
def facade(request, redis_url):
    f = Facade(request.param, redis_url)
    yield f
    f.close()


def _foreign(r: Any, key: str, kind: str) -> None:
    """Put a key of type ``kind`` at ``key``, as another program might."""
    r.delete(key)
    if kind == "string":
        r.set(key, "not emqfast's")
    else:
        r.hset(key, "f", "v")


# Each admission path: how it enqueues (job ids chosen, so a retry is recognisable) and
# the keys it writes, with the foreign type put there.
PATHS: Dict[str, Callable[[Any], Any]] = {
    "enqueue": lambda q: q.enqueue({"n": 1}, job_id="JOBone"),
    "enqueue-delayed": lambda q: q.enqueue({"n": 1}, job_id="JOBone", delay_ms=HOUR_MS),
    "enqueue_many": lambda q: q.enqueue_many([{"n": 1}, b"two"], job_ids=["JOBone", "JOBtwo"]),
    "enqueue_many-delayed": lambda q: q.enqueue_many([{"n": 1}, b"two"],
                                                     job_ids=["JOBone", "JOBtwo"],
                                                     delay_ms=HOUR_MS),
    "group": lambda q: q.enqueue({"n": 1}, job_id="JOBone", group="g"),
}
WRITTEN = {
    "enqueue": ["pending", "marker", "events", "counter"],
    "enqueue-delayed": ["delayed", "marker", "events", "counter"],
    "enqueue_many": ["pending", "marker", "events", "counter"],
    "enqueue_many-delayed": ["delayed", "marker", "events", "counter"],
    "group": ["lane", "groups", "marker", "events", "counter"],
}
CASES = [(path, key) for path, keys in WRITTEN.items() for key in keys]


def _key(keys: QueueKeys, name: str) -> str:
    if name == "lane":
        return keys.group_pending("g")
    return getattr(keys, name)


@pytest.mark.parametrize("path,key_name", CASES, ids=[f"{p}:{k}" for p, k in CASES])
def test_a_queue_key_of_another_type_refuses_the_enqueue_before_any_write(
        facade, qname, r, path, key_name):
    q = facade.queue(qname)
    q.enqueue("seed", job_id="JOBseed")  # a live queue: stamped, with events and a counter
    key = _key(q.keys if hasattr(q, "keys") else QueueKeys(qname), key_name)
    # the counter is a string: a hash is foreign there; everywhere else a string is
    _foreign(r, key, "hash" if key_name == "counter" else "string")
    before = dump_queue(r, qname)

    with pytest.raises(KeyTypeConflict):
        PATHS[path](q)

    assert dump_queue(r, qname) == before
    assert not r.exists(QueueKeys(qname).job("JOBone"))

    # the key cleared (as its error tells the user to), the same call admits the job
    r.delete(key)
    refs = PATHS[path](q)
    first = refs[0] if isinstance(refs, list) else refs
    assert first.id == "JOBone"
    job = q.get("JOBone")
    assert job is not None
    assert job.state in ("pending", "scheduled", "waiting")


# The keys a Worker's claim writes after popping (refused before the pop: the job stays
# pending) and those its start writes after stamping jobs (refused before any stamp: the
# job stays claimed by the refused Worker and comes back when its lease runs out).
CLAIM_KEYS = ["active", "leases", "marker"]
START_KEYS = ["events", "metrics"]


@pytest.mark.parametrize("key_name", CLAIM_KEYS + START_KEYS)
def test_a_worker_meeting_a_key_of_another_type_stops_typed_and_loses_no_job(
        redis_url, qname, r, key_name):
    q = make_queue(redis_url, qname)
    ref = q.enqueue({"n": 1}, job_id="JOBone")
    key = getattr(q.keys, key_name)
    _foreign(r, key, "string")
    ran = []

    with pytest.raises(KeyTypeConflict):
        emqfast.Worker(q, lambda job: ran.append(job.id), lease_ms=300).run_until_idle(
            timeout_s=30)
    assert ran == []
    assert r.hget(q.keys.job(ref.id), "state") is None  # never stamped active
    if key_name in CLAIM_KEYS:
        assert r.zscore(q.keys.pending, ref.id) is not None  # not popped

    r.delete(key)
    with running_worker(emqfast.Worker(make_queue(redis_url, qname),
                                       lambda job: ran.append(job.id), lease_ms=300)):
        wait_until(lambda: q.get(ref.id).state == "completed", what="the job ran")
    assert ran == [ref.id]


# The outcome scripts: each key a script writes after its first write, with the foreign
# type put there once the job is running (or failed, for retry). Refused before any write:
# the job keeps its lease (or stays failed), so once the key is cleared the same call
# (same token) writes the outcome.
def _running(q: emqfast.Queue) -> tuple:
    q.enqueue({"n": 1}, job_id="JOBone")
    [pair] = engine_util.claim(q, "w1", HOUR_MS)
    return pair


def _refused_untouched(r: Any, qname: str, key: str, call: Callable[[], Any]) -> None:
    """``call`` refused with KeyTypeConflict while ``key`` is foreign, Redis untouched."""
    _foreign(r, key, "string")
    before = dump_queue(r, qname)
    exc = engine_util.raised(call)
    assert isinstance(translate(exc) if exc is not None else None, KeyTypeConflict), exc
    assert dump_queue(r, qname) == before
    r.delete(key)


COMPLETE_KEYS = ["active", "completed", "metrics", "events"]


@pytest.mark.parametrize("key_name", COMPLETE_KEYS)
def test_a_complete_meeting_a_key_of_another_type_writes_nothing(redis_url, qname, r,
                                                                  key_name):
    q = make_queue(redis_url, qname)
    job_id, token = _running(q)
    _refused_untouched(r, qname, getattr(q.keys, key_name),
                       lambda: engine_util.complete(q, job_id, token))

    assert r.hget(q.keys.leases, job_id).decode() == token  # still held: the ack may come again
    engine_util.complete(q, job_id, token)
    assert q.get(job_id).state == "completed"


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_a_worker_whose_outcomes_meet_a_key_of_another_type_stops_typed(redis_url, qname, r,
                                                                       kind):
    # an outcome that can never be written must stop the Worker: going on would run job
    # after job whose completion is refused, each re-run by the reaper
    q = make_queue(redis_url, qname)
    refs = q.enqueue_many([{"n": i} for i in range(3)])
    ran: list = []

    def handler(job: Any) -> None:
        ran.append(job.id)
        if len(ran) == 1:  # before the first outcome is written, and never cleared again
            _foreign(r, q.keys.completed, "string")

    if kind == "threads":
        with pytest.raises(KeyTypeConflict):
            emqfast.Worker(q, handler, lease_ms=300, concurrency=1).run_until_idle(
                timeout_s=30)
    else:
        import emqfast.aio as emq

        async def main() -> None:
            aq = emq.Queue(qname, emq.connect(redis_url))
            try:
                await emq.Worker(aq, handler, lease_ms=300, concurrency=1).run_until_idle(
                    timeout_s=30)
            finally:
                await aq.aclose()

        with pytest.raises(KeyTypeConflict):
            asyncio.run(main())
    assert ran and len(set(ran)) == len(ran)  # it stopped instead of re-running them
    assert all(q.get(ref.id).state != "completed" for ref in refs)

    r.delete(q.keys.completed)  # cleared: the unwritten runs come back after their lease
    with running_worker(emqfast.Worker(make_queue(redis_url, qname), lambda job: None,
                                       lease_ms=300)):
        wait_until(lambda: all(q.get(ref.id).state == "completed" for ref in refs),
                   timeout=30, what="every job completed once the key is cleared")


# fail.lua by outcome: failed for good (-1), retried after a delay, retried at once (0)
FAIL_CASES = [(-1, "active"), (-1, "failed"), (-1, "metrics"), (-1, "events"),
              (HOUR_MS, "delayed"), (HOUR_MS, "marker"), (0, "pending"), (0, "marker")]


@pytest.mark.parametrize("delay,key_name", FAIL_CASES,
                         ids=[f"{d}:{k}" for d, k in FAIL_CASES])
def test_a_fail_meeting_a_key_of_another_type_writes_nothing(redis_url, qname, r, delay,
                                                              key_name):
    q = make_queue(redis_url, qname)
    job_id, token = _running(q)
    _refused_untouched(r, qname, getattr(q.keys, key_name),
                       lambda: engine_util.fail(q, job_id, token, delay=delay))

    assert engine_util.fail(q, job_id, token, delay=delay)[0] == (0 if delay < 0 else 1)
    assert q.get(job_id).state == ("failed" if delay < 0 else
                                   "scheduled" if delay else "pending")


@pytest.mark.parametrize("key_name", ["active", "pending", "marker", "events"])
def test_a_release_meeting_a_key_of_another_type_writes_nothing(redis_url, qname, r, key_name):
    q = make_queue(redis_url, qname)
    job_id, token = _running(q)
    _refused_untouched(r, qname, getattr(q.keys, key_name),
                       lambda: engine_util.release(q, job_id, token))

    assert engine_util.release(q, job_id, token) == 1
    assert q.get(job_id).state == "pending"


@pytest.mark.parametrize("key_name", ["pending", "marker", "events"])
def test_a_retry_meeting_a_key_of_another_type_writes_nothing(facade, redis_url, qname, r,
                                                               key_name):
    q = make_queue(redis_url, qname)
    job_id, token = _running(q)
    engine_util.fail(q, job_id, token)
    fq = facade.queue(qname)  # the user's call, in both facades
    _refused_untouched(r, qname, getattr(q.keys, key_name), lambda: fq.retry(job_id))

    fq.retry(job_id)
    assert q.get(job_id).state == "pending"


def test_an_outcome_with_dependents_meeting_an_outbox_of_another_type_writes_nothing(
        redis_url, qname, r):
    q = make_queue(redis_url, qname)
    job_id, token = _running(q)
    child = q.enqueue({"n": 2}, depends_on=[job_id])
    _refused_untouched(r, qname, q.keys.outbox, lambda: engine_util.complete(q, job_id, token))

    engine_util.complete(q, job_id, token)
    assert q.get(job_id).state == "completed"
    assert q.get(child.id) is not None
