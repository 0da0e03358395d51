"""Every read has a deadline: a connection gone silent (half-open: no FIN, no RST; new
connections work at once) fails the call in flight with a typed error, the connection is
dropped, and the next call dials a new one and succeeds. The C batcher, its pure twin,
WAIT (a blocking read: its block time plus a margin) and a plain Queue on a connect()'d
client, all through tests/fault_proxy.py."""
from __future__ import annotations

import hashlib
import importlib
import time
from typing import Any, Iterator

import pytest
import redis

import emqfast
from conftest import require_native
from emqfast.backends import pure_batcher
from emqfast.core import deadlines
from emqfast.core.errors import ConnectionFailed, PartialBatch, ReplyLost
from fault_proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)
backend_mod = importlib.import_module("emqfast.backend")

SCRIPT = b"return redis.call('INCR', KEYS[1])"
SHA = hashlib.sha1(SCRIPT).hexdigest()


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with FaultProxy(upstream_port=port, seed=31) as p:
        yield p


def _native_batcher(client: Any) -> Any:
    require_native()
    from emqfast.backends.native_batcher import Batcher
    return Batcher.from_redis(client)


def _batchers(kind: str, url: str) -> Any:
    """A Batcher of ``kind`` on ``url``, from a client that sets no timeout of its own."""
    if kind == "c":  # redis-py's own default socket timeout, which the C side never saw
        return _native_batcher(redis.Redis.from_url(url))
    # a client whose reads would wait for ever: the exchange still holds them to a deadline
    return pure_batcher.Batcher(redis.Redis.from_url(url, socket_timeout=None))


def _through_a_half_open_blip(proxy: FaultProxy, call: Any) -> BaseException:
    """``call()`` once on a live connection, then through a half-open blip: the typed error
    it raised (the next call dials anew and succeeds, which is checked here)."""
    assert call() == [1]
    assert proxy.half_open() >= 1
    with pytest.raises(ConnectionFailed) as failed:
        call()  # swallowed on its way: it never reached Redis, and is never re-sent
    assert call() == [2]
    return failed.value


@pytest.mark.parametrize("kind", ["c", "python"])
def test_a_half_open_connection_fails_the_batch_within_its_deadline(kind, proxy, r):
    key = f"deadline:{kind}:{time.time_ns()}"
    batcher = _batchers(kind, proxy.url())
    try:
        err = _through_a_half_open_blip(
            proxy, lambda: batcher.evalsha_many(SHA, SCRIPT, 1, [[key]]))
    finally:
        batcher.close()
    assert isinstance(err, ReplyLost)  # it was written: for all the client knows, it ran
    assert int(r.get(key)) == 2


@pytest.mark.parametrize("kind", ["c", "python"])
def test_wait_gets_its_block_time_not_the_plain_deadline(kind, proxy, r):
    """WAIT for a replica that does not exist blocks its whole timeout, longer than the
    client's 0.5 s socket timeout: answered, not a lost reply (the connection is kept)."""
    key = f"deadline-wait:{kind}:{time.time_ns()}"
    if kind == "c":
        batcher = _native_batcher(redis.Redis.from_url(proxy.url(), socket_timeout=0.5))
    else:
        batcher = pure_batcher.Batcher(redis.Redis.from_url(proxy.url(), socket_timeout=0.5))
    try:
        got = batcher.evalsha_many(SHA, SCRIPT, 1, [[key]], wait=(1, 1200))
        assert batcher.evalsha_many(SHA, SCRIPT, 1, [[key]]) == [2]
    finally:
        batcher.close()
    assert got == [1, 0]  # the write's reply, then WAIT's: no replica acknowledged
    assert proxy.stats["accepted"] == 1  # one connection: WAIT's reply was not given up on


def test_a_connect_client_has_deadlines_and_keepalive(redis_url):
    client = emqfast.connect(redis_url)
    kw = client.connection_pool.connection_kwargs
    assert kw["socket_timeout"] == deadlines.READ_TIMEOUT_S
    assert kw["socket_connect_timeout"] == deadlines.CONNECT_TIMEOUT_S
    assert kw["socket_keepalive"] is True and kw["socket_keepalive_options"]
    assert kw["health_check_interval"] == deadlines.HEALTH_CHECK_S
    mine = emqfast.connect(redis_url + "?socket_timeout=2", socket_keepalive=False)
    kw = mine.connection_pool.connection_kwargs
    assert kw["socket_timeout"] == 2 and kw["socket_keepalive"] is False  # the caller's win
    client.close()
    mine.close()


def test_a_queue_on_a_connect_client_survives_a_half_open_blip(backend, proxy, qname,
                                                               redis_url):
    """A plain enqueue and a bulk one (the C batcher's own connection under C) on a
    connect()'d client with its default settings."""
    q = emqfast.Queue(qname, emqfast.connect(proxy.url()))
    for send in (lambda: q.enqueue({"n": 1}), lambda: q.enqueue_many([{"n": 2}] * 3)):
        send()  # a live connection
        assert proxy.half_open() >= 1
        with pytest.raises((ConnectionFailed, PartialBatch)):
            send()  # the silent connection's call: typed, after its deadline
        send()  # a new connection
    assert emqfast.Queue(qname, redis_url).counts()["pending"] == 8  # (not the proxy's)


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_a_wait_outlives_a_half_open_pubsub_connection(facade, proxy, redis_url, qname, r,
                                                       monkeypatch):
    """The job ends while the wait's pub/sub connection is silent (its message is
    swallowed): the quiet connection is PINGed, found dead past its deadline, re-opened,
    and the wait re-reads its job instead of waiting out its timeout."""
    import threading

    import emqfast.aio as emq
    from emqfast.facade import wait_reader
    from test_wait_result import registered
    from waiting import wait_until

    monkeypatch.setattr(wait_reader, "QUIET_S", 0.3)
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"blip": 1})
    got: list = []

    def wait() -> None:
        try:
            if facade == "sync":
                mine = emqfast.Queue(qname, emqfast.connect(proxy.url(), socket_timeout=1))
                got.append(mine.ref(ref.id).wait(timeout_s=40))
                return

            async def main() -> Any:
                mine = emq.Queue(qname, emq.connect(proxy.url(), socket_timeout=1))
                return await mine.ref(ref.id).wait(timeout_s=40)
            got.append(asyncio.run(main()))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            got.append(exc)
    import asyncio
    waiting_thread = threading.Thread(target=wait, daemon=True)
    waiting_thread.start()
    wait_until(lambda: registered(r, q, [ref.id]), 20, "the wait registered")
    assert proxy.half_open() >= 1  # its pub/sub connection (and its idle pool ones) go silent
    emqfast.Worker(q, lambda job: job.payload).run_until_idle(timeout_s=20)
    waiting_thread.join(30)
    assert got == [{"blip": 1}]
