"""A Cluster client's own failures are typed, never redis-py's internals:

- ``emqfast.connect("redis+cluster://<unreachable node>")`` is ``ConnectionFailed`` (sync:
  at connect, as the client reads its slot map there; asyncio: at the first call), as a
  single server's URL is;
- redis.asyncio's ``RedisCluster`` closes every node connection when its own command path
  meets CLUSTERDOWN (a failover), those emqfast is using included. Calls caught by that
  close raise typed errors (``ConnectionFailed``/``ReplyLost``/``ServerBusy``), never
  ``AttributeError: 'NoneType' object has no attribute ...``; the test closes the client
  under a stream of calls the way redis-py does.
"""
from __future__ import annotations

import asyncio
import socket
from collections import Counter

import pytest

import emqfast
import emqfast.aio
from emqfast.core.errors import ConnectionFailed, EmqError

from cluster_util import start_cluster


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis+cluster://127.0.0.1:{port}/0"


def test_an_unreachable_cluster_node_is_connection_failed(qname):
    url = _dead_url()
    with pytest.raises(ConnectionFailed):
        emqfast.Queue(qname, emqfast.connect(url)).enqueue("x")

    async def main() -> None:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(url))
        await q.enqueue("x")
    with pytest.raises(ConnectionFailed):
        asyncio.run(main())


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def test_calls_caught_by_the_clients_own_close_raise_typed_errors(cluster, qname):
    seen: Counter = Counter()
    untyped: list = []

    async def main() -> None:
        client = emqfast.aio.connect(cluster.url)
        q = emqfast.aio.Queue(qname, client)
        closing = asyncio.Event()

        async def calls(n: int) -> None:
            for i in range(150):
                try:
                    if i % 3 == 0:
                        await q.enqueue_many([i] * 20)
                    elif i % 3 == 1:
                        await q.enqueue(i)
                    else:
                        await q.counts()
                    seen["ok"] += 1
                except EmqError as exc:
                    seen[type(exc).__name__] += 1
                except Exception as exc:  # noqa: BLE001 - what this test looks for
                    untyped.append(repr(exc))
                if closing.is_set() and seen["ok"] > 50 and len(untyped) > 5:
                    return

        async def closer() -> None:
            for _ in range(60):  # what redis-py's RedisCluster does on CLUSTERDOWN
                await asyncio.sleep(0.005)
                closing.set()
                await client.aclose()
        await asyncio.gather(closer(), *(calls(n) for n in range(8)))
        await client.aclose()
    asyncio.run(main())
    assert not untyped, (untyped[:5], dict(seen))
    assert seen["ok"] > 0, dict(seen)
