"""``emqfast.aio.connect()``: the sync rules (URL, ``EMQ_REDIS_URL``, embedded server)
with ``redis.asyncio`` clients."""
from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any, Optional

import redis
import redis.asyncio as aredis

from emqfast.server.connection import (bytes_settings, cannot_copy, decodes, open_client,
                                       target_url, with_deadlines)
from emqfast.core.errors import InvalidInput


def connect(url: Optional[str] = None, **kwargs: Any) -> "aredis.Redis":
    """A ``redis.asyncio`` client (``redis+cluster://`` gives ``redis.asyncio.RedisCluster``).

    No I/O happens until first use. An existing asyncio client is returned as is.
    Like the sync ``connect()``, the client re-sends no command (``retry`` defaults to no
    retries; a broken connection is replaced on the next command) and every read has a
    deadline (socket and connect timeouts, TCP keepalive, health checks by default).
    """
    if isinstance(url, (aredis.Redis, aredis.RedisCluster)):
        return url
    if isinstance(url, (redis.Redis, redis.RedisCluster)):
        raise InvalidInput("emqfast.aio needs a redis.asyncio client, not a blocking one")
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    target = target_url(url)
    with_deadlines(kwargs, target)
    client: aredis.Redis = open_client(target, aredis.Redis, aredis.RedisCluster, **kwargs)
    return client


def resolve(conn: Any) -> "aredis.Redis":
    """A client from whatever the caller gave an aio Queue: None, a URL, or an asyncio client."""
    if conn is None or isinstance(conn, str):
        return connect(conn)
    if isinstance(conn, (aredis.Redis, aredis.RedisCluster)):
        client: aredis.Redis = bytes_mode(conn)
        return client
    raise InvalidInput(f"expected a redis.asyncio client or URL, not {type(conn).__name__}")


def bytes_mode(client: Any) -> Any:
    """``client`` itself when it returns bytes, else a bytes-mode ``redis.asyncio.Redis``
    with its settings (a decoding cluster or subclass: :class:`InvalidInput`, nothing sent).
    emqfast talks bytes: payloads may be bytes, and its replies are parsed as bytes."""
    if not decodes(client):
        return client
    if type(client) is not aredis.Redis:
        raise cannot_copy(client, f"a {type(client).__name__} is not copied by emqfast.aio")
    pool = client.connection_pool
    if type(pool) not in (aredis.ConnectionPool, aredis.BlockingConnectionPool):
        raise cannot_copy(client, f"its connection pool is a {type(pool).__name__}")
    extra = {"timeout": pool.timeout} if hasattr(pool, "timeout") else {}
    return aredis.Redis.from_pool(type(pool)(
        connection_class=pool.connection_class, max_connections=pool.max_connections,
        **extra, **bytes_settings(pool.connection_kwargs)))


class LoopClients:
    """One ``redis.asyncio`` client per event loop, all built from the same settings.

    An asyncio client's connections belong to the loop they were opened on: used from
    another loop (a second ``asyncio.run``, another thread) a command may be written and
    then fail with ``Event loop is closed`` — sent, so a retry could duplicate it. The
    given client serves the first loop that uses it; any other loop gets its own copy
    (same pool class, connection class and keyword arguments). A client that cannot be
    copied (``RedisCluster``) is refused on another loop before anything is sent.
    """

    def __init__(self, client: Any):
        self.template = client
        self._home: Optional["weakref.ref[asyncio.AbstractEventLoop]"] = None
        self._others: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any]" = \
            weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def current(self) -> Any:
        """The client for the running loop (the given one outside any loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return self.template
        home = self._home
        if home is not None and home() is loop:  # (set once: no lock to read it)
            return self.template
        with self._lock:
            if self._home is None:
                self._home = weakref.ref(loop)
            if self._home() is loop:
                return self.template
            client = self._others.get(loop)
            if client is None:
                client = self._others[loop] = copy_client(self.template)
            return client


def copy_client(client: Any) -> "aredis.Redis":
    """A new ``redis.asyncio.Redis`` with ``client``'s settings and a pool of its own;
    :class:`InvalidInput` (nothing sent) for a client that cannot be copied."""
    pool = getattr(client, "connection_pool", None)
    if type(client) is not aredis.Redis or getattr(client, "single_connection_client", False) \
            or pool is None:
        raise InvalidInput(
            f"this emqfast.aio.Queue's {type(client).__name__} is bound to the event loop it "
            "was first used on and cannot be copied for another one; nothing was sent. "
            "Create the Queue (or its client) inside each event loop / thread.")
    extra = {"timeout": pool.timeout} if hasattr(pool, "timeout") else {}
    new_pool = type(pool)(connection_class=pool.connection_class,
                          max_connections=pool.max_connections, **extra,
                          **pool.connection_kwargs)
    return aredis.Redis.from_pool(new_pool)
