"""Backend switch (msgpack's pattern): ``EMQFAST_BACKEND=auto|c|python``.

``auto`` (default) uses the C core when it is built and falls back to the pure
Python twin with a logged warning. Everything above this module calls
``backend.impl()`` and never imports ``_native`` or ``_pure`` directly.
"""
from __future__ import annotations

import logging
import os
from types import ModuleType
from typing import Optional

from .errors import BackendUnavailable

log = logging.getLogger("emqfast")

_native: Optional[ModuleType] = None
_native_error: str = ""
try:  # the extension may be absent: no compiler or no libhiredis at install time
    from . import _native as _native_mod  # noqa: F401

    _native = _native_mod
except Exception as exc:  # pragma: no cover - depends on the build
    _native_error = f"{type(exc).__name__}: {exc}"

from . import _pure  # noqa: E402

_current = "python"


def native_available() -> bool:
    """True when the C extension imported."""
    return _native is not None


def native_error() -> str:
    """Why the C extension is unavailable ('' when it is available)."""
    return _native_error


def use(name: str) -> str:
    """Select ``'c'``, ``'python'`` or ``'auto'``; returns the live backend name."""
    global _current
    name = (name or "auto").lower()
    if name not in ("auto", "c", "python"):
        raise ValueError(f"EMQFAST_BACKEND must be auto, c or python, not {name!r}")
    if name == "python":
        _current = "python"
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


_refusals_logged: set = set()


def batcher_for(client):
    """A pipelining Batcher for ``client``: the hiredis one under the C backend, when the
    connection is one it can speak (TCP or unix socket, no TLS, no cluster), else redis-py's.

    Redis Cluster falls back on purpose: a queue lives in one slot, so its batch
    goes to one node either way, and redis-py's ClusterPipeline already groups
    commands per node (one round trip each), keeps the ``CLUSTER SLOTS`` map and
    follows MOVED/ASK while slots move. Each distinct reason is logged once.
    """
    from . import _pure_wire

    if _current == "c":
        try:
            return _native.Batcher.from_redis(client)  # type: ignore[union-attr]
        except BackendUnavailable as exc:
            from .connection import redact

            reason = redact(str(exc))  # a C-side message may echo the URL
            if reason not in _refusals_logged:
                _refusals_logged.add(reason)
                log.info("emqfast: C batcher unavailable for this connection (%s); "
                         "using redis-py", reason)
    return _pure_wire.Batcher.from_redis(client)


class _CallableModule(ModuleType):
    """``emqfast.backend`` is both this module and the public ``emqfast.backend()``
    call (which backend is live). Without this, the function defined in the
    package would shadow the module, and ``from emqfast import backend`` would
    hand callers a function instead of ``use``/``impl``/``batcher_for``."""

    def __call__(self) -> str:
        return current()


import sys as _sys  # noqa: E402

_sys.modules[__name__].__class__ = _CallableModule
