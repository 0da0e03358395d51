"""Compact job hashes: fields holding their defaults are not stored.

A job whose options equal the library defaults has no ``opts``, a JSON payload no
``enc``, a job never started no ``attempts``; every reader supplies them. Hashes in
the older full form (always all three) read exactly the same.
"""
from __future__ import annotations

from typing import Any, Dict, List

import pytest

import emqfast
from emqfast import Backoff, Queue, Worker
from emqfast.facade import options
from emqfast.facade.options import DEFAULT_BACKOFF
from emqfast.facade.schedules import occurrence_job_id
from engine_util import server_ms

# a waiting job has no state (its set says it) and a parked one no run_at (its score has it)
COMPACT_WAITING = {b"payload", b"ps", b"created"}
LEGACY_OPTS = b'{"a":3,"p":0,"b":[1,1000,60000,0.0,0]}'  # what every job stored before


def fields(r, q: Queue, job_id: str) -> Dict[bytes, bytes]:
    return r.hgetall(q.keys.job(job_id))


def as_read(job: emqfast.Job) -> tuple:
    """What a reader derives from a hash (everything but identity and timestamps)."""
    return (job.state, job.payload, job.attempts, job.max_attempts, job.priority, job.backoff,
            job.extra)


def test_the_default_options_are_the_librarys():
    assert options.DEFAULT_OPTIONS == {"a": 3, "p": 0, "b": DEFAULT_BACKOFF.to_json()}
    assert options.encode(3, 0, DEFAULT_BACKOFF) == b""
    assert options.decode(None) == options.decode(b"") == options.decode(LEGACY_OPTS) \
        == (3, 0, DEFAULT_BACKOFF, {})
    assert options.encode(3, 1, DEFAULT_BACKOFF) == b'{"a":3,"p":1,"b":[1,1000,60000,0.0,0]}'
    assert options.encode(3, 0, DEFAULT_BACKOFF, {"g": "x"}) != b""


def test_default_jobs_store_no_opts_enc_or_attempts_and_read_back(r, qname, backend):
    q = Queue(qname, r)
    one = q.enqueue({"n": 1})
    many = q.enqueue_many([{"n": i} for i in range(3)])  # the columnar (C-framed) path
    later = q.enqueue_in({"n": "later"}, 3_600_000)
    for ref in [one, *many]:
        assert set(fields(r, q, ref.id)) == COMPACT_WAITING
    assert set(fields(r, q, later.id)) == COMPACT_WAITING
    assert later.status == "scheduled"
    assert [q.get(ref.id).state for ref in (one, later)] == ["pending", "scheduled"]
    parked = q.get(later.id).run_at_ms  # read back from the delayed score, to the ms
    assert parked == q.get(later.id).created_ms + 3_600_000
    for ref, payload in [(one, {"n": 1}), *zip(many, [{"n": i} for i in range(3)]),
                         (later, {"n": "later"})]:
        job = q.get(ref.id)
        assert (job.payload, job.attempts, job.max_attempts, job.priority, job.backoff,
                job.extra) == (payload, 0, 3, 0, DEFAULT_BACKOFF, {})


def test_non_default_jobs_keep_their_fields(r, qname, backend):
    q = Queue(qname, r)
    raw = q.enqueue(b"\x00raw")
    tuned = q.enqueue({"x": 1}, attempts=5, priority=7, backoff=Backoff.fixed(250))
    grouped = q.enqueue({"x": 2}, group="tenant-a")
    mixed = q.enqueue_many([b"bytes", {"json": True}])  # an 'enc' column: one of each
    assert fields(r, q, raw.id)[b"enc"] == b"b" and b"opts" not in fields(r, q, raw.id)
    assert q.get(raw.id).payload == b"\x00raw"
    job = q.get(tuned.id)
    assert (job.max_attempts, job.priority, job.backoff) == (5, 7, Backoff.fixed(250))
    assert b"opts" in fields(r, q, tuned.id) and b"enc" not in fields(r, q, tuned.id)
    assert q.get(grouped.id).extra == {"g": "tenant-a"}
    assert fields(r, q, mixed[0].id)[b"enc"] == b"b" and b"enc" not in fields(r, q, mixed[1].id)
    assert [q.get(m.id).payload for m in mixed] == [b"bytes", {"json": True}]
    # a queue's own defaults are not the library's: they are stored with each job
    strict = Queue(qname, r, attempts=1, backoff=Backoff.fixed(10))
    ref = strict.enqueue({"x": 3})
    assert b"opts" in fields(r, q, ref.id)
    assert (q.get(ref.id).max_attempts, q.get(ref.id).backoff) == (1, Backoff.fixed(10))


def test_a_missing_opts_means_the_library_defaults_not_the_readers_queue(r, qname):
    ref = Queue(qname, r).enqueue({})
    other = Queue(qname, r, attempts=9, backoff=Backoff.fixed(5))
    job = other.get(ref.id)
    assert (job.max_attempts, job.backoff) == (3, DEFAULT_BACKOFF)


def _legacy_job(r, q: Queue, job_id: str, payload: bytes) -> None:
    """A pending job exactly as enqueue.lua wrote it before compact hashes."""
    now = server_ms(r)
    ps = 1 << 20  # priority 0, a counter value far from the queue's own
    r.hset(q.keys.job(job_id), mapping={"state": "pending", "payload": payload, "enc": "j",
                                        "opts": LEGACY_OPTS, "ps": ps, "created": now,
                                        "attempts": "0"})
    r.zadd(q.keys.pending, {job_id: ps})


def test_old_full_form_hash_reads_the_same_as_a_compact_one(r, qname, backend):
    q = Queue(qname, r)
    new = q.enqueue({"k": "v"})
    _legacy_job(r, q, "JOBlegacy", b'{"k":"v"}')
    assert as_read(q.get("JOBlegacy")) == as_read(q.get(new.id))
    assert len(fields(r, q, "JOBlegacy")) > len(fields(r, q, new.id))
    # and the running job a Worker builds from start.lua's row (nil for absent fields)
    seen: Dict[str, tuple] = {}

    def handler(job: emqfast.Job) -> Any:
        seen[job.id] = as_read(job)[1:]
        return None

    Worker(q, handler, concurrency=2).run_until_idle(timeout_s=30)
    assert seen == {new.id: ({"k": "v"}, 1, 3, 0, DEFAULT_BACKOFF, {}),
                    "JOBlegacy": ({"k": "v"}, 1, 3, 0, DEFAULT_BACKOFF, {})}
    assert q.get(new.id).attempts == 1 and q.get(new.id).state == "completed"


def test_a_default_job_retries_with_the_default_attempts_and_backoff(r, qname, backend):
    q = Queue(qname, r)
    ref = q.enqueue({"fail": True})
    attempts: List[int] = []

    def handler(job: emqfast.Job) -> Any:
        attempts.append(job.attempts)
        raise RuntimeError("first run fails")

    Worker(q, handler).run_until_idle(timeout_s=30)  # the retry waits on the delayed set
    job = q.get(ref.id)
    assert attempts == [1] and (job.state, job.attempts) == ("scheduled", 1)
    retrying = [f for _, f in r.xrange(q.keys.events)
                if f[b"event"] == b"retrying" and f[b"id"] == ref.id.encode()]
    assert [f[b"delay"] for f in retrying] == [str(DEFAULT_BACKOFF.delay_ms(1)).encode()]


def test_schedules_with_default_options_mint_compact_jobs(r, qname, backend):
    q = Queue(qname, r)
    start = server_ms(r) - 30
    plain = q.schedules.upsert("plain", every_ms=60_000, start_at_ms=start, payload={"p": 1})
    tuned = q.schedules.upsert("tuned", every_ms=60_000, start_at_ms=start, attempts=2)
    assert (plain.attempts, plain.backoff, plain.priority) == (3, DEFAULT_BACKOFF, 0)
    assert (tuned.attempts, tuned.backoff) == (2, DEFAULT_BACKOFF)
    assert q.schedules.pump() == 2
    plain_id, tuned_id = occurrence_job_id("plain", start), occurrence_job_id("tuned", start)
    assert b"opts" not in fields(r, q, plain_id) and b"enc" not in fields(r, q, plain_id)
    assert b"opts" in fields(r, q, tuned_id)
    assert (q.get(plain_id).payload, q.get(plain_id).max_attempts) == ({"p": 1}, 3)
    assert q.get(tuned_id).max_attempts == 2
    # a record written before compact hashes (full opts) reads the same
    assert r.hget(q.keys.schedule("plain"), "opts") == b""
    r.hset(q.keys.schedule("plain"), "opts", LEGACY_OPTS)
    legacy = q.schedules.get("plain")
    assert (legacy.attempts, legacy.backoff, legacy.priority) == (3, DEFAULT_BACKOFF, 0)


def test_a_waiting_jobs_state_is_the_set_holding_it(r, qname, backend):
    """Waiting jobs store no state and parked ones no run-at; readers derive both, and
    promote stamps the run-at on release so the wait is measured from when it was due."""
    from engine_util import wait_server_past

    q = Queue(qname, r)
    ref = q.enqueue_in({"n": 1}, 200)
    parked = q.get(ref.id)
    assert (parked.state, b"state" in fields(r, q, ref.id)) == ("scheduled", False)
    assert b"run_at" not in fields(r, q, ref.id)
    wait_server_past(r, parked.run_at_ms)
    assert q.promote() == 1
    assert int(fields(r, q, ref.id)[b"run_at"]) == parked.run_at_ms
    released = q.get(ref.id)
    assert (released.state, released.run_at_ms) == ("pending", parked.run_at_ms)
    # a hash still naming its waiting state (written before this layout) reads the same
    r.hset(q.keys.job(ref.id), "state", "scheduled")
    assert q.get(ref.id).state == "pending"
    r.hdel(q.keys.job(ref.id), "state")
    w = emqfast.Worker(q, lambda job: (_ for _ in ()).throw(RuntimeError("again")),
                       keep_completed=10)
    w.run_until_idle(timeout_s=10, wait_scheduled=False)
    retrying = q.get(ref.id)  # re-parked for its retry after the default backoff
    assert (retrying.state, retrying.attempts) == ("scheduled", 1)
    assert b"state" not in fields(r, q, ref.id)
