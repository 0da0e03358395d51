"""``await ref.wait()`` and ``await emqfast.aio.wait_all(refs)``: the asyncio twin of
:mod:`emqfast.facade.job_wait` (the same :class:`~emqfast.facade.job_wait.WaitPlan`, the
same scripts).

Per event loop and client, one :class:`AioRegistry` holds one ``redis.asyncio`` pub/sub
connection and one reader task. Waits SUBSCRIBE/UNSUBSCRIBE on it themselves (one thread:
a write beside the reader's pending read is safe under asyncio), and the reader task hands
each confirmation and message to the :class:`AioWaiter` s that want it. A channel is
subscribed once however many waits want it; the connection closes :data:`LINGER_S` after
its last wait left. A dropped connection is re-opened by the reader, every channel
re-subscribed, and each waiter told to re-read its jobs once Redis confirms them again.
A Cluster client's pub/sub connection goes to one node (PUBLISH reaches every node).
A wait's own commands (register, read, unregister) go through :attr:`AioRegistry.lanes`,
at most :data:`~emqfast.facade.wait_reader.IO_LANES` at a time: 1,000 tasks waiting on one
client hold a handful of pool connections, not one each.
"""
from __future__ import annotations

import asyncio
import time
import uuid
import weakref
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import redis
import redis.asyncio as aredis

from emqfast.core.errors import ConnectionFailed
from emqfast.core import deadlines
from emqfast.facade import wait_reader
from emqfast.facade.wait_channels import ChannelBook, Liveness
from emqfast.facade.wait_reader import IO_LANES, LINGER_S, RETRY_S, connection_error
from emqfast.facade.job_wait import QueueWaiting, WaitPlan, retry_reads


class AioWaiter:
    """One wait's channels and what happened on them (one event loop)."""

    def __init__(self, channels: Iterable[bytes]):
        self.unconfirmed: Set[bytes] = set(channels)
        self.arrived: Dict[bytes, bytes] = {}
        self.stale: Set[bytes] = set()
        self.changed = asyncio.Event()
        self.started = False  # its channels were confirmed once (it registered)
        self.error: Optional[BaseException] = None  # the connection failed before that

    def failed(self, exc: BaseException) -> None:
        if not self.started:
            self.error = exc
            self.changed.set()

    def confirmed(self, channel: bytes) -> None:
        self.unconfirmed.discard(channel)
        self.changed.set()

    def message(self, channel: bytes, outcome: bytes) -> None:
        self.arrived[channel] = outcome
        self.changed.set()

    def lost(self, channel: bytes) -> None:
        self.unconfirmed.add(channel)
        self.stale.add(channel)

    async def _until(self, deadline: Optional[float]) -> bool:
        """Wait for a change (False: the deadline passed)."""
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        try:
            await asyncio.wait_for(self.changed.wait(), left)
        except asyncio.TimeoutError:
            return False
        self.changed.clear()
        return True

    async def wait_confirmed(self, deadline: Optional[float]) -> bool:
        while self.unconfirmed and self.error is None:
            if not await self._until(deadline):
                break
        if self.error is not None:  # never subscribed: say why (ConnectionFailed, ...)
            raise self.error
        self.started = not self.unconfirmed
        return self.started

    def _ready(self) -> Tuple[Dict[bytes, bytes], Set[bytes]]:
        arrived, self.arrived = self.arrived, {}
        stale = {c for c in self.stale if c not in self.unconfirmed}
        self.stale -= stale
        return arrived, stale

    async def take(self, deadline: Optional[float]) -> Tuple[Dict[bytes, bytes], Set[bytes]]:
        arrived, stale = self._ready()
        while not arrived and not stale and await self._until(deadline):
            arrived, stale = self._ready()
        return arrived, stale


async def node_client(client: Any) -> Any:
    """``client``, or for a Cluster a plain client of one node (messages are broadcast)."""
    if not isinstance(client, aredis.RedisCluster):
        return client
    await client.initialize()
    node = client.get_default_node()
    return aredis.Redis(connection_pool=aredis.ConnectionPool(
        connection_class=node.connection_class, **node.connection_kwargs))


class AioRegistry:
    """Every wait of one asyncio client on one loop, over one pub/sub connection."""

    def __init__(self, client: Any):
        self._client = weakref.ref(client)
        self._book: ChannelBook[AioWaiter] = ChannelBook()
        self._pubsub: Any = None
        self._reader: Optional["asyncio.Task[None]"] = None
        self._linger: Optional[asyncio.TimerHandle] = None
        self._sending = asyncio.Lock()  # one SUBSCRIBE/UNSUBSCRIBE at a time
        # the waits' own commands: a few at a time, never one pool connection per wait
        self.lanes = asyncio.Semaphore(IO_LANES)
        self._live = Liveness(wait_reader.QUIET_S, deadlines.READ_TIMEOUT_S)
        # a private channel the connection stays subscribed to while open, so redis-py's
        # PubSub never falls back to its unsubscribed state between waits
        self._idle = ("emq:wake:" + uuid.uuid4().hex).encode()

    async def _subscribe(self, channels: List[bytes]) -> None:
        """SUBSCRIBE on the registry's connection (opened on first use). One at a time:
        redis-py's PubSub opens its connection, and tells a first SUBSCRIBE from later ones,
        by state that two concurrent calls would both find unset."""
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        async with self._sending:
            first: List[bytes] = []
            if self._pubsub is None:
                self._pubsub = (await node_client(self._client())).pubsub()
                first = [self._idle]
            await self._pubsub.subscribe(*channels, *first)
            if first:
                no_retries(self._pubsub)
                self._new_liveness()
        if self._reader is None or self._reader.done():
            self._reader = asyncio.get_running_loop().create_task(self._read())

    async def add(self, waiter: AioWaiter, channels: List[bytes]) -> None:
        new, ready = self._book.add(waiter, channels)
        for ch in ready:
            waiter.confirmed(ch)
        if new:
            try:
                await self._subscribe(new)
            except Exception as exc:  # noqa: BLE001 - typed for the caller
                raise connection_error(exc) from None

    async def remove(self, waiter: AioWaiter, channels: List[bytes]) -> None:
        gone = self._book.remove(waiter, channels)
        if gone and self._pubsub is not None:
            try:
                async with self._sending:
                    if self._pubsub is not None:
                        await self._pubsub.unsubscribe(*gone)
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                pass  # the reader re-opens without them
        if not self._book and self._pubsub is not None and self._linger is None:
            self._linger = asyncio.get_running_loop().call_later(LINGER_S, self._close_idle)

    def _close_idle(self) -> None:
        self._linger = None
        if self._book or self._pubsub is None:
            return
        pubsub, self._pubsub = self._pubsub, None
        if self._reader is not None:
            self._reader.cancel()
            self._reader = None
        asyncio.get_running_loop().create_task(_aclose(pubsub))

    async def _read(self) -> None:
        pause, broken = RETRY_S[0], False
        while self._pubsub is not None:
            try:
                if broken:
                    await self._reopen()
                    broken = False
                msg = await self._pubsub.get_message(timeout=self._live.next_check_s())
                await self._check_alive(msg)
                pause = RETRY_S[0]
            except Exception as exc:  # noqa: BLE001 - any failure of the connection: re-open it
                broken = True
                for w in self._book.waiters():
                    w.failed(connection_error(exc))  # not yet registered: it fails
                await asyncio.sleep(pause)  # the server is away: back off, then re-open
                pause = min(pause * 2, RETRY_S[1])
                continue
            if msg:
                self._dispatch(msg)

    async def _check_alive(self, msg: Any) -> None:
        """PING a quiet connection; one that leaves a PING unanswered past its deadline
        (half-open) is broken: the caller re-opens it and every wait re-reads."""
        if msg is not None:
            self._live.heard_now()
        verdict = self._live.due()
        if verdict == "dead":
            raise redis.ConnectionError("the pub/sub connection of ref.wait did not answer "
                                        f"a PING within {self._live.deadline_s} s")
        if verdict == "ping" and not self._book:  # unused, closing at its linger: no probe
            self._live.heard_now()
        elif verdict == "ping" and self._pubsub is not None:
            async with self._sending:
                await self._pubsub.ping(wait_reader.PING)
            self._live.sent_ping()

    def _new_liveness(self) -> None:
        conn = getattr(self._pubsub, "connection", None)
        self._live = Liveness(wait_reader.QUIET_S,
                              deadlines.read_timeout(getattr(conn, "socket_timeout", None)))

    async def _reopen(self) -> None:
        """A new connection re-subscribed to every channel; their waiters re-read once
        Redis confirms them again."""
        if self._pubsub is None:
            return
        async with self._sending:
            await _aclose(self._pubsub)
            self._pubsub = (await node_client(self._client())).pubsub()
            chans = self._book.resubscribed()
            for ch, waiters in chans.items():
                for w in waiters:
                    w.lost(ch)
            # (the wake channel: a new connection's first SUBSCRIBE, even with no waits)
            await self._pubsub.subscribe(*chans, self._idle)
            no_retries(self._pubsub)
            self._new_liveness()

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        kind, ch = msg.get("type"), msg.get("channel")
        if not isinstance(ch, bytes):
            return
        if kind == "subscribe":
            for w in self._book.confirmed(ch):
                w.confirmed(ch)
        elif kind == "message":
            data = msg.get("data")
            for w in self._book.listeners(ch):
                w.message(ch, data if isinstance(data, bytes) else str(data).encode())


def no_retries(pubsub: Any) -> None:
    """A drop must reach the reader (which re-reads), not be mended by redis-py's own
    retries (a client of the user's may have them): it would re-subscribe without a word."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    pubsub.connection.retry = Retry(NoBackoff(), 0)


async def _aclose(pubsub: Any) -> None:
    try:
        await pubsub.aclose()
    except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone
        pass


_registries: "weakref.WeakKeyDictionary[Any, AioRegistry]" = weakref.WeakKeyDictionary()


def registry_for(client: Any) -> AioRegistry:
    """The registry of ``client`` (an asyncio client serves one loop: emqfast.aio's
    LoopClients gives each loop its own)."""
    reg = _registries.get(client)
    if reg is None:
        reg = _registries[client] = AioRegistry(client)
    return reg


async def wait_all(refs: Iterable[Any], timeout_s: Optional[float] = None, *,
                   return_exceptions: bool = False) -> List[Any]:
    """:func:`emqfast.wait_all` for refs of :class:`emqfast.aio.Queue` s, awaited."""
    plan = WaitPlan(refs, timeout_s, is_async=True)
    waiter = AioWaiter(plan.channel_of)
    added = []

    async def read(q: Any, idxs: List[int], arrived: Dict[bytes, bytes]) -> None:
        for pause in retry_reads(plan.deadline):  # a read is safe to repeat after a blip
            try:
                async with registry_for(q.redis).lanes:
                    replies = await q._wait_read(plan.ids(idxs))
                break
            except ConnectionFailed:
                if pause is None:
                    raise
                await asyncio.sleep(pause)
        plan.took_read(idxs, replies, arrived)
    try:
        for q, idxs in plan.groups:
            reg = registry_for(q.redis)
            added.append((reg, plan.channels(idxs)))
            await reg.add(waiter, plan.channels(idxs))
        if await waiter.wait_confirmed(plan.deadline):
            for q, idxs in plan.groups:
                async with registry_for(q.redis).lanes:
                    plan.took_register(idxs, await q._wait_register(plan.ids(idxs)))
            while plan.pending():
                arrived, recheck = await waiter.take(plan.deadline)
                if not arrived and not recheck:
                    break  # the deadline passed
                for q, idxs in plan.to_read([*arrived, *recheck]):
                    await read(q, idxs, arrived)
        else:  # no time to subscribe: a last look (read only) still sees an ended job
            for q, idxs in plan.groups:
                await read(q, idxs, {})
    finally:
        for reg, chans in added:
            await reg.remove(waiter, chans)
        for q, ids in plan.to_unregister():
            async with registry_for(q.redis).lanes:
                await q._wait_unregister(ids)
    return plan.outcome(return_exceptions)


class AioQueueWaiting(QueueWaiting):
    """The awaited ``ref.wait()`` and ``q.wait_many()`` of :class:`emqfast.aio.Queue`."""

    async def _wait_one(self, job_id: str, timeout_s: Optional[float]) -> Any:
        return (await wait_all([self.ref(job_id)], timeout_s))[0]

    async def wait_many(self, refs: Iterable[Any],  # type: ignore[override]
                        timeout_s: Optional[float] = None, *,
                        return_exceptions: bool = False) -> List[Any]:
        """:meth:`emqfast.Queue.wait_many`, awaited."""
        return await wait_all(self._refs(refs), timeout_s,
                              return_exceptions=return_exceptions)
