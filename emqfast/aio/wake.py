"""The asyncio twin of :class:`emqfast.worker.wake.MarkerWaiter`: BZPOPMIN on the wake marker,
ended on this process's own deadline.

Redis fires blocking timeouts on its ``hz`` tick (up to ~100 ms late), so the
wait runs on a dedicated connection and, when our deadline passes first, is
ended with ``CLIENT UNBLOCK <id> TIMEOUT`` from the shared pool: an unblocked
client pops nothing, so no wake-up is lost. Redis Cluster and servers whose
ACLs refuse ``CLIENT ID``/``CLIENT UNBLOCK`` fall back to the server's timeout.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Optional, Tuple

import redis
import redis.asyncio as aredis

log = logging.getLogger("emqfast.worker")


class MarkerWaiter:
    """``await wait(key, timeout_s)``: ``(member, score)`` popped from ``key``, or None."""

    def __init__(self, client: Any):
        self._client = client
        self._conn: Any = None
        self._client_id: Optional[int] = None
        self._precise = isinstance(client, aredis.Redis)
        self._reading: "Optional[asyncio.Future[Any]]" = None  # the wait's read, if any
        self._interrupted = False  # interrupt() asked: the wait in progress ends quietly

    async def wait(self, key: str, timeout_s: float) -> Optional[Tuple[bytes, float]]:
        """Pop from the marker zset ``key``, waiting at most ``timeout_s`` (to the ms)."""
        timeout_s = max(timeout_s, 0.001)
        if self._interrupted:  # asked before this wait began: it ends at once
            self._interrupted = False
            return None
        conn = await self._connection() if self._precise else None
        if conn is None:
            return self._pair(await self._client.bzpopmin(key, timeout=timeout_s))
        read: "Optional[asyncio.Future[Any]]" = None
        try:
            # the server's own timeout stays as a fallback (late, never early)
            await conn.send_command("BZPOPMIN", key, timeout_s)
            read = self._reading = asyncio.ensure_future(conn.read_response())
            done, _ = await asyncio.wait({read}, timeout=timeout_s)
            if not done:
                await self._unblock()
            reply = await read
        except BaseException:
            # a half-read blocking call must not be reused (this covers cancellation too)
            if read is not None and not read.done():
                read.cancel()
            elif read is not None and not read.cancelled():
                read.exception()  # retrieved: a read that failed is not logged as lost
            await self._drop()
            if self._interrupted and read is not None and read.cancelled():
                self._interrupted = False  # interrupt(): a stop, not a fault
                return None
            raise
        finally:
            self._reading = None
        if not self._precise:  # UNBLOCK was refused: go coarse from now on
            await self._drop()
        return self._pair(reply)

    async def close(self) -> None:
        """Release the dedicated connection."""
        await self._drop()

    def interrupt(self) -> None:
        """End the wait in progress now (or the next one, before it blocks), without I/O:
        a stop is instant even when the server does not answer. Call on the loop."""
        self._interrupted = True
        if self._reading is not None and not self._reading.done():
            self._reading.cancel()

    @staticmethod
    def _pair(reply: Any) -> Optional[Tuple[bytes, float]]:
        return None if reply is None else (reply[1], float(reply[2]))

    async def _connection(self) -> Any:
        if self._conn is not None and self._conn.is_connected:
            return self._conn
        if self._conn is None:
            self._conn = await self._client.connection_pool.get_connection()
        try:
            if not self._conn.is_connected:
                await self._conn.connect()
            # a (re)connection has a new client id
            await self._conn.send_command("CLIENT", "ID")
            self._client_id = int(await self._conn.read_response())
        except redis.ResponseError as exc:  # ACLs refuse CLIENT ID
            log.info("CLIENT ID refused (%s); wake-ups follow Redis' hz tick", exc)
            self._precise = False
            await self._drop()
            return None
        return self._conn

    async def _unblock(self) -> None:
        try:
            await self._client.execute_command("CLIENT", "UNBLOCK", self._client_id, "TIMEOUT")
        except redis.ResponseError as exc:  # e.g. NOPERM: this wait ends on the server's timeout
            log.info("CLIENT UNBLOCK refused (%s); wake-ups follow Redis' hz tick", exc)
            self._precise = False

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await conn.disconnect()
        finally:
            await self._client.connection_pool.release(conn)
