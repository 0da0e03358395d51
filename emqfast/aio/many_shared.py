"""What the members of a many-queue asyncio Worker share, so that its connections do not
grow with its queues (the asyncio twin of :mod:`emqfast.worker.many_shared`):

- :class:`AioSharedMarkers`: one task blocks on every queue's wake marker over one
  connection (``BZPOPMIN`` over all the keys, read with a deadline); each member's claim
  loop waits on its own slot of it, to the millisecond;
- one cancel listener (:class:`~emqfast.aio.cancel_listener.AioCancelListener`) on every
  queue's cancel channel, each message routed to its queue's member;
- a gate (``asyncio.Semaphore``) on the members' Redis requests, so claim loops of many
  queues waking at once cannot take more of the client's pool than a few connections.

:class:`SharedParts` holds them for one run (:meth:`emqfast.aio.crew.AioCrew.shared`).
Where the queues do not share one single-server ``redis.asyncio`` client (a Cluster: each
queue's marker lives in its own slot), each member keeps its own marker wait and listener.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Dict, Optional, Sequence, Tuple

from emqfast.aio import tasks
from emqfast.aio.cancel_listener import AioCancelListener
from emqfast.core import deadlines
from emqfast.server import eviction
from emqfast.worker.many_shared import POLL_S, gate_size
from emqfast.worker.resend import Backoff, typed

log = logging.getLogger("emqfast.worker")

Popped = Tuple[bytes, float]  # (marker member, score)


class AioSharedMarkers:
    """Waits on the marker keys ``keys`` (all on ``client``) for every member at once; what
    it pops is kept for that queue's member (the earliest score when several wait), whose
    :meth:`wait` returns it at once. A marker only wakes a claim loop, which claims anyway."""

    def __init__(self, client: Any, keys: Sequence[str], who: str):
        self._client, self._keys, self._who = client, list(keys), who
        self._popped: Dict[str, Popped] = {}
        self._interrupted: Dict[str, bool] = {}
        self._events: Dict[str, asyncio.Event] = {}
        self._users = 0
        self._task: Optional["asyncio.Task[None]"] = None

    async def wait(self, key: str, timeout_s: float) -> Optional[Popped]:
        """``(member, score)`` popped from marker ``key``, or None after ``timeout_s`` (or
        when :meth:`interrupt` ends the wait)."""
        if key not in self._popped and not self._interrupted.get(key):
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = asyncio.Event()  # (made on the running loop)
            event.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), max(timeout_s, 0.0))
        if self._interrupted.pop(key, False):
            return None
        return self._popped.pop(key, None)

    def interrupt(self, key: str) -> None:
        """End the member's wait on ``key`` now (no I/O: a stop)."""
        self._interrupted[key] = True
        event = self._events.get(key)
        if event is not None:
            event.set()

    def in_use(self) -> bool:
        return self._users > 0

    def open(self) -> None:
        """A member begins serving: the waiting task runs while any member does."""
        self._users += 1
        if self._task is None:
            self._task = tasks.spawn(self._run(), name="emq-markers")

    async def close(self) -> None:
        """A member stopped serving; the last one ends the waiting task."""
        self._users = max(self._users - 1, 0)
        if self._users:
            return
        self._interrupted.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=2.0)

    async def _run(self) -> None:
        backoff = Backoff(0.05, 2.0)
        pool = self._client.connection_pool
        conn: Any = None
        try:
            while True:
                try:
                    if conn is None:
                        conn = await pool.get_connection()
                    got = await self._pop(conn)
                except Exception as exc:  # noqa: BLE001 - the members wake on their beat
                    if conn is not None:  # a blocking call half read is never reused
                        await _drop(pool, conn)
                        conn = None
                    wait = backoff()
                    log.warning("%s: the shared marker wait failed (%s); again in %.2fs",
                                self._who, type(typed(exc)).__name__, wait)
                    await asyncio.sleep(wait)
                    continue
                backoff.reset()
                if got is not None:
                    self._deliver(*got)
        finally:
            if conn is not None:
                await asyncio.shield(_drop(pool, conn))

    async def _pop(self, conn: Any) -> Optional[Tuple[str, bytes, float]]:
        await conn.send_command("BZPOPMIN", *self._keys, POLL_S)
        reply = await conn.read_response(
            timeout=deadlines.blocking_read_timeout(POLL_S, getattr(conn, "socket_timeout",
                                                                     None)))
        if reply is None:
            return None
        key = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
        return key, reply[1], float(reply[2])

    def _deliver(self, key: str, member: bytes, score: float) -> None:
        kept = self._popped.get(key)
        if kept is None or score < kept[1]:
            self._popped[key] = (member, score)
        event = self._events.get(key)
        if event is not None:
            event.set()


async def _drop(pool: Any, conn: Any) -> None:
    with contextlib.suppress(Exception):
        await conn.disconnect()
    with contextlib.suppress(Exception):
        await pool.release(conn)


class AioMemberMarkers:
    """One member's view of :class:`AioSharedMarkers`, in the place of its own
    MarkerWaiter (the same ``wait`` / ``interrupt`` / ``close``)."""

    def __init__(self, shared: AioSharedMarkers, key: str):
        self._shared, self._key = shared, key

    async def wait(self, key: str, timeout_s: float) -> Optional[Popped]:
        return await self._shared.wait(key, timeout_s)

    def interrupt(self) -> None:
        self._shared.interrupt(self._key)

    async def close(self) -> None:
        """Nothing: the connection is the shared wait's."""


class SharedParts:
    """The shared marker wait, listener and gate of one many-queue asyncio Worker (made on
    its loop by the first member to serve)."""

    def __init__(self, client: Any, members: Sequence[Any], name: str):
        self.client = client
        self.members = list(members)
        self.markers = AioSharedMarkers(client, [m._keys.marker for m in members],
                                        f"aio worker {name}")
        self.gate = asyncio.Semaphore(gate_size(client))
        self.listener: Optional[AioCancelListener] = None
        self.listening = 0
        self.name = name
        self.loop = asyncio.get_running_loop()
        self._eviction: Optional[Tuple[Optional[str]]] = None  # the check's warning, once

    def listener_open(self) -> AioCancelListener:
        self.listening += 1
        if self.listener is None:
            routes = {m._keys.cancel_channel: m._on_cancel for m in self.members}
            self.listener = AioCancelListener(self.client, routes, self._recheck_cancels,
                                              f"aio worker {self.name}")
            self.listener.start()
        return self.listener

    async def listener_close(self) -> None:
        self.listening = max(self.listening - 1, 0)
        if self.listening:
            return
        listener, self.listener = self.listener, None
        if listener is not None:
            await listener.close()

    async def eviction(self, client: Any) -> Optional[str]:
        """The eviction check's warning, read once for the whole Worker."""
        async with self.gate:
            if self._eviction is None:
                self._eviction = (await eviction.check_async(client),)
        return self._eviction[0]

    async def _recheck_cancels(self) -> None:
        """The listener (re-)subscribed: each queue's running jobs' cancel marks are read."""
        for m in self.members:
            await m._drive(m._recheck_cancels())
