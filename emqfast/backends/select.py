"""Backend switch (msgpack's pattern): ``EMQFAST_BACKEND=auto|c|python``.

``auto`` (default) uses the C core when it is built and falls back to the pure
Python twin with a logged warning. Everything above this module calls
``backend.impl()`` and never imports ``_native`` or ``_pure`` directly.
"""
from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Any, Dict, Optional, Set, Tuple

from emqfast.backends import pure as _pure
from emqfast.core.errors import BackendUnavailable

log = logging.getLogger("emqfast")

# The C extension is imported only when the C backend is asked for (or its
# availability is): EMQFAST_BACKEND=python must not load it at all.
_native: Optional[ModuleType] = None
_native_error: str = ""
_native_tried = False

_current = "python"


def _load_native() -> Optional[ModuleType]:
    """Import ``emqfast._native`` once; None (and :func:`native_error` says why) if it fails."""
    global _native, _native_error, _native_tried
    if not _native_tried:
        _native_tried = True
        try:  # the extension may be absent: no compiler or no libhiredis at install time
            from emqfast.backends import native as native_mod
            _native = native_mod
        except Exception as exc:  # pragma: no cover - depends on the build
            _native_error = f"{type(exc).__name__}: {exc}"
    return _native


def native_available() -> bool:
    """True when the C extension imports (importing it on first ask)."""
    return _load_native() is not None


def native_error() -> str:
    """Why the C extension is unavailable ('' when it is available)."""
    _load_native()
    return _native_error


def use(name: str) -> str:
    """Select ``'c'``, ``'python'`` or ``'auto'``; returns the live backend name."""
    global _current
    name = (name or "auto").lower()
    if name not in ("auto", "c", "python"):
        raise ValueError(f"EMQFAST_BACKEND must be auto, c or python, not {name!r}")
    if name == "python":
        _current = "python"  # the C extension is not even imported
    elif native_available():
        _current = "c"
    elif name == "c":
        raise BackendUnavailable(f"C backend requested but not built ({_native_error})")
    else:
        log.warning("emqfast: C core not built (%s); using the pure-Python backend",
                    _native_error)
        _current = "python"
    return _current


def current() -> str:
    """Name of the live backend: ``'c'`` or ``'python'``."""
    return _current


def impl() -> ModuleType:
    """The live arithmetic module (``_native`` or ``_pure``); same functions either way."""
    return _native if _current == "c" else _pure  # type: ignore[return-value]


use(os.environ.get("EMQFAST_BACKEND", "auto"))


_refusals_logged: Set[str] = set()

# --- shared native connections -------------------------------------------------------------
# A C Batcher is a server connection. One per Queue object made an app with many live
# queues hold one connection per queue (2,000 queues -> 2,001 clients). They are shared
# instead per (process, thread, connection parameters), as redis-py's pool shares its
# sockets: connections stay O(threads). Per thread, because a Batcher serialises its
# calls; per process, because a forked child must never write to its parent's socket.
_per_thread = threading.local()
ConnKey = Tuple[Any, ...]  # a shared connection's parameters (SharedBatcher._key)


def _thread_batchers() -> Dict[ConnKey, Any]:
    """This thread's shared native Batchers by connection key (a fresh map after fork)."""
    pid = os.getpid()
    if getattr(_per_thread, "pid", None) != pid:
        inherited = getattr(_per_thread, "batchers", {})
        _per_thread.pid, _per_thread.batchers = pid, {}
        for batcher in inherited.values():  # the parent's sockets: close our copies only
            _forget_inherited(batcher)
    batchers: Dict[ConnKey, Any] = _per_thread.batchers
    return batchers


def _forget_inherited(batcher: Any) -> None:
    try:
        batcher.close()  # frees this process's copy of the fd; sends nothing
    except Exception:  # noqa: BLE001 - best effort on a socket that is not ours
        pass


def _after_fork_in_child() -> None:
    # The forking thread is the only one left: drop its map now, so nothing inherited
    # survives even if the pid check above were never reached.
    inherited = getattr(_per_thread, "batchers", {})
    _per_thread.pid, _per_thread.batchers = os.getpid(), {}
    for batcher in inherited.values():
        _forget_inherited(batcher)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shared_native(key: ConnKey, params: Dict[str, Any]) -> Any:
    batchers = _thread_batchers()
    batcher = batchers.get(key)
    if batcher is None:
        batcher = batchers[key] = _native.Batcher(**params)  # type: ignore[union-attr]
    return batcher


class SharedBatcher:
    """A handle on the calling thread's shared C Batcher for one set of connection
    parameters. Holding it pins no connection (each call picks the caller thread's),
    and :meth:`close` closes nothing shared: the connection ends with its thread, at
    fork (in the child) or with :func:`close_shared`."""

    def __init__(self, params: Dict[str, Any]) -> None:
        self._params = params
        self._key = tuple(sorted(params.items()))

    def batcher(self) -> Any:
        """The calling thread's native Batcher (connected lazily, on its first batch)."""
        return _shared_native(self._key, self._params)

    def evalsha_many(self, *args: Any) -> Any:
        return self.batcher().evalsha_many(*args)

    def evalsha_flat(self, *args: Any) -> Any:
        return self.batcher().evalsha_flat(*args)

    def evalsha_columns(self, *args: Any) -> Any:
        return self.batcher().evalsha_columns(*args)

    def __getattr__(self, name: str) -> Any:  # anything else a Batcher offers
        if name.startswith("__") or name in ("_params", "_key"):
            raise AttributeError(name)  # copy/pickle probes, or a half-built handle
        return getattr(self.batcher(), name)

    def close(self) -> None:
        """Release this handle (the shared connection stays for the thread's next call)."""

    def __enter__(self) -> "SharedBatcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def close_shared() -> None:
    """Close the calling thread's shared C connections (the next batch reconnects)."""
    for batcher in _thread_batchers().values():
        batcher.close()


_no_password_ok: Set[ConnKey] = set()


def _check_needs_no_password(client: Any, key: ConnKey) -> None:
    """Once per process and server: a server that wants a password cuts a pipelined
    hiredis batch sent without one ("Server closed the connection"), which reads like
    a network fault. One PING over redis-py first says what is wrong instead
    (PermissionDenied: a password is required, and how to pass it)."""
    if key in _no_password_ok:
        return
    import redis

    from emqfast.core.errors import translate

    from emqfast.core.diagnose import password_missing

    try:
        client.ping()
    except redis.RedisError as exc:
        if password_missing(str(exc)):
            raise translate(exc) from None
        if not isinstance(exc, redis.ResponseError):
            return  # down or unreachable: the batch itself will say so (checked again later)
    _no_password_ok.add(key)  # answered (or refused PING itself: an ACL without +ping)


def _refuse_green_sockets() -> None:
    """The C core's socket is a plain blocking one: under gevent or eventlet (which patch
    ``socket.socket`` for cooperative I/O) each of its round trips would stall every
    greenlet of the process. Such apps get redis-py, which speaks through the patched
    sockets, and the log says why."""
    import socket

    if socket.socket.__module__ not in ("socket", "_socket"):
        raise BackendUnavailable(
            f"socket.socket is patched ({socket.socket.__module__}: gevent/eventlet?): the "
            "C core's blocking socket would stall other greenlets")


def batcher_for(client: Any) -> Any:
    """A pipelining Batcher for ``client``: the hiredis one under the C backend, when the
    connection is one it can speak (TCP, TLS or unix socket; no cluster), else redis-py's.

    The C one is a :class:`SharedBatcher`: every caller with the same server,
    credentials and db shares one connection per thread. On Redis Cluster it is a
    :class:`~emqfast.backends.native_cluster.ClusterBatcher`: a queue lives
    in one slot, so a columnar bulk goes over the C core to that slot's master (redis-py's
    slot map, MOVED followed, ASK handed to redis-py), the other calls through redis-py's
    ClusterPipeline. Each distinct reason to fall back is logged once.
    """
    from emqfast.backends import pure_batcher

    if _current == "c":
        try:
            _refuse_green_sockets()
            from redis.cluster import RedisCluster
            if isinstance(client, RedisCluster):  # a queue's bulk to its slot's master
                from emqfast.backends.native_cluster import ClusterBatcher
                return ClusterBatcher(client, SharedBatcher)
            params = _native.Batcher.params_from_redis(client)  # type: ignore[union-attr]
            handle = SharedBatcher(params)
            if params.get("password") is None:
                _check_needs_no_password(client, handle._key)
            return handle
        except BackendUnavailable as exc:
            from emqfast.core.redaction import redact

            reason = redact(str(exc))  # a C-side message may echo the URL
            if reason not in _refusals_logged:
                _refusals_logged.add(reason)
                log.info("emqfast: C batcher unavailable for this connection (%s); "
                         "using redis-py", reason)
    return pure_batcher.Batcher.from_redis(client)


class _CallableModule(ModuleType):
    """``emqfast.backend`` is both this module and the public ``emqfast.backend()``
    call (which backend is live). Without this, the function defined in the
    package would shadow the module, and ``from emqfast import backend`` would
    hand callers a function instead of ``use``/``impl``/``batcher_for``."""

    def __call__(self) -> str:
        return current()


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
