"""The finish hook (lua/includes/finished.lua): a job that ends for good tells its
waiters on its done channel and queues its dependents' release on the outbox, in the same
script that ends it; a queue where nothing waits or depends pays no per-job work."""
from __future__ import annotations

import pytest

from engine_util import claim, complete, complete_many, fail, make_queue
from waiting import wait_until


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


def _subscribed(q, channel):
    sub = q.redis.pubsub()
    sub.subscribe(channel)
    wait_until(lambda: sub.get_message(timeout=0.1) is not None, what="subscribe confirmation")
    return sub


def _message(sub):
    box = []
    wait_until(lambda: box.append(sub.get_message(timeout=0.1)) or box[-1] is not None,
               what="a done message")
    return box[-1]


def test_completion_tells_its_waiters_and_queues_its_dependents(q):
    a, b, c = (q.enqueue({"n": i}).id for i in range(3))
    k = q.keys
    q.redis.hset(k.waiters, a, 2)
    q.redis.hset(k.dependents, b, 1)
    sub = _subscribed(q, k.done_channel(a))
    pairs = claim(q, "w", 30_000, n=3)
    complete_many(q, [(j, t, b'"r"') for j, t in pairs])
    msg = _message(sub)
    assert (msg["channel"], msg["data"]) == (k.done_channel(a).encode(), b"completed")
    assert q.redis.lrange(k.outbox, 0, -1) == [b"completed\0" + b.encode()]
    # told once: the counts are taken, a re-sent ack tells nobody again
    assert q.redis.hlen(k.waiters) == 0 and q.redis.hlen(k.dependents) == 0
    complete(q, a, dict(pairs)[a], b'"r"')
    assert q.redis.llen(k.outbox) == 1
    sub.close()


def test_a_final_failure_is_told_but_a_retry_is_not(q):
    k = q.keys
    retried, final = q.enqueue("x").id, q.enqueue("y").id
    q.redis.hset(k.waiters, mapping={retried: 1, final: 1})
    q.redis.hset(k.dependents, mapping={retried: 1, final: 1})
    sub = _subscribed(q, k.done_channel(final))
    tokens = dict(claim(q, "w", 30_000, n=2))
    fail(q, retried, tokens[retried], delay=60_000)  # will run again: not an end
    fail(q, final, tokens[final], delay=-1)
    assert _message(sub)["data"] == b"failed"
    assert q.redis.lrange(k.outbox, 0, -1) == [b"failed\0" + final.encode()]
    assert q.redis.hkeys(k.waiters) == [retried.encode()]
    sub.close()


def test_plain_jobs_leave_no_trace_of_the_hook(q):
    ref = q.enqueue("plain")
    (job_id, token), = claim(q, "w", 30_000)
    complete(q, job_id, token)
    k = q.keys
    assert not q.redis.exists(k.waiters, k.dependents, k.outbox)
    assert q.get(ref.id).state == "completed"
