"""Worker heartbeats (lua/heartbeat.lua, emqfast/facade/workers.py), what the
dashboard's Workers page lists: both Workers write one on their beat; the record is
bounded and expires by itself; stale registry entries are trimmed; bad input is typed
and writes nothing."""
from __future__ import annotations

import asyncio
import os
import socket
import threading

import pytest

import emqfast
import emqfast.aio as emq
from emqfast.core.keys import QueueKeys
from emqfast.facade.workers import QueueWorkers, registry_key, worker_key
from emqfast.worker.calls import beat_call
from conftest import dump_queue
from engine_util import make_queue
from waiting import wait_until, wait_until_async


def test_a_thread_worker_beats_while_it_runs(redis_url, conn, qname):
    q = make_queue(redis_url, qname)
    gate, started = threading.Event(), threading.Event()

    def slow(job):
        started.set()
        gate.wait(20)
    q.enqueue({"n": 1})
    w = emqfast.Worker(q, slow, concurrency=3)
    t = threading.Thread(target=w.run)
    t.start()
    try:
        wait_until(started.is_set, what="the handler to start")
        found = wait_until(lambda: [x for x in QueueWorkers(q).list() if x.in_hand == 1],
                           what="a heartbeat with the job in hand")
        info = found[0]
        assert info.token == w.name and info.host == socket.gethostname()
        assert info.pid == os.getpid() and info.queues == [qname]
        assert info.concurrency == 3 and info.kind == "thread" and info.age_ms < 5000
        ttl = conn.pttl(worker_key(q.keys, w.name))
        assert 0 < ttl <= 3000  # expires by itself ~3 beats after the last one
        assert 0 < conn.pttl(registry_key(q.keys)) <= 3000
    finally:
        gate.set()
        w.stop()
        t.join(30)


def test_an_asyncio_worker_beats_too(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue({"n": 1})
        hold = asyncio.Event()

        async def handler(job):
            await hold.wait()
        w = emq.Worker(q, handler, concurrency=2)
        task = asyncio.create_task(w.run())
        try:
            got = await wait_until_async(
                lambda: QueueWorkers(q).list(), what="an aio heartbeat")
            assert got[0].kind == "asyncio" and got[0].concurrency == 2
        finally:
            hold.set()
            w.stop()
            await task
    asyncio.run(main())


def test_stale_entries_are_trimmed_on_each_beat(conn, qname):
    keys = QueueKeys(qname)
    conn.zadd(registry_key(keys), {"dead-worker": 1})  # a beat of 1970
    conn.hset(keys.meta, "version", emqfast.core.version.KEYSPACE_VERSION)
    q = emqfast.Queue(qname, conn)
    q._drive(_op(beat_call(keys, "alive", 3000, {"host": "h"})))
    assert conn.zrange(registry_key(keys), 0, -1) == [b"alive"]
    assert [w.token for w in QueueWorkers(q).list()] == ["alive"]
    assert conn.hget(worker_key(keys, "alive"), "host") == b"h"


def _op(call):
    return (yield call)


@pytest.mark.parametrize("ttl, fields", [(0, {}), (3_600_001, {}), ("1.5", {}),
                                         (3000, {f"f{i}": i for i in range(17)})])
def test_bad_input_is_typed_and_writes_nothing(conn, qname, ttl, fields):
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 1})
    before = dump_queue(conn, qname)
    call = beat_call(q.keys, "w1", ttl, fields)
    with pytest.raises(emqfast.InvalidInput):
        q._drive(_op(call))
    assert dump_queue(conn, qname) == before


def test_a_full_registry_refuses_a_newcomer_and_writes_nothing(conn, qname):
    keys = QueueKeys(qname)
    q = emqfast.Queue(qname, conn)
    q.enqueue({"n": 1})
    far = 1 << 50  # beats "in the future": none is stale
    pipe = conn.pipeline(transaction=False)
    for start in range(0, 10_000, 1000):
        pipe.zadd(registry_key(keys), {f"w{i}": far for i in range(start, start + 1000)})
    pipe.execute()
    before = dump_queue(conn, qname)
    assert q._drive(_op(beat_call(keys, "newcomer", 3000, {}))) == 0
    assert dump_queue(conn, qname) == before
    assert q._drive(_op(beat_call(keys, "w7", 3000, {}))) > 0  # a known worker still beats
