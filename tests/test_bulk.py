"""Moves across many queues in a few round trips (``emqfast.promote_many``)
and the Batcher transport the worker's acks use (``emqfast.backends.drive.run_calls``)."""
from __future__ import annotations

import importlib

import pytest
import redis

import emqfast
from conftest import dump_queue
from engine_util import server_ms, wait_server_past
from emqfast.core.errors import InvalidInput, RangeError
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.backends.drive import run_calls


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _queues(client, qname, n):
    return [emqfast.Queue(f"{qname}-{i}", client) for i in range(n)]


def test_promote_many_releases_every_queues_due_jobs(client, qname, backend):
    """Due jobs of every queue move to pending in mint order; future ones stay put."""
    queues = _queues(client, qname, 5)
    run_at = server_ms(client) + 200
    due_ids, later_ids = {}, {}
    for i, q in enumerate(queues):
        due_ids[q.name] = [r.id for r in q.enqueue_many(list(range(i + 1)), run_at_ms=run_at)]
        later_ids[q.name] = [r.id for r in q.enqueue_many([0], delay_ms=3_600_000)]
    wait_server_past(client, run_at)
    moved = emqfast.promote_many(client, queues + [queues[0].name + "-empty"])
    assert moved == {**{q.name: i + 1 for i, q in enumerate(queues)},
                     queues[0].name + "-empty": 0}
    for q in queues:
        assert q.job_ids("pending") == due_ids[q.name]
        assert q.job_ids("scheduled") == later_ids[q.name]
        assert all(q.get(j).state == "pending" for j in due_ids[q.name])


def test_promote_many_respects_the_limit_per_queue(client, qname, backend):
    queues = _queues(client, qname, 3)
    run_at = server_ms(client) + 100
    for q in queues:
        q.enqueue_many(list(range(7)), run_at_ms=run_at)
    wait_server_past(client, run_at)
    assert set(emqfast.promote_many(client, queues, limit=3).values()) == {3}
    assert set(emqfast.promote_many(client, queues, limit=3).values()) == {3}
    assert set(emqfast.promote_many(client, queues, limit=3).values()) == {1}
    assert all(q.counts()["pending"] == 7 and q.counts()["scheduled"] == 0 for q in queues)


def test_promote_many_reads_past_one_calls_id_budget_in_later_rounds(client, qname, backend):
    """due_many.lua reads at most 4,000 ids per call: queues whose limit no longer fits
    are left unread and read in the next round, none lost, none twice."""
    queues = _queues(client, qname, 3)
    run_at = server_ms(client) + 2_000
    for q in queues:
        q.enqueue_many(list(range(3_000)), run_at_ms=run_at)
    wait_server_past(client, run_at)
    due_many = load("due_many")
    reply = due_many(client, [k for q in queues for k in (q.keys.delayed, q.keys.meta)],
                     [3_000] * 3)
    assert reply[1:3] == [0, 3_000] and reply[3_003:] == [0, -1, 0, -1]  # the rest unread
    assert emqfast.promote_many(client, queues, limit=3_000) == {q.name: 3_000 for q in queues}
    assert all(q.counts()["pending"] == 3_000 and q.counts()["scheduled"] == 0 for q in queues)


def test_promote_many_equals_queue_promote(client, qname, backend):
    """Same keyspace afterwards as Queue.promote on each queue (byte for byte, bar times)."""
    a, b = emqfast.Queue(qname + "-a", client), emqfast.Queue(qname + "-b", client)
    run_at = server_ms(client) + 100
    for q in (a, b):
        q.enqueue_many([{"n": i} for i in range(20)], priority=3, run_at_ms=run_at,
                       job_ids=[f"JOB-{i}" for i in range(20)])
    wait_server_past(client, run_at)
    assert emqfast.promote_many(client, [a]) == {a.name: 20}
    assert b.promote() == 20
    for job_id in (f"JOB-{i}" for i in range(20)):
        ha, hb = client.hgetall(a.keys.job(job_id)), client.hgetall(b.keys.job(job_id))
        ha.pop(b"created"), hb.pop(b"created")
        assert ha == hb
    assert client.zrange(a.keys.pending, 0, -1, withscores=True) == \
        client.zrange(b.keys.pending, 0, -1, withscores=True)


@pytest.mark.parametrize("bad, error", [
    ({"limit": 0}, RangeError), ({"limit": "10"}, InvalidInput),
    ({"queues": ["ok", "bad{name}"]}, InvalidInput), ({"queues": ["ok", 42]}, InvalidInput),
])
def test_promote_many_bad_input_writes_nothing(client, qname, backend, bad, error):
    q = emqfast.Queue(qname, client)
    run_at = server_ms(client) + 50
    q.enqueue_many([1, 2], run_at_ms=run_at)
    wait_server_past(client, run_at)
    before = dump_queue(client, qname)
    queues = [q.name if x == "ok" else x for x in bad.get("queues", ["ok"])]
    with pytest.raises(error):
        emqfast.promote_many(client, queues, limit=bad.get("limit", 1000))
    assert dump_queue(client, qname) == before


def test_run_calls_groups_by_script_and_keeps_call_order(client, qname, backend):
    """Mixed scripts and KEYS counts come back in call order; Lua errors come back typed."""
    q = emqfast.Queue(qname, client)
    refs = q.enqueue_many(["a", "b"], delay_ms=3_600_000)
    k = q.keys
    due, cancel = load("due"), load("cancel")
    batcher = importlib.import_module("emqfast.backend").batcher_for(client)
    try:
        calls = [
            (due, [k.delayed], [10, 1]),
            (cancel, [k.job(refs[0].id), k.pending, k.delayed, k.meta, k.events, k.cancelled,
                      k.active, k.waiters, k.dependents, k.outbox],
             [refs[0].id, KEYSPACE_VERSION, k.cancel_channel]),
            (due, [k.delayed], [0, 1]),  # limit 0: an EMQINPUT error reply
            (due, [k.delayed], [10, 1]),
        ]
        replies = run_calls(batcher, calls)
    finally:
        batcher.close()
    assert isinstance(replies[0], list) and replies[0][1:] == []  # nothing due yet
    assert replies[1] == 1
    assert isinstance(replies[2], InvalidInput)
    assert replies[3][1:] == []
    assert q.job_ids("scheduled") == [refs[1].id]


def test_worker_acks_through_the_batcher_map_lease_errors(client, qname, backend):
    """An outcome written after the lease was taken over is discarded as LeaseLost (typed),
    and the job's real holder still completes it."""
    q = emqfast.Queue(qname, client, attempts=1)
    q.enqueue("x")
    seen = []

    def handler(job):
        if not seen:
            # steal the lease: expire it and let the reaper hand the job back
            client.zadd(q.keys.active, {job.id: 0})
            assert q.reap(max_stalled=5) == (1, 0)
        seen.append(job.id)

    w = emqfast.Worker(q, handler, concurrency=1, lease_ms=60_000)
    stats = w.run_until_idle(timeout_s=30)
    assert stats.lease_lost == 1 and stats.completed == 1
    assert len(seen) == 2 and q.counts()["completed"] == 1


# --- columns: the bulk-enqueue wire format ------------------------------------------------
ECHO_SRC = b"return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], #KEYS, #ARGV}"
ECHO_SHA = __import__("hashlib").sha1(ECHO_SRC).hexdigest()
ERRS_SRC = (b"if ARGV[1] == 'bad' then return redis.error_reply('EMQRANGE ' .. ARGV[1]) end "
            b"return tonumber(ARGV[1])")
ERRS_SHA = __import__("hashlib").sha1(ERRS_SRC).hexdigest()


def _batcher(client):
    return importlib.import_module("emqfast.backend").batcher_for(client)


def test_evalsha_columns_frames_constants_and_columns(client, qname, backend):
    """Slot = constant prefix + (optionally) the call's column value; a column may feed
    several slots; str values are sent as UTF-8; NOSCRIPT is recovered."""
    client.script_flush()
    b = _batcher(client)
    try:
        slots = [(f"{qname}:", 0), (b"fixed", None), (b"", 0), (b"v=", 1), (7, None)]
        cols = [[b"a", "bb", b""], [b"x" * 3, b"", "\u00e9"]]
        got = b.evalsha_columns(ECHO_SHA, ECHO_SRC, 2, slots, cols)
    finally:
        b.close()
    want = [[f"{qname}:{k}".encode(), b"fixed", k.encode(), b"v=" + v, b"7", 2, 3]
            for k, v in (("a", b"xxx"), ("bb", b""), ("", "\u00e9".encode()))]
    assert got == want


def test_evalsha_columns_many_calls_errors_in_place(client, backend):
    """A large streamed batch: replies in call order, error replies in their slots."""
    n = 60_000 if backend == "c" else 5_000
    vals = [str(i).encode() for i in range(n)]
    vals[7] = vals[n - 1] = b"bad"
    b = _batcher(client)
    try:
        out = b.evalsha_columns(ERRS_SHA, ERRS_SRC, 0, [(b"", 0)], [vals])
    finally:
        b.close()
    assert len(out) == n
    assert isinstance(out[7], redis.ResponseError) and isinstance(out[-1], redis.ResponseError)
    assert [x for i, x in enumerate(out) if i not in (7, n - 1)] == \
        [i for i in range(n) if i not in (7, n - 1)]


def test_evalsha_columns_rejects_malformed_batches(client, backend):
    b = _batcher(client)
    try:
        with pytest.raises(InvalidInput):
            b.evalsha_columns(ECHO_SHA, ECHO_SRC, 0, [(b"", 0)], [[b"a"], [b"b", b"c"]])
        with pytest.raises(InvalidInput):
            b.evalsha_columns(ECHO_SHA, ECHO_SRC, 0, [(b"", 3)], [[b"a"]])
        assert b.evalsha_columns(ECHO_SHA, ECHO_SRC, 0, [(b"", 0)], [[]]) == []
    finally:
        b.close()


def test_enqueue_many_columns_keep_order_ids_and_mixed_encodings(client, qname, backend):
    """Bulk enqueue through columns: every job stored as a single enqueue would store it,
    in list order (arrival counter), bytes and JSON payloads mixed, caller ids kept."""
    q = emqfast.Queue(qname, client)
    payloads = [b"raw\x00", {"n": 1}, "text", b"", [1, 2]] * 40
    job_ids = [f"JOB-{qname}-{i:04d}" for i in range(len(payloads))]
    refs = q.enqueue_many(payloads, job_ids=job_ids, priority=2)
    assert [r.id for r in refs] == job_ids and {r.status for r in refs} == {"pending"}
    assert q.job_ids("pending") == job_ids
    for job_id, payload in zip(job_ids[:5], payloads[:5]):
        assert q.get(job_id).payload == payload
    single = emqfast.Queue(qname + "-one", client)
    single.enqueue({"n": 1}, job_id=job_ids[1], priority=2)
    h1 = client.hgetall(q.keys.job(job_ids[1]))
    h2 = client.hgetall(single.keys.job(job_ids[1]))
    for h in (h1, h2):
        h.pop(b"created"), h.pop(b"ps")
    assert h1 == h2
    again = q.enqueue_many(payloads[:3], job_ids=job_ids[:3])
    assert [r.status for r in again] == ["duplicate"] * 3
