"""The single-enqueue path: one ``q.enqueue`` goes through the Batcher (the
calling thread's hiredis connection under C), with the queue's default options encoded
once and the id head cached per millisecond. What users rely on stays the same under
both backends: the job is written exactly as before, defaults changed after the first
enqueue take effect, clients built with ``decode_responses=True`` work, and ids minted
from many threads stay unique."""
from __future__ import annotations

import json
import threading

import redis

import emqfast
from emqfast.core import ids


def test_a_single_enqueue_is_written_as_the_script_says(backend, redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    ref = q.enqueue({"lesson": 3})
    assert ref.status == "pending"
    raw = q.redis.hgetall(q.keys.job(ref.id))
    assert json.loads(raw[b"payload"]) == {"lesson": 3}
    assert set(raw) >= {b"payload", b"ps", b"created"} and b"opts" not in raw  # defaults
    assert q.redis.zscore(q.keys.pending, ref.id) is not None
    assert q.enqueue({"lesson": 3}, job_id=ref.id).status == "duplicate"
    assert q.enqueue(b"raw", delay_ms=60_000).status == "scheduled"


def test_changed_queue_defaults_apply_to_the_next_enqueue(backend, redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    first = q.enqueue({"n": 1})
    q.default_attempts = 7  # after the defaults were encoded once
    second = q.enqueue({"n": 2})
    q.default_backoff = emqfast.Backoff.fixed(250)
    third = q.enqueue({"n": 3})
    assert q.get(first.id).max_attempts == emqfast.Queue(qname, q.redis).default_attempts
    assert q.get(second.id).max_attempts == 7
    assert q.get(third.id).max_attempts == 7
    assert q.get(third.id).backoff == emqfast.Backoff.fixed(250)


def test_enqueue_with_a_decoding_client(backend, redis_url, qname):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = emqfast.Queue(qname, client)
    ref = q.enqueue({"x": 1})
    assert ref.status == "pending" and q.get(ref.id).payload == {"x": 1}
    assert client.zscore(q.keys.pending, ref.id) is not None
    client.close()


def test_bad_input_on_the_single_path_writes_nothing(backend, redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    for bad in ({"priority": True}, {"priority": -1}, {"attempts": 0}, {"delay_ms": -5}):
        try:
            q.enqueue({"x": 1}, **bad)
        except emqfast.errors.InvalidInput:
            pass
        else:
            raise AssertionError(f"{bad} was accepted")
    assert q.redis.keys(f"emq:{{{qname}}}:*") == []


def test_ids_minted_from_many_threads_are_unique_and_ordered_per_thread():
    per_thread = {}

    def mint(t: int) -> None:
        per_thread[t] = [ids.new_id() for _ in range(20_000)]
    threads = [threading.Thread(target=mint, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for got in per_thread.values() for i in got]
    assert len(set(every)) == len(every) == 160_000
    for got in per_thread.values():
        assert got == sorted(got)  # one thread's ids sort in mint order
        assert all(len(i) == ids.ID_LENGTH and i.startswith("JOB") for i in got)
