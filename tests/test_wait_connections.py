"""Waits are O(1) in connections: 1,000 threads (or asyncio tasks) each calling
``ref.wait()`` on one ``emqfast.connect()`` client all get their results, and the server
sees a handful of that client's connections, not one per wait (redis-py's pool holds 100).
A pool too small for even that is a typed PoolExhausted naming its size, not a
ConnectionFailed to be retried."""
from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any, Dict, List

import pytest
import redis

import emqfast
import emqfast.aio as emq
from emqfast.core.errors import PoolExhausted
from test_wait_result import registered
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)
N = 1000
MOST = 10  # connections one client may show: pub/sub, the wait lanes, the enqueue


def _echo(job: emqfast.Job) -> Any:
    return job.payload


def _connections(r: redis.Redis, name: str) -> int:
    """How many connections the server has from clients named ``name``."""
    return sum(1 for c in r.client_list() if c.get("name") == name)


def test_a_thousand_threads_wait_on_one_client(redis_url, qname, r):
    name = "waits-" + uuid.uuid4().hex[:8]
    q = emqfast.Queue(qname, emqfast.connect(redis_url, client_name=name))
    refs = q.enqueue_many([{"i": i} for i in range(N)])
    results: Dict[str, Any] = {}
    errors: List[BaseException] = []

    def wait(ref: emqfast.JobRef) -> None:
        try:
            results[ref.id] = ref.wait(timeout_s=120)
        except BaseException as exc:  # noqa: BLE001 - every failure is counted
            errors.append(exc)
    threads = [threading.Thread(target=wait, args=(ref,), daemon=True) for ref in refs]
    for t in threads:
        t.start()
    ids = [ref.id for ref in refs]
    wait_until(lambda: errors or registered(r, q, ids), 120, "every wait registered")
    assert errors == []
    assert _connections(r, name) <= MOST  # every wait is in, holding no connection of its own
    emqfast.Worker(emqfast.Queue(qname, redis_url), _echo).run_until_idle(timeout_s=120)
    for t in threads:
        t.join(120)
    assert errors == []
    assert results == {ref.id: {"i": i} for i, ref in enumerate(refs)}
    assert _connections(r, name) <= MOST


def test_a_thousand_tasks_wait_on_one_client(redis_url, qname, r):
    name = "waits-" + uuid.uuid4().hex[:8]

    async def main() -> List[Any]:
        q = emq.Queue(qname, emq.connect(redis_url, client_name=name))
        refs = await q.enqueue_many([{"i": i} for i in range(N)])
        tasks = [asyncio.ensure_future(ref.wait(timeout_s=120)) for ref in refs]
        ids = [ref.id for ref in refs]
        while not registered(r, q, ids):  # (a blocking check: the tasks run between them)
            done = [t for t in tasks if t.done()]
            assert not done, done[0].exception()
            await asyncio.sleep(0.02)
        assert _connections(r, name) <= MOST
        worker = threading.Thread(target=lambda: emqfast.Worker(
            emqfast.Queue(qname, redis_url), _echo).run_until_idle(timeout_s=120))
        worker.start()
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            worker.join(120)
    results = asyncio.run(asyncio.wait_for(main(), 150))
    assert results == [{"i": i} for i in range(N)]
    assert _connections(r, name) <= MOST


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_a_pool_too_small_for_a_wait_is_typed_and_names_its_size(redis_url, qname, facade):
    """One connection in the pool: the wait's pub/sub connection takes it, so its register
    script finds the pool full."""
    if facade == "sync":
        q = emqfast.Queue(qname, emqfast.connect(redis_url, max_connections=1))
        ref = q.enqueue({"x": 1})
        with pytest.raises(PoolExhausted, match="all 1 of its connections"):
            ref.wait(timeout_s=10)
        return

    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url, max_connections=1))
        ref = await q.enqueue({"x": 1})
        with pytest.raises(PoolExhausted, match="all 1 of its connections"):
            await ref.wait(timeout_s=10)
    asyncio.run(main())


def test_a_full_pool_is_not_a_connection_failure():
    exc = redis.exceptions.MaxConnectionsError("Too many connections")
    typed = emqfast.errors.translate(exc)
    assert isinstance(typed, PoolExhausted) and not isinstance(typed, ConnectionError)
    assert not emqfast.errors.is_transient(exc)  # Workers stop on it, naming it
    assert "MaxConnectionsError" in str(typed)
