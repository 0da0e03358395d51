"""One worker, many queues on a real Redis Cluster: the queues' slots on
different masters, each member blocking on its own queue's marker there."""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import List

import pytest
import redis

import emqfast
import emqfast.aio as emq
from cluster_util import names_over_masters, start_cluster
from engine_util import running_worker
from waiting import wait_until, wait_until_async


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def test_thread_worker_serves_queues_on_every_master_in_strict_order(cluster, qname):
    names = names_over_masters(cluster, 1, qname)  # one queue per master: three slots
    conn = emqfast.connect(cluster.url)
    assert isinstance(conn, redis.RedisCluster)
    qs = [emqfast.Queue(n, conn) for n in names]
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 10)
    seen: List[int] = []
    w = emqfast.Worker(qs, lambda job: seen.append(job.payload["q"]), concurrency=1)
    assert w.run_until_idle(timeout_s=60).completed == 30
    assert seen == [0] * 10 + [1] * 10 + [2] * 10
    with running_worker(w):  # idle: blocked on three markers on three masters
        qs[2].enqueue({"q": 2})
        wait_until(lambda: len(seen) == 31, timeout=10, interval=0.02,
                   what="the last master's queue wakes the worker")
        qs[1].enqueue({"q": 1})
        wait_until(lambda: len(seen) == 32, timeout=10, interval=0.02,
                   what="the middle master's queue wakes the worker")
    assert seen[30:] == [2, 1]
    assert all(q.counts()["pending"] == 0 for q in qs)
    conn.close()


def test_aio_worker_on_every_master(cluster, qname):
    names = names_over_masters(cluster, 1, qname)

    async def main():
        client = emq.connect(cluster.url)
        qs = [emq.Queue(n, client) for n in names]
        seen: List[int] = []

        async def handler(job):
            seen.append(job.payload["q"])
        w = emq.Worker(qs, handler, order="weighted", weights=[1, 2, 3])
        task = asyncio.ensure_future(w.run())
        for i, q in enumerate(qs):
            await q.enqueue_many([{"q": i}] * 5)

        async def all_ran():
            return Counter(seen) == {0: 5, 1: 5, 2: 5}
        await wait_until_async(all_ran, 15, "every master's jobs run")
        w.stop()
        assert (await task).completed == 15
        await client.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))
