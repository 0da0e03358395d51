"""Blocking on a queue's wake marker with a deadline kept by this process.

Redis checks blocked clients' timeouts on its ``hz`` tick (10 per second by
default), so a ``BZPOPMIN`` asked to time out in 3 ms returns up to ~100 ms
late. A worker that sleeps until the next delayed job is due would then start
it that late. :class:`MarkerWaiter` blocks on the marker over a dedicated
connection (new work still wakes it at once) and, when its own deadline passes
first, ends the wait with ``CLIENT UNBLOCK <id> TIMEOUT``: an unblocked
client pops nothing, so no wake-up is ever lost. No polling interval.

Clients it cannot hold one connection of (Redis Cluster) and servers that
refuse ``CLIENT UNBLOCK`` (ACLs) fall back to a plain ``BZPOPMIN`` with the
server's timeout.
"""
from __future__ import annotations

import logging
import socket
from typing import Any, Optional, Tuple

import redis

log = logging.getLogger("emqfast.worker")

class MarkerWaiter:
    """``wait(key, timeout_s)``: BZPOPMIN on ``key``, ended on time by this process.

    One instance per blocking thread (it owns one connection). Not thread-safe.
    """

    def __init__(self, client: Any):
        self._client = client
        self._conn: Any = None
        self._client_id: Optional[int] = None
        self._interrupted = False  # interrupt() asked: the wait in progress ends quietly
        pool = getattr(client, "connection_pool", None)
        # Redis Cluster (no single pool) keeps the coarse server-side timeout.
        self._precise = isinstance(client, redis.Redis) and pool is not None

    def wait(self, key: str, timeout_s: float) -> Optional[Tuple[bytes, float]]:
        """Pop ``(member, score)`` from the marker zset ``key``, or None after ``timeout_s``."""
        timeout_s = max(timeout_s, 0.001)
        if self._interrupted:  # asked before this wait began: it ends at once
            self._interrupted = False
            return None
        conn = self._connection() if self._precise else None
        if conn is None:
            return self._coarse(key, timeout_s)
        # The server's own timeout stays as a fallback: it fires on its hz tick
        # (late, never early); CLIENT UNBLOCK is synchronous, so it can only ever
        # end this call, never the next one.
        try:
            conn.send_command("BZPOPMIN", key, timeout_s)
            if not conn.can_read(timeout=timeout_s):
                self._unblock()
            reply = conn.read_response()
        except redis.ResponseError as exc:  # e.g. CLIENT ID refused on a reconnect
            self._refused("CLIENT ID", exc)
            return self._coarse(key, timeout_s)
        except BaseException:
            # A half-read blocking call must not be reused: drop the connection.
            self._drop()
            if self._interrupted:  # interrupt() shut its socket: a stop, not a fault
                self._interrupted = False
                return None
            raise
        if not self._precise:
            self._drop()
        if reply is None:
            return None
        return reply[1], float(reply[2])

    def close(self) -> None:
        """Release the dedicated connection."""
        self._drop()

    def interrupt(self) -> None:
        """End the wait in progress now (or the next one, before it blocks), from any
        thread or a signal handler: no I/O, so a stop is instant even when the server
        does not answer. The dedicated connection's socket is shut; the wait drops it."""
        self._interrupted = True
        conn = self._conn
        sock = getattr(conn, "_sock", None) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    # --- internals -------------------------------------------------------------
    def _coarse(self, key: str, timeout_s: float) -> Optional[Tuple[bytes, float]]:
        popped = self._client.bzpopmin(key, timeout=timeout_s)
        return None if popped is None else (popped[1], float(popped[2]))

    def _connection(self) -> Any:
        """The dedicated connection, or None when the server refuses CLIENT ID (ACLs)."""
        if self._conn is None:
            pool = self._client.connection_pool
            try:
                conn = pool.get_connection()
            except TypeError:  # redis-py < 5.3 wants a command name
                conn = pool.get_connection("BZPOPMIN")
            self._conn = conn
            try:
                self._learn_id(conn)
            except redis.ResponseError as exc:
                self._refused("CLIENT ID", exc)
                return None
            conn.register_connect_callback(self._on_connect)
        return self._conn

    def _on_connect(self, conn: Any) -> None:
        self._learn_id(conn)  # a reconnect gets a new client id

    def _learn_id(self, conn: Any) -> None:
        conn.send_command("CLIENT", "ID")
        self._client_id = int(conn.read_response())

    def _refused(self, command: str, exc: Exception) -> None:
        """Fall back to the server's own (coarse) timeouts for good."""
        log.info("%s refused (%s); wake-ups follow Redis' hz tick", command, exc)
        self._precise = False
        self._drop()

    def _unblock(self) -> None:
        """Our deadline passed: end the server-side wait now (it pops nothing)."""
        try:
            self._client.execute_command("CLIENT", "UNBLOCK", self._client_id, "TIMEOUT")
        except redis.ResponseError as exc:  # e.g. NOPERM: this wait ends on the server's timeout
            log.info("CLIENT UNBLOCK refused (%s); wake-ups follow Redis' hz tick", exc)
            self._precise = False  # the connection is dropped after this wait's reply

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.deregister_connect_callback(self._on_connect)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        conn.disconnect()
        self._client.connection_pool.release(conn)
