"""A queue key of another type (something other than emqfast wrote a string where the
pending set goes, a hash where the counter goes) is refused with ``KeyTypeConflict``
before anything is written.

An enqueue, on every admission path and in both facades: no job hash left in no set, so
once the key is cleared the same call (same job id) admits the job instead of calling it a
duplicate. A Worker's claim and start: no job popped and leased to nobody; once the key is
cleared, the job runs exactly once."""
from __future__ import annotations

from typing import Any, Callable, Dict

import pytest

from conftest import dump_queue
import emqfast
from emqfast.core.errors import KeyTypeConflict
from emqfast.core.keys import QueueKeys
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
