"""emqfast.aio on Redis Cluster: redis+cluster:// gives redis.asyncio.RedisCluster, and the
shared operations (scripts, pipelines, SCAN, the WATCH transaction) work on every master."""
from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aredis

import emqfast.aio as emq
from cluster_util import names_over_masters, start_cluster
from waiting import wait_until_async


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def test_aio_facade_on_every_master(cluster, qname):
    names = names_over_masters(cluster, 1, qname)

    async def main():
        client = emq.connect(cluster.url)
        assert isinstance(client, aredis.RedisCluster)
        out = {}
        try:
            for name in names:
                q = emq.Queue(name, client)
                first = await q.enqueue({"q": name}, priority=1)
                refs = await q.enqueue_many([1, 2, 3])
                late = await q.enqueue_in("due", 20)
                assert (await q.enqueue({"q": name}, job_id=first.id)).duplicate
                run_at = (await q.get(late.id)).run_at_ms

                async def due(q=q, run_at=run_at) -> bool:
                    return await q.server_time_ms() > run_at
                await wait_until_async(due, 15, "the server clock to pass the late job's run_at")
                assert await emq.promote_many(client, [q]) == {name: 1}
                assert (await q.job_ids("pending"))[:3] == [r.id for r in refs]

                async def handler(job):
                    return job.payload
                stats = await emq.Worker(q, handler, concurrency=4).run_until_idle(timeout_s=30)
                board = emq.Leaderboard(client, name)
                await board.set_many({"a": 3, "b": 2, "c": 1})
                out[name] = (stats.completed, (await q.get(first.id)).result,
                             [e.member for e in await board.around("b", 1)],
                             await q.obliterate() > 0)
        finally:
            await client.aclose()
        return out

    out = asyncio.run(asyncio.wait_for(main(), 120))
    assert out == {name: (5, {"q": name}, ["a", "b", "c"], True) for name in names}
