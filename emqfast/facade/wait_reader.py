"""The pub/sub side of ``ref.wait()`` for the sync facade: one connection per client and
process, shared by every wait.

A :class:`Registry` owns one redis-py ``PubSub`` and the one thread that reads it; no other
thread touches that socket (a TLS socket must not be read and written by two threads at
once). Waits hand it SUBSCRIBE/UNSUBSCRIBE requests; it sends them when it wakes, and a
wait that needs a new channel wakes it by PUBLISHing to the registry's own wake channel
``emq:wake:<random>`` (on the normal connection; the reader is subscribed to it). So the
reader blocks on its socket alone: no poll of Redis, no timer loop while nothing happens
(it wakes every :data:`LINGER_S` to leave once unused).

Each wait is a :class:`Waiter`: its channels, which of them Redis confirmed, the outcomes
that arrived. A channel is SUBSCRIBEd once however many waiters want it (1,000 refs of one
process waited together: one connection, one SUBSCRIBE of their channels), and
UNSUBSCRIBEd when its last waiter leaves. "Confirmed" means Redis has processed the
latest SUBSCRIBE of the channel (replies come in order: a count of the ones still due).

Connections stay O(1) in waits: besides the pub/sub one, a wait's own commands (its
register, read and unregister scripts, the wake PUBLISH) go through :attr:`Registry.lanes`,
at most :data:`IO_LANES` at a time per client and process, so 1,000 threads waiting on one
client queue here for a moment instead of each taking a pool connection (redis-py's pool
holds 100 by default). A wake is published only when none is already on its way.

When the connection drops the reader opens a new one, re-subscribes every channel, and
tells each waiter to re-read its jobs once confirmed again (:meth:`Waiter.take`'s
``recheck``): an end published while it was down is not missed.

A Cluster client's pub/sub connection goes to one node: PUBLISH is broadcast to all.
Per process: a forked child makes its own registry (the parent's thread is not there).
"""
from __future__ import annotations

import os
import threading
import time
import uuid
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from emqfast.core import deadlines
from emqfast.core.errors import ConnectionFailed, EmqError, translate
from emqfast.facade.wait_channels import ChannelBook, Liveness

LINGER_S = 5.0  # an unused reader waits this long for a new wait before it closes
QUIET_S = 5.0  # a pub/sub connection this long without a message is PINGed
PING = b"emqfast-alive"  # our PING's payload (redis-py's own health checks are its own)
IO_LANES = 4  # a client's wait commands in flight at once per process (pool connections)
RETRY_S = (0.05, 2.0)  # re-connect backoff after a dropped pub/sub connection: first, most


class Waiter:
    """One wait's channels and what happened on them (thread-safe)."""

    def __init__(self, channels: List[bytes]):
        self.cond = threading.Condition()
        self.unconfirmed: Set[bytes] = set(channels)
        self.arrived: Dict[bytes, bytes] = {}  # channel -> outcome published
        self.stale: Set[bytes] = set()  # re-subscribed after a drop: re-read once confirmed
        self.started = False  # its channels were confirmed once (it registered)
        self.error: Optional[BaseException] = None  # the connection failed before that

    def failed(self, exc: BaseException) -> None:
        with self.cond:
            if not self.started:
                self.error = exc
                self.cond.notify_all()

    def confirmed(self, channel: bytes) -> None:
        with self.cond:
            self.unconfirmed.discard(channel)
            self.cond.notify_all()

    def message(self, channel: bytes, outcome: bytes) -> None:
        with self.cond:
            self.arrived[channel] = outcome
            self.cond.notify_all()

    def lost(self, channel: bytes) -> None:
        with self.cond:
            self.unconfirmed.add(channel)
            self.stale.add(channel)

    def wait_confirmed(self, deadline: Optional[float]) -> bool:
        """Block until Redis confirmed every channel (False: the deadline passed first)."""
        with self.cond:
            done = self.cond.wait_for(lambda: not self.unconfirmed or self.error is not None,
                                      _left(deadline))
            if self.error is not None:  # never subscribed: say why (ConnectionFailed, ...)
                raise self.error
            self.started = done
            return done

    def _ready(self) -> Tuple[Dict[bytes, bytes], Set[bytes]]:
        arrived, self.arrived = self.arrived, {}
        stale = {c for c in self.stale if c not in self.unconfirmed}
        self.stale -= stale
        return arrived, stale

    def take(self, deadline: Optional[float]) -> Tuple[Dict[bytes, bytes], Set[bytes]]:
        """Block until an outcome arrived or a re-subscribed channel is confirmed; returns
        (arrived: channel -> outcome, recheck: channels to re-read); both empty: timed out."""
        with self.cond:
            arrived, stale = self._ready()
            while not arrived and not stale:
                left = _left(deadline)
                if left is not None and left <= 0:
                    break
                self.cond.wait(left)
                arrived, stale = self._ready()
            return arrived, stale


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def connection_error(exc: BaseException) -> BaseException:
    """emqfast's typed error for a failure of the pub/sub connection."""
    typed = translate(exc, sent=False)
    if isinstance(typed, EmqError):
        return typed
    return ConnectionFailed(f"the pub/sub connection of ref.wait failed: "
                            f"{type(exc).__name__}: {exc}")


def node_client(client: Any) -> Any:
    """The client whose connection reads the channels: ``client`` itself, or for a
    Cluster one node's (messages are broadcast to every node)."""
    if isinstance(client, redis.RedisCluster):
        node = client.get_default_node()  # type: ignore[no-untyped-call]  # (redis-py)
        return client.get_redis_connection(node)
    return client


class Registry:
    """Every wait of one client in this process, over one pub/sub connection."""

    def __init__(self, client: Any):
        # (weak: the registries map is keyed by the client, which must be free to go)
        self._client = weakref.ref(client)
        self.pid = os.getpid()
        self.wake = ("emq:wake:" + uuid.uuid4().hex).encode()
        self._lock = threading.Lock()
        self._book: ChannelBook[Waiter] = ChannelBook()
        self._todo: List[Tuple[str, List[bytes]]] = []
        self._woken = False  # a wake PUBLISH is on its way: the reader takes every todo
        self._thread: Optional[threading.Thread] = None
        self._live = Liveness(QUIET_S, deadlines.READ_TIMEOUT_S)
        # the waits' own commands: a few at a time, never one pool connection per wait
        self.lanes = threading.BoundedSemaphore(IO_LANES)

    @property
    def client(self) -> Any:
        client = self._client()
        if client is None:  # pragma: no cover - a wait holds its queue, which holds it
            raise redis.ConnectionError("the client of this wait is gone")
        return client

    def add(self, waiter: Waiter, channels: List[bytes]) -> None:
        """Subscribe ``waiter`` to ``channels`` (each confirmed to it when Redis has it)."""
        with self._lock:
            new, ready = self._book.add(waiter, channels)
            if new:
                self._todo.append(("subscribe", new))
            started = self._thread is None
            if started:
                self._thread = threading.Thread(target=self._run, name="emqfast-waiters",
                                                daemon=True)
                self._thread.start()
            wake = self._needs_wake(bool(new) and not started)
        for ch in ready:
            waiter.confirmed(ch)
        if wake:  # the running reader is blocked on its socket: wake it
            try:
                self._publish_wake()
            except redis.RedisError as exc:
                raise connection_error(exc) from None

    def remove(self, waiter: Waiter, channels: List[bytes]) -> None:
        """Drop ``waiter``; channels nobody waits on any more are unsubscribed by the
        reader, woken for it (a message on them meanwhile is dropped)."""
        with self._lock:
            gone = self._book.remove(waiter, channels)
            if gone:
                self._todo.append(("unsubscribe", gone))
            wake = self._needs_wake(bool(gone) and self._thread is not None)
        if wake:
            try:
                self._publish_wake()
            except redis.RedisError:
                pass  # the reader unsubscribes when it next wakes anyway

    def _needs_wake(self, wanted: bool) -> bool:
        """Whether this caller publishes the wake (under the lock): not when one is on
        its way already, since the reader takes every todo when it wakes."""
        if not wanted or self._woken:
            return False
        self._woken = True
        return True

    def _publish_wake(self) -> None:
        try:
            with self.lanes:
                self.client.publish(self.wake, b"")
        except BaseException:
            with self._lock:
                self._woken = False  # none on its way after all
            raise

    # --- the reader thread -----------------------------------------------------------------
    def _open(self, lost: bool) -> Any:
        """A new pub/sub connection subscribed to the wake channel and every channel
        waited on (re-subscribed after a drop: their waiters re-read once confirmed)."""
        with self._lock:
            self._todo, self._woken = [], False
            chans = self._book.resubscribed()
        if lost:
            for ch, waiters in chans.items():
                for w in waiters:
                    w.lost(ch)
        pubsub = node_client(self.client).pubsub()
        pubsub.subscribe(self.wake, *chans)
        # a drop must reach _run (which re-reads), not be mended by redis-py's own retries
        # (a client of the user's may have them): it would re-subscribe without a word
        pubsub.connection.retry = Retry(NoBackoff(), 0)
        self._live = Liveness(QUIET_S, deadlines.read_timeout(pubsub.connection.socket_timeout))
        return pubsub

    def _run(self) -> None:
        pubsub, lost, pause = None, False, RETRY_S[0]
        try:
            while True:
                try:
                    if pubsub is None:
                        pubsub = self._open(lost)
                    if not self._step(pubsub):
                        return
                    pause = RETRY_S[0]
                # (any failure: a dropped socket, a pool closed under it: TypeError in
                # redis-py's poll of a closed socket) is a broken connection: re-open
                except Exception as exc:  # noqa: BLE001
                    _close(pubsub)
                    pubsub, lost = None, True
                    with self._lock:
                        if not self._book:  # nobody waits: leave, not re-connect
                            self._thread = None
                            return
                        waiters = self._book.waiters()
                    for w in waiters:  # a wait not yet registered fails; the others wait on
                        w.failed(connection_error(exc))
                    time.sleep(pause)  # the server is away: back off, then re-open
                    pause = min(pause * 2, RETRY_S[1])
        finally:
            _close(pubsub)

    def _step(self, pubsub: Any) -> bool:
        """Send what waits asked for, then read one message (or time out); False when the
        reader is unused and has left."""
        with self._lock:
            todo, self._todo = self._todo, []
            self._woken = False  # a todo added from now on needs a wake of its own
        for verb, chans in todo:
            getattr(pubsub, verb)(*chans)
        msg = pubsub.get_message(timeout=min(LINGER_S, self._live.next_check_s()))
        if msg is not None:
            self._live.heard_now()
        else:
            with self._lock:
                if not self._book and not self._todo:
                    self._thread = None  # the next add starts a new reader
                    return False  # (unused: leave without PINGing a connection we close)
        verdict = self._live.due()
        if verdict == "dead":  # half-open: re-open, re-subscribe, and every wait re-reads
            raise redis.ConnectionError("the pub/sub connection of ref.wait did not answer "
                                        f"a PING within {self._live.deadline_s} s")
        if verdict == "ping":
            pubsub.ping(PING)
            self._live.sent_ping()
        if msg is None:
            return True
        self._dispatch(msg)
        return True

    def _dispatch(self, msg: Dict[str, Any]) -> None:
        kind, ch = msg.get("type"), msg.get("channel")
        if ch == self.wake or not isinstance(ch, bytes):
            return
        with self._lock:
            waiters = self._book.confirmed(ch) if kind == "subscribe" else \
                self._book.listeners(ch)
        if kind == "subscribe":
            for w in waiters:
                w.confirmed(ch)
        elif kind == "message":
            data = msg.get("data")
            for w in waiters:
                w.message(ch, data if isinstance(data, bytes) else str(data).encode())


def _close(pubsub: Any) -> None:
    if pubsub is not None:
        try:
            pubsub.close()
        except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone
            pass


_registries: "weakref.WeakKeyDictionary[Any, Registry]" = weakref.WeakKeyDictionary()
_registries_lock = threading.Lock()


def _forget_after_fork() -> None:
    """A forked child starts with no registry (the parent's reader thread is not there)
    and a fresh lock (another thread of the parent may have held it at the fork)."""
    global _registries, _registries_lock
    _registries = weakref.WeakKeyDictionary()
    _registries_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def registry_for(client: Any) -> Registry:
    """The registry of ``client`` in this process (made on first use)."""
    with _registries_lock:
        reg = _registries.get(client)
        if reg is None or reg.pid != os.getpid():
            reg = _registries[client] = Registry(client)
        return reg
