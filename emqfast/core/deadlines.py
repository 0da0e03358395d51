"""How long emqfast waits on the network: every read has a deadline.

A connection that goes silent without a FIN or an RST (a NAT or link blip, a frozen
peer) never wakes a read that has no timeout: the caller would hang for good. So every
read emqfast makes, in C and in Python, has a deadline; a read that passes it drops the
connection (its reply is lost: :class:`~emqfast.core.errors.ReplyLost`, never re-sent)
and the next call dials a new one.

- a plain command's reply: the client's ``socket_timeout``, else :data:`READ_TIMEOUT_S`;
- a blocking command (``BZPOPMIN``, ``XREAD BLOCK``, ``WAIT``): its block time plus
  :data:`BLOCK_MARGIN_S` (Redis ends blocked clients on its ``hz`` tick, up to ~100 ms
  late, and the reply still has to travel), never less than the plain deadline;
- connecting: the client's ``socket_connect_timeout``, else :data:`CONNECT_TIMEOUT_S`.

``emqfast.connect()`` gives its clients these timeouts, TCP keepalive and a pub/sub
health check (:func:`client_defaults`); the C batcher applies the same deadlines to
clients made elsewhere.
"""
from __future__ import annotations

import socket
from typing import Any, Dict, Optional

READ_TIMEOUT_S = 5.0  # a reply to a plain command: Redis answers in ms, a script in < 5 s
CONNECT_TIMEOUT_S = 5.0  # TCP (and TLS) connect, AUTH, SELECT
BLOCK_MARGIN_S = 2.0  # a blocking command's reply may come this late after its block time
HEALTH_CHECK_S = 15  # an idle connection (pub/sub included) is PINGed before reuse
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 3  # TCP keepalive


def read_timeout(configured: Optional[float]) -> float:
    """The deadline of a plain reply: ``configured`` (a client's ``socket_timeout``) when
    it is a positive number, else :data:`READ_TIMEOUT_S`."""
    if configured is None or not configured > 0:
        return READ_TIMEOUT_S
    return float(configured)


def connect_timeout(configured: Optional[float], socket_timeout: Optional[float]) -> float:
    """The connect deadline: ``configured``, else the ``socket_timeout`` (redis-py's own
    fallback), else :data:`CONNECT_TIMEOUT_S`."""
    for value in (configured, socket_timeout):
        if value is not None and value > 0:
            return float(value)
    return CONNECT_TIMEOUT_S


def blocking_read_timeout(block_s: float, configured: Optional[float] = None) -> float:
    """The deadline of a blocking command's reply: its block time ``block_s`` plus
    :data:`BLOCK_MARGIN_S`, and never below the plain deadline."""
    return max(read_timeout(configured), float(block_s) + BLOCK_MARGIN_S)


def keepalive_options() -> Dict[int, int]:
    """TCP keepalive timings for redis-py's ``socket_keepalive_options`` (the ones this
    platform has): a silent peer is noticed after about 25 s even with no read pending."""
    names = {"TCP_KEEPIDLE": KEEPALIVE_IDLE_S, "TCP_KEEPALIVE": KEEPALIVE_IDLE_S,  # (macOS)
             "TCP_KEEPINTVL": KEEPALIVE_INTERVAL_S, "TCP_KEEPCNT": KEEPALIVE_PROBES}
    return {getattr(socket, name): value for name, value in names.items()
            if hasattr(socket, name)}


def client_defaults() -> Dict[str, Any]:
    """The connection settings ``emqfast.connect()`` gives a client unless told otherwise:
    read and connect deadlines, TCP keepalive and a health check of idle connections.
    ``socket_timeout`` bounds plain replies; emqfast's blocking reads (the Worker's
    marker wait, event tails, WAIT) each ask for their own, longer deadline."""
    return {"socket_timeout": READ_TIMEOUT_S, "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "socket_keepalive": True, "socket_keepalive_options": keepalive_options(),
            "health_check_interval": HEALTH_CHECK_S}
