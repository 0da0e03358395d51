"""emqfast takes the client an app already has.

Most apps build ``redis.Redis(..., decode_responses=True)``. A Queue given one works in
bytes mode on a twin of it (same host, db, auth, TLS, protocol, client name, timeouts),
so a Worker runs jobs and bytes payloads survive; a client that cannot be copied is
refused at construction with a typed error saying to pass ``decode_responses=False``.
"""
from __future__ import annotations

import asyncio
from urllib.parse import urlparse

import pytest
import redis
import redis.asyncio as aredis

import emqfast
import emqfast.aio as emq
from emqfast import Queue, Worker
from emqfast.core.errors import InvalidInput

from test_security import tls_server  # noqa: F401 - the TLS redis-server fixture, reused

BLOB = bytes(range(256)) * 4  # not UTF-8: a decoding client would mangle or refuse it


def _port(redis_url: str) -> int:
    return urlparse(redis_url).port


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def _sync_round_trip(q: Queue) -> None:
    """Enqueue bytes and JSON, run a Worker to the end, read payloads and results back."""
    blob = q.enqueue(BLOB)
    doc = q.enqueue({"n": 1, "s": "é"})
    assert q.get(blob.id).payload == BLOB
    seen = []

    def handler(job):
        seen.append(job.payload)
        return {"len": len(job.payload)}

    stats = Worker(q, handler).run_until_idle(30)
    assert stats.completed == 2 and stats.failed == 0
    assert BLOB in seen and {"n": 1, "s": "é"} in seen
    assert q.get(blob.id).result == {"len": len(BLOB)}
    assert q.get(doc.id).state == "completed"


@pytest.mark.parametrize("protocol", [2, 3])
def test_decoding_sync_client_runs_jobs_in_bytes_mode(redis_url, qname, protocol):
    user = redis.Redis(port=_port(redis_url), db=5, protocol=protocol, decode_responses=True,
                       client_name="my-app", socket_timeout=7)
    q = Queue(qname, user)
    assert q.redis is not user
    kw = q.redis.connection_pool.connection_kwargs
    assert kw["decode_responses"] is False
    assert (kw["db"], kw["protocol"], kw["client_name"], kw["socket_timeout"]) == \
        (5, protocol, "my-app", 7)
    _sync_round_trip(q)
    # the jobs really live in db 5, and the user's own client still decodes
    assert all(isinstance(key, str) for key in user.keys(f"*{qname}*"))
    assert user.keys(f"*{qname}*")
    assert not redis.Redis(port=_port(redis_url), db=0).keys(f"*{qname}*")
    user.close()
    q.redis.close()


def test_queues_sharing_a_decoding_client_share_one_twin(redis_url, qname):
    user = redis.Redis(port=_port(redis_url), decode_responses=True)
    first, second = Queue(qname, user), Queue(qname + "-2", user)
    assert first.redis is second.redis and first.redis is not user
    user.close()
    first.redis.close()


def test_bytes_client_is_used_as_given(redis_url, qname):
    user = redis.Redis.from_url(redis_url)
    assert Queue(qname, user).redis is user
    user.close()


def test_decoding_unix_socket_and_blocking_pool_are_copied(redis_url, qname):
    pool = redis.BlockingConnectionPool(port=_port(redis_url), db=2, timeout=3,
                                        max_connections=4, decode_responses=True)
    user = redis.Redis(connection_pool=pool)
    q = Queue(qname, user)
    assert type(q.redis.connection_pool) is redis.BlockingConnectionPool
    assert (q.redis.connection_pool.timeout, q.redis.connection_pool.max_connections) == (3, 4)
    _sync_round_trip(q)
    user.close()
    q.redis.close()


def test_decoding_client_that_cannot_be_copied_is_refused(redis_url, qname):
    class MyRedis(redis.Redis):
        pass

    user = MyRedis(port=_port(redis_url), decode_responses=True)
    with pytest.raises(InvalidInput, match="decode_responses=False"):
        Queue(qname, user)
    user.close()


def test_decoding_asyncio_client_runs_jobs_in_bytes_mode(redis_url, qname):
    async def main():
        user = aredis.Redis(port=_port(redis_url), db=4, protocol=3, decode_responses=True,
                            client_name="my-aio-app")
        q = emq.Queue(qname, user)
        assert q.redis is not user
        kw = q.redis.connection_pool.connection_kwargs
        assert (kw["decode_responses"], kw["db"], kw["protocol"]) == (False, 4, 3)
        blob = await q.enqueue(BLOB)
        await q.enqueue({"n": 2})
        assert (await q.get(blob.id)).payload == BLOB

        async def handler(job):
            return {"len": len(job.payload)}

        stats = await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        assert stats.completed == 2 and stats.failed == 0
        assert (await q.get(blob.id)).result == {"len": len(BLOB)}
        assert await user.keys(f"*{qname}*")  # in the user's db 4
        await q.aclose()
        await user.aclose()
    _run(main())


def test_decoding_asyncio_cluster_is_refused_with_what_to_pass():
    user = aredis.RedisCluster(host="127.0.0.1", port=1, decode_responses=True)
    with pytest.raises(InvalidInput, match="decode_responses=False"):
        emq.Queue("q", user)


def test_decoding_tls_client_keeps_tls(tls_server, qname):  # noqa: F811
    plain = emqfast.connect(tls_server)
    kw = dict(plain.connection_pool.connection_kwargs)
    plain.close()
    user = redis.Redis(host="127.0.0.1", port=kw["port"], ssl=True,
                       ssl_ca_certs=kw["ssl_ca_certs"], decode_responses=True)
    q = Queue(qname, user)
    assert issubclass(q.redis.connection_pool.connection_class, redis.SSLConnection)
    assert q.redis.connection_pool.connection_kwargs["ssl_ca_certs"] == kw["ssl_ca_certs"]
    _sync_round_trip(q)
    user.close()
    q.redis.close()


@pytest.mark.cluster
def test_decoding_cluster_client_is_copied(qname):
    from cluster_util import start_cluster

    c = start_cluster(3)
    try:
        where = urlparse(c.url.replace("+cluster", ""))
        user = redis.RedisCluster(host=where.hostname, port=where.port, decode_responses=True)
        q = Queue(qname, user)
        assert isinstance(q.redis, redis.RedisCluster) and q.redis is not user
        assert not q.redis.get_encoder().decode_responses
        _sync_round_trip(q)
        user.close()
        q.redis.close()
    finally:
        c.stop()
