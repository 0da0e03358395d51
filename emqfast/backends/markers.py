"""Waiting on many queues' wake markers over one connection.

A Worker over N queues that blocks on each queue's marker (``emq:{q}:marker``) by its
own ``BZPOPMIN`` holds N blocking connections: past the pool's size (redis-py: 100) it
cannot run at all. ``BZPOPMIN`` takes many keys, so on one server a single blocking
call waits on every queue: :class:`ManyMarkers` holds one dedicated connection and pops
from whichever marker is set first. Its read has a deadline (the block time plus
:data:`~emqfast.core.deadlines.BLOCK_MARGIN_S`): a connection that passes it is dropped
(:class:`~emqfast.core.errors.ReplyLost`: a marker may have been popped) and the next
wait dials anew. A popped marker only wakes the Worker, which claims anyway; one lost
with a dropped reply costs at most the wait until the next beat.

Redis Cluster cannot do this with markers: each queue's keys live in its own slot and a
multi-key ``BZPOPMIN`` must stay within one slot (CROSSSLOT), so one blocking call covers
one queue, and there is no key a queue's scripts could also write on a node-wide level.
A Cluster client is refused here (:class:`~emqfast.core.errors.BackendUnavailable`); the
way to wait on many queues there is sharded pub/sub (one ``SSUBSCRIBE`` connection per
node carries every slot's channel on that node; the scripts that set a marker would also
``SPUBLISH`` to ``emq:{q}:wake``), the markers staying the durable signal behind it.
"""
from __future__ import annotations

import socket
from typing import Any, Optional, Sequence, Tuple

import redis

from emqfast.backends.transport import read_reply
from emqfast.core import deadlines, errors
from emqfast.core.errors import BackendUnavailable, InvalidInput

Popped = Tuple[str, bytes, float]  # (marker key, member, score)


class ManyMarkers:
    """``wait(keys, timeout_s)``: one ``BZPOPMIN`` over every key, on one connection of its
    own (taken from ``client``'s pool on first use, held until :meth:`close`).

    One instance per blocking thread (it owns its connection). Not thread-safe.
    """

    def __init__(self, client: Any):
        if not isinstance(client, redis.Redis) or getattr(client, "connection_pool", None) \
                is None:
            raise BackendUnavailable(
                "ManyMarkers needs a single-server redis.Redis client: on Redis Cluster a "
                "BZPOPMIN over queues in different slots is CROSSSLOT")
        self._client = client
        self._conn: Any = None

    def wait(self, keys: Sequence[str], timeout_s: float) -> Optional[Popped]:
        """Pop ``(key, member, score)`` from the first of the marker zsets ``keys`` to hold
        one, or None after ``timeout_s`` (Redis ends the block on its ``hz`` tick: up to
        ~100 ms late). Connection failures are typed (ReplyLost, ConnectionFailed, ...)."""
        if not keys:
            raise InvalidInput("ManyMarkers.wait needs at least one marker key")
        timeout_s = max(float(timeout_s), 0.001)
        conn = self._connection()
        deadline = deadlines.blocking_read_timeout(timeout_s, conn.socket_timeout)
        try:
            conn.send_command("BZPOPMIN", *keys, timeout_s)
            reply = read_reply(conn, deadline)
        except redis.ResponseError as exc:  # a whole reply: the connection is in step
            raise errors.translate(exc) from exc
        except BaseException as exc:
            # a blocking call half read (or never answered) must not be reused
            self._drop()
            if isinstance(exc, Exception):
                raise errors.translate(exc, sent=True) from exc
            raise
        if reply is None:
            return None
        key = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return key, reply[1], float(reply[2])

    def close(self) -> None:
        """Release the dedicated connection."""
        self._drop()

    def interrupt(self) -> None:
        """Cut the wait in progress short, from another thread (no I/O): its socket is
        shut, so the wait raises at once and drops the connection."""
        sock = getattr(self._conn, "_sock", None) if self._conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass

    def _connection(self) -> Any:
        if self._conn is None:
            pool = self._client.connection_pool
            try:
                self._conn = pool.get_connection()
            except Exception as exc:  # noqa: BLE001 - typed (PoolExhausted, ConnectionFailed)
                raise errors.translate(exc, sent=False) from exc
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.disconnect()
            self._client.connection_pool.release(conn)
