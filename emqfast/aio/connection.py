"""``emqfast.aio.connect()``: the sync rules (URL, ``EMQ_REDIS_URL``, embedded server)
with ``redis.asyncio`` clients."""
from __future__ import annotations

from typing import Any, Optional

import redis
import redis.asyncio as aredis

from ..connection import open_client, target_url
from ..errors import InvalidInput


def connect(url: Optional[str] = None, **kwargs: Any) -> "aredis.Redis":
    """A ``redis.asyncio`` client (``redis+cluster://`` gives ``redis.asyncio.RedisCluster``).

    No I/O happens until first use. An existing asyncio client is returned as is.
    Like the sync ``connect()``, the client re-sends no command (``retry`` defaults to no
    retries; a broken connection is replaced on the next command).
    """
    if isinstance(url, (aredis.Redis, aredis.RedisCluster)):
        return url
    if isinstance(url, (redis.Redis, redis.RedisCluster)):
        raise InvalidInput("emqfast.aio needs a redis.asyncio client, not a blocking one")
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    return open_client(target_url(url), aredis.Redis, aredis.RedisCluster, **kwargs)


def resolve(conn: Any) -> "aredis.Redis":
    """A client from whatever the caller gave an aio Queue: None, a URL, or an asyncio client."""
    if conn is None or isinstance(conn, str):
        return connect(conn)
    if isinstance(conn, (aredis.Redis, aredis.RedisCluster)):
        return conn
    raise InvalidInput(f"expected a redis.asyncio client or URL, not {type(conn).__name__}")
