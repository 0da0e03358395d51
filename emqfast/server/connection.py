"""``connect()``: an explicit URL, else ``EMQ_REDIS_URL``, else the embedded Redis."""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Dict, Optional, Set, Tuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from emqfast.core import deadlines
from emqfast.core.errors import ConnectionFailed, InvalidInput
from emqfast.core.redaction import scrub as _scrub_any

log = logging.getLogger("emqfast")

# Redaction lives in emqfast.redaction (it parses no URL, so malformed ones are masked
# too); these names stay for the callers that import them from here.
from emqfast.core.redaction import redact  # noqa: E402,F401


def _scrub(text: str, url: str) -> str:
    """``text`` without any copy (or piece) of a secret from ``url``; see
    :func:`emqfast.redaction.scrub`."""
    return _scrub_any(text, [url])


def connect(url: Optional[str] = None, **kwargs: Any) -> "redis.Redis":
    """A redis-py client for emqfast.

    ``url`` may be ``redis://``, ``rediss://`` (TLS), ``unix://`` or
    ``redis+cluster://host:port`` (Redis Cluster). With no URL: ``EMQ_REDIS_URL``,
    else the embedded server (started on first use, shared by every process of
    this user; see :mod:`emqfast.embedded`). An existing client is returned as is.

    The client re-sends no command (``retry`` defaults to ``Retry(NoBackoff(), 0)``; a
    broken connection is replaced on the next command): a command whose reply was lost
    may have run, and emqfast reports that (:class:`~emqfast.errors.ReplyLost`) rather
    than run it twice. emqfast's own script calls never use a client's retry anyway
    (see :mod:`emqfast.backends.transport`).

    No read waits for ever (:mod:`emqfast.core.deadlines`): unless given (as keyword or
    URL query arguments), ``socket_timeout`` and ``socket_connect_timeout`` are
    :data:`~emqfast.core.deadlines.READ_TIMEOUT_S` / ``CONNECT_TIMEOUT_S``, TCP keepalive
    is on and idle connections are health-checked. A connection silent past its deadline
    is dropped (:class:`~emqfast.errors.ReplyLost`) and the next command dials anew.
    Blocking commands sent on such a client need a read deadline above their block time:
    emqfast's own (marker waits, event tails, WAIT) ask for one.

    The first connect() to a server whose ``maxmemory-policy`` may evict keys logs a
    loud warning (logger ``emqfast``): jobs would vanish under memory pressure. The
    check never fails connect() (an unreachable or ACL-restricted server is not checked).
    """
    if isinstance(url, (redis.Redis, redis.RedisCluster)):
        return url
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    target = target_url(url)
    with_deadlines(kwargs, target)
    client: redis.Redis = open_client(target, redis.Redis, redis.RedisCluster, **kwargs)
    _warn_if_evicting(client, target)
    return client


def with_deadlines(kwargs: Dict[str, Any], url: str = "") -> Dict[str, Any]:
    """``kwargs`` with emqfast's connection deadlines and keepalive filled in where the
    caller set none (:func:`emqfast.core.deadlines.client_defaults`); URL query arguments
    still win (redis-py applies them over keywords). A unix socket (the embedded server)
    gets the deadlines only: TCP keepalive is not an option of its connections."""
    unix = url.startswith("unix:")
    for name, value in deadlines.client_defaults().items():
        if unix and name.startswith("socket_keepalive"):
            continue
        kwargs.setdefault(name, value)
    return kwargs


_checked: Set[str] = set()  # servers (redacted URLs) whose eviction policy was looked at


def _warn_if_evicting(client: Any, url: str) -> None:
    """Log a loud warning, once per server and process, when the server may evict
    emqfast's keys (see :mod:`emqfast.server.eviction`). Never raises; at most ~1 s per
    probe."""
    where = redact(url)
    if where in _checked:
        return
    _checked.add(where)
    try:
        from emqfast.server import eviction
    except ImportError:  # pragma: no cover - the module ships with the package
        return
    probe = client
    try:
        if isinstance(client, redis.Redis):  # a short-lived probe: bounded timeouts
            pool = client.connection_pool
            kw = dict(pool.connection_kwargs)
            kw.update(socket_connect_timeout=1, socket_timeout=1, retry=Retry(NoBackoff(), 0))
            probe = redis.Redis(connection_pool=redis.ConnectionPool(
                connection_class=pool.connection_class, **kw))
        warning = eviction.check(probe)
    except Exception:  # noqa: BLE001 - a warning must never fail connect()
        return
    finally:
        if probe is not client:
            probe.close()
    if warning:
        log.warning("emqfast: WARNING %s: %s", where, warning)


def target_url(url: Optional[str]) -> str:
    """The URL to use: ``url``, else ``EMQ_REDIS_URL``, else the embedded server's."""
    url = url or os.environ.get("EMQ_REDIS_URL")
    if not url:
        from emqfast.server import embedded
        url = embedded.ensure_running()
    if not isinstance(url, str):
        raise InvalidInput("url must be a str or a redis client")
    return url


def open_client(url: str, single: Any, cluster: Any, **kwargs: Any) -> Any:
    """``single.from_url`` or, for ``redis+cluster://``, ``cluster.from_url`` (the sync or
    the asyncio classes); errors never echo a password."""
    try:
        if url.startswith(("redis+cluster://", "rediss+cluster://")):
            return cluster.from_url(url.replace("+cluster", "", 1), **kwargs)
        return single.from_url(url, **kwargs)
    except (ValueError, redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        # (a Cluster client reads its slot map at construction: an unreachable node fails
        # here, as a single server's first command does: ConnectionFailed, not sent)
        # redis-py's messages may echo the URL: never let a password out
        raise ConnectionFailed(f"cannot connect to {redact(url)}: "
                               f"{_scrub(str(exc), url)}") from None


def resolve(conn: Any) -> "redis.Redis":
    """A client from whatever the caller gave a Queue: None, a URL, or a client.

    A client built with ``decode_responses=True`` (most apps' client) is taken as it is:
    emqfast talks bytes (payloads may be bytes), so it gets a bytes-mode twin of it with
    the same connection settings (:func:`bytes_mode`); the caller's client is untouched."""
    if conn is None or isinstance(conn, str):
        return connect(conn)
    if isinstance(conn, (redis.Redis, redis.RedisCluster)):
        client: redis.Redis = bytes_mode(conn)
        return client
    raise InvalidInput(f"expected a redis client or URL, not {type(conn).__name__}")


# Pool-made state, not settings: a new pool builds its own (copying them would tie the
# twin to the original pool's handlers and registries).
_POOL_STATE = frozenset({"maint_notifications_pool_handler", "himport_registry",
                         "orig_host_address", "orig_socket_timeout",
                         "orig_socket_connect_timeout"})


def decodes(client: Any) -> bool:
    """True when ``client`` turns replies into ``str`` (``decode_responses=True``)."""
    get = getattr(client, "get_encoder", None)
    encoder = get() if callable(get) else getattr(client, "encoder", None)
    return bool(getattr(encoder, "decode_responses", False))


def cannot_copy(client: Any, why: str) -> InvalidInput:
    """The typed refusal for a decoding client emqfast cannot rebuild in bytes mode."""
    return InvalidInput(
        f"this {type(client).__name__} has decode_responses=True and emqfast cannot make a "
        f"bytes-mode copy of it ({why}); pass a client built with decode_responses=False "
        "(or a URL) to emqfast")


def bytes_settings(connection_kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """A pool's connection settings with ``decode_responses=False`` (pool-made state left
    out): host/port or unix path, auth, db, TLS, protocol, client name, timeouts, retry."""
    kw = {k: v for k, v in connection_kwargs.items() if k not in _POOL_STATE}
    kw["decode_responses"] = False
    return kw


def copy_pool(pool: Any, kinds: Tuple[type, ...], client: Any) -> Any:
    """A new pool of ``pool``'s class (one of ``kinds``) and settings, in bytes mode."""
    if type(pool) not in kinds:
        raise cannot_copy(client, f"its connection pool is a {type(pool).__name__}")
    extra = {"timeout": pool.timeout} if hasattr(pool, "timeout") else {}
    return type(pool)(connection_class=pool.connection_class,
                      max_connections=pool.max_connections, **extra,
                      **bytes_settings(pool.connection_kwargs))


def bytes_mode(client: Any) -> Any:
    """``client`` itself when it returns bytes, else a bytes-mode twin with its settings
    (:class:`InvalidInput` for one that cannot be copied faithfully: nothing is sent)."""
    if not decodes(client):
        return client
    with _twins_lock:  # one twin per client: Queues sharing a client share its pool
        twin = _twins.get(client)
        if twin is None:
            twin = _twins[client] = _bytes_twin(client)
        return twin


_twins: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_twins_lock = threading.Lock()


def _bytes_twin(client: Any) -> Any:
    if isinstance(client, redis.RedisCluster):
        return _bytes_cluster(client)
    if type(client) is not redis.Redis:
        raise cannot_copy(client, "a subclass of redis.Redis")
    pool = copy_pool(client.connection_pool,
                     (redis.ConnectionPool, redis.BlockingConnectionPool), client)
    return redis.Redis.from_pool(pool)


def _bytes_cluster(client: Any) -> "redis.RedisCluster":
    """A bytes-mode RedisCluster with ``client``'s startup nodes and settings."""
    from redis.cluster import ClusterNode

    nodes = client.nodes_manager
    if type(client) is not redis.RedisCluster or getattr(nodes, "_cache", None) is not None:
        raise cannot_copy(client, "a subclass or a client-side cache")
    kw = bytes_settings(nodes.connection_kwargs)
    kw.pop("redis_connect_func", None)  # bound to the original client
    if getattr(client, "user_on_connect_func", None) is not None:
        kw["redis_connect_func"] = client.user_on_connect_func
    if client.read_from_replicas and client.load_balancing_strategy is None:
        kw["read_from_replicas"] = True  # (deprecated by redis-py: passed only when set)
    # redis-py's ClusterNode.__init__ has no annotations
    startup = [ClusterNode(n.host, n.port)  # type: ignore[no-untyped-call]
               for n in nodes.startup_nodes.values()]
    return redis.RedisCluster(
        startup_nodes=startup, retry=client.retry,
        require_full_coverage=getattr(nodes, "_require_full_coverage", True),
        dynamic_startup_nodes=getattr(nodes, "_dynamic_startup_nodes", True),
        address_remap=nodes.address_remap, reinitialize_steps=client.reinitialize_steps,
        load_balancing_strategy=client.load_balancing_strategy, **kw)
