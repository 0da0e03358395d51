"""Group commit on Redis Cluster: queues on every master, many threads (and tasks)
enqueueing into all of them at once. Each queue's jobs gather per queue (one slot, so
one master), each job lands once in its own queue."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict, List

import pytest
import redis
from redis.crc import key_slot

import emqfast
import emqfast.aio as emq
from cluster_util import names_over_masters, start_cluster
from waiting import wait_until


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def _landed(cluster: Any, names: List[str], refs: Dict[str, List[Any]]) -> None:
    for name in names:
        slot = key_slot(f"emq:{{{name}}}:meta".encode())
        with redis.Redis(port=cluster.owner_port(slot)) as node:
            pending = node.zrange(f"emq:{{{name}}}:pending", 0, -1)
        assert sorted(pending) == sorted(ref.id.encode() for ref in refs[name]), name


def test_threads_over_queues_on_every_master(backend, cluster, qname):
    names = names_over_masters(cluster, 2, qname)
    client = emqfast.connect(cluster.url)
    queues = [emqfast.Queue(name, client) for name in names]
    refs: Dict[str, List[Any]] = {name: [] for name in names}
    lock = threading.Lock()
    errors: List[BaseException] = []

    def producer(t: int) -> None:
        try:
            for i in range(30):
                q = queues[(t + i) % len(queues)]
                ref = q.enqueue({"t": t, "i": i})
                with lock:
                    refs[q.name].append(ref)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(12)]
    for t in threads:
        t.start()
    wait_until(lambda: not any(t.is_alive() for t in threads), 60, "the producers")
    assert not errors, errors
    all_refs = [ref for batch in refs.values() for ref in batch]
    assert len(all_refs) == 12 * 30 and len({ref.id for ref in all_refs}) == 12 * 30
    assert {ref.status for ref in all_refs} == {"pending"}
    _landed(cluster, names, refs)
    client.close()


def test_tasks_over_queues_on_every_master(cluster, qname):
    names = names_over_masters(cluster, 1, qname)

    async def main() -> Dict[str, List[Any]]:
        client = emq.connect(cluster.url)
        queues = [emq.Queue(name, client) for name in names]
        refs: Dict[str, List[Any]] = {name: [] for name in names}

        async def producer(t: int) -> None:
            for i in range(10):
                q = queues[(t + i) % len(queues)]
                refs[q.name].append(await q.enqueue({"t": t, "i": i}))
        await asyncio.wait_for(asyncio.gather(*(producer(t) for t in range(60))), 60)
        await client.aclose()
        return refs

    refs = asyncio.run(main())
    all_refs = [ref for batch in refs.values() for ref in batch]
    assert len({ref.id for ref in all_refs}) == 600
    assert {ref.status for ref in all_refs} == {"pending"}
    _landed(cluster, names, refs)


def test_a_shared_call_on_a_queues_master(backend, cluster, qname):
    """Jobs queued behind a call held in flight on their queue's master leave as one call
    there; a queue on another master is not held up by it."""
    from emqfast.backends import gather

    held, free = names_over_masters(cluster, 1, qname)[:2]
    client = emqfast.connect(cluster.url)
    q, other = emqfast.Queue(held, client), emqfast.Queue(free, client)
    for each in (q, other):
        each.enqueue("warm")
        each.enqueue_many(["warm"])
    master = redis.Redis(port=cluster.owner_port(key_slot(f"emq:{{{held}}}:meta".encode())))
    calls = lambda: int(master.info("commandstats")["cmdstat_evalsha"]["calls"])  # noqa: E731
    before = calls()
    out: List[Any] = [None] * 9

    def enqueue(i: int) -> None:
        out[i] = q.enqueue({"i": i})

    gate = lambda: gather._registry.get(client, {}).get(q._gather_key)  # noqa: E731
    master.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    try:
        first = threading.Thread(target=enqueue, args=(0,), daemon=True)
        first.start()
        wait_until(lambda: gate() is not None and gate().busy, what="the first call")
        rest = [threading.Thread(target=enqueue, args=(i,), daemon=True) for i in range(1, 9)]
        for t in rest:
            t.start()
        wait_until(lambda: len(gate().queue) == 8, what="eight queued")
        assert other.enqueue("elsewhere").status == "pending"  # its master is not paused
    finally:
        master.execute_command("CLIENT", "UNPAUSE")
    for t in [first, *rest]:
        t.join(30)
    assert [ref.status for ref in out] == ["pending"] * 9
    assert calls() - before == 2
    assert master.zcard(q.keys.pending) == 2 + 9
    client.close()
