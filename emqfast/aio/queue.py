"""The asyncio facade: the sync classes with an asyncio driver.

Every public method of :class:`emqfast.Queue`, its ``schedules`` and ``groups`` and
:class:`emqfast.Leaderboard` is an :mod:`emqfast.core.ops` generator; these subclasses
swap the driver (each method returns a coroutine here) and what asyncio needs besides
(one client per event loop, an async ``events`` iterator, ``aclose``), so the logic
(validation, keys, scripts, reply parsing) is the very same code. One shortcut: an
``enqueue`` without options joins the group commit directly, not through the generator
driver (the same checks, Entry, gate and flush; see :meth:`Queue._enqueue_plain`).
"""
from __future__ import annotations

import asyncio
import functools
import weakref
from typing import (TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Dict, Iterable,
                    Literal, NamedTuple, Optional)

from emqfast.backends import gather
from emqfast.core import codec
from emqfast.core.ops import Gathered
from emqfast.core.validation import check_new_job_id
from emqfast.facade.group_commit import LIMIT, UNMINTED, entry_of
from emqfast.facade.job import JobRef

from emqfast.facade import promote as bulk  # promote_many
from emqfast.facade.events import Event, Waits, block_chunk_ms, check_position
from emqfast.facade.groups import Groups as _SyncGroups
from emqfast.facade.leaderboard import Leaderboard as _SyncLeaderboard
from emqfast.core.ops import Op
from emqfast.backends.drive import run_async
from emqfast.facade.queue import Queue as _SyncQueue
from emqfast.facade.partitioned import PartitionedQueue as _SyncPartitioned
from emqfast.facade.schedules import Schedules as _SyncSchedules
from emqfast.core.validation import check_int
from emqfast.aio.connection import LoopClients, resolve
from emqfast.aio.job_wait import AioQueueWaiting


_tuple_new = tuple.__new__


class _Lane(NamedTuple):
    """What a plain enqueue of one Queue needs in one event loop (see Queue._plain_lane)."""

    loop: "weakref.ref[asyncio.AbstractEventLoop]"
    forks: int  # gather.forks() when made: a forked child makes its own
    gate: Any  # the loop client's gate (emqfast.backends.gather)
    drive: Callable[[Op], Awaitable[Any]]  # runs a flush over the loop's client


class Schedules(_SyncSchedules):
    """:class:`emqfast.facade.schedules.Schedules` of an asyncio queue: each method is
    awaited (``await q.schedules.list()``)."""

    is_async: Literal[True] = True


class Groups(_SyncGroups):
    """:class:`emqfast.facade.groups.Groups` of an asyncio queue: each method is awaited."""

    is_async: Literal[True] = True


class Queue(AioQueueWaiting, _SyncQueue):
    """:class:`emqfast.Queue` over ``redis.asyncio``: ``await q.enqueue(...)``.

    Bulk enqueue goes through ``redis.asyncio`` pipelines, not the C Batcher
    (a blocking socket that would stall the event loop). ``q.schedules`` works
    as in sync, awaited; use ``await q.schedules.count()`` for ``len()``.
    """

    is_async = True
    if TYPE_CHECKING:  # the sync resolver returns a blocking client, this one an asyncio one
        @staticmethod
        def _resolve(conn: Any) -> Any: ...
    else:
        _resolve = staticmethod(resolve)

    @property
    def redis(self) -> Any:
        """The client for the running event loop: the one given serves the first loop
        that uses it, others get a copy (see :class:`emqfast.aio.connection.LoopClients`),
        so a Queue made at import time works under several ``asyncio.run`` calls."""
        return self._clients.current()

    @redis.setter
    def redis(self, client: Any) -> None:
        self._clients = LoopClients(client)
        self._lane: Optional[_Lane] = None  # see _plain_lane

    if not TYPE_CHECKING:  # the checker keeps the base's type: enqueue(...) -> Awaitable[JobRef]
        def enqueue(self, payload: Any, *, job_id: Optional[str] = None,
                    **options: Any) -> "Awaitable[JobRef]":
            """:meth:`emqfast.Queue.enqueue`, awaited: the same checks, writes and refs.

            A job with no options (the common case) takes a shorter way into the group
            commit than the general operation: the same Entry, gate and flush
            (:mod:`emqfast.facade.group_commit`), without the generator driver around it."""
            if options or not self.group_commit:
                return self._drive(_SyncQueue.enqueue.op(self, payload, job_id=job_id,
                                                         **options))
            return self._enqueue_plain(payload, job_id)

        enqueue.op = _SyncQueue.enqueue.op  # the generator, for operations that yield from it

    async def _enqueue_plain(self, payload: Any, job_id: Optional[str]) -> JobRef:
        """One job without options through the group commit (validated and encoded here,
        before it joins anything: a bad one fails alone, nothing sent)."""
        data, enc = codec.encode(payload, self.max_payload_bytes)
        # its id is minted by its flush, with the others' (cheaper than one by one)
        entry = entry_of(UNMINTED if job_id is None else check_new_job_id(job_id), data, enc,
                         self._plain_shared())
        loop, lane = asyncio.get_running_loop(), self._lane
        if lane is None or lane.loop() is not loop or lane.forks != gather.forks():
            lane = self._plain_lane()
        # (the named tuple built as a plain tuple: its Python-level __new__ is per job)
        outcome = await gather.submit_to_async(
            lane.gate, _tuple_new(Gathered, (self._gather_key, entry, self._flush, LIMIT)),
            lane.drive, loop)
        if isinstance(outcome, BaseException):
            raise outcome
        return self._bind(outcome)

    def _plain_lane(self) -> "_Lane":
        """This loop's client, its group-commit gate and flush driver, kept until another
        loop (or a forked child) enqueues: looked up once, not per job."""
        client = self._clients.current()
        self._lane = _Lane(weakref.ref(asyncio.get_running_loop()), gather.forks(),
                           gather.gate_async(client, self._gather_key),
                           functools.partial(run_async, client))
        return self._lane

    def _drive(self, op: Op) -> Any:
        # the client is picked once running (a coroutine made outside its loop still
        # works), by run_async itself: no coroutine layer around it on the hot path
        return run_async(None, op, client_of=self._clients.current)

    @property
    def schedules(self) -> Schedules:
        """Repeatable schedules of this queue, awaited (see :mod:`emqfast.facade.schedules`)."""
        parts = self._schedules
        if not isinstance(parts, Schedules):
            parts = self._schedules = Schedules(self)
        return parts

    @property
    def groups(self) -> Groups:
        """Group lanes of this queue, awaited (see :mod:`emqfast.facade.groups`)."""
        parts = self._groups
        if not isinstance(parts, Groups):
            parts = self._groups = Groups(self)
        return parts

    def _live_batcher(self) -> Any:  # pragma: no cover - the async driver never asks for one
        raise TypeError("emqfast.aio.Queue has no blocking Batcher")

    # an async iterator where the sync Queue's is a plain one: a deliberate API difference
    # (``async for``), not a third party; the one override the checker must be told of
    async def events(self, since: str = "0-0", *, block_ms: Optional[int] = None,  # type: ignore[override]
                     count: int = 100) -> AsyncIterator[Event]:
        """:meth:`emqfast.Queue.events` as an async iterator: ``async for ev in q.events()``."""
        since = check_position(since)
        if block_ms is not None:
            check_int(block_ms, "block_ms", 0, 1 << 40)
        if since == "$":
            since = await self.last_event_id()
        waits = Waits(block_ms, block_chunk_ms(self.redis))
        while True:
            wait = waits.next()
            if wait == -1:
                return
            batch = await self.read_events(since, count=count, block_ms=wait)
            if batch:
                for event in batch:
                    yield event
                since = batch[-1].id
                waits.restart()
            elif wait is None:
                return

    async def aclose(self) -> None:
        """Close the client's connections (when this queue's client is not shared)."""
        await self.redis.aclose()


class Leaderboard(_SyncLeaderboard):
    """:class:`emqfast.Leaderboard` over ``redis.asyncio``: ``await board.top(10)``."""

    if TYPE_CHECKING:  # as Queue's, above
        @staticmethod
        def _resolve(conn: Any) -> Any: ...
    else:
        _resolve = staticmethod(resolve)

    def _drive(self, op: Op) -> Any:
        return run_async(self.redis, op)


async def promote_many(conn: Any, queues: Iterable[Any], limit: int = 1000) -> Dict[str, int]:
    """:func:`emqfast.promote_many` over ``redis.asyncio`` (two pipelined passes)."""
    queues = list(queues)
    keys = bulk.validate(queues, limit)  # before anything is sent, or connected
    return bulk.fold_partitions(queues, await run_async(resolve(conn),
                                                        bulk.promote_many_op(keys, limit)))


class PartitionedQueue(_SyncPartitioned, Queue):  # type: ignore[misc]
    """:class:`emqfast.facade.partitioned.PartitionedQueue` over ``redis.asyncio``: what
    ``emqfast.aio.Queue(name, conn, partitions=P)`` returns; its partitions are aio
    Queues and each method is awaited (``await q.partition_for(...)`` is not: no I/O)."""

    _plain = Queue

    def _given_client(self) -> Any:
        return self._clients.template


Queue._partitioned = PartitionedQueue
