"""What the members of a many-queue thread Worker share, so that its connections do not
grow with its queues (a Worker over 200 queues holds about as many as one over 2):

- :class:`SharedMarkers`: one blocking connection waits on every queue's wake marker
  (:class:`~emqfast.backends.markers.ManyMarkers`, one ``BZPOPMIN`` over all the keys);
  each member's claim loop waits on its own slot of it, to the millisecond;
- one cancel listener (:class:`~emqfast.worker.cancel_listener.CancelListener`) subscribed to
  every queue's cancel channel, each message routed to its queue's member;
- :func:`gated`: a member's Redis requests pass a gate of a few at a time, so claim
  loops of many queues waking at once cannot take more of the client's pool than that.

Where the queues do not share one single-server client (Redis Cluster: each queue's
marker lives in its own slot), each member keeps its own marker wait.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, ContextManager, Dict, Generator, List, Optional, Sequence, Tuple

from emqfast.backends.markers import ManyMarkers
from emqfast.core.ops import WAITS, Logic
from emqfast.worker.resend import Backoff, typed

log = logging.getLogger("emqfast.worker")

Popped = Tuple[bytes, float]  # (marker member, score)
POLL_S = 5.0  # one shared BZPOPMIN's block time: a marker set meanwhile ends it at once
GATE_MOST = 16  # Redis requests of a many-queue Worker's claim loops in flight at once


class SharedMarkers:
    """Waits on the marker keys ``keys`` (all on ``client``) for every member at once.

    A thread of its own blocks on all the markers while any member is serving; what it
    pops is kept for that queue's member (the earliest score when several wait: one due
    now must not be hidden by a later run-at), whose :meth:`wait` returns it at once.
    A marker only ever wakes a claim loop, which claims anyway, so popping one for a
    member that is busy claiming loses nothing.
    """

    def __init__(self, client: Any, keys: Sequence[str], who: str):
        self._client = client
        self._markers: Optional[ManyMarkers] = None  # the waiting thread's own
        self._keys = list(keys)
        self._who = who
        self._cond = threading.Condition()
        self._popped: Dict[str, Popped] = {}
        self._interrupted: Dict[str, bool] = {}
        self._users = 0
        self._thread: Optional[threading.Thread] = None

    # --- a member's side -----------------------------------------------------------------
    def wait(self, key: str, timeout_s: float) -> Optional[Popped]:
        """``(member, score)`` popped from marker ``key``, or None after ``timeout_s`` (or
        when :meth:`interrupt` ends the wait)."""
        end = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            while key not in self._popped:
                if self._interrupted.pop(key, False):
                    return None
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._popped.pop(key)

    def interrupt(self, key: str) -> None:
        """End the member's wait on ``key`` now (no I/O: a stop, or a signal handler)."""
        with self._cond:
            self._interrupted[key] = True
            self._cond.notify_all()

    def open(self) -> None:
        """A member begins serving: the waiting thread runs while any member does."""
        with self._cond:
            self._users += 1
            if self._thread is None:
                # each thread its own connection: one that is ending may still hold its
                self._markers = ManyMarkers(self._client)
                self._thread = threading.Thread(target=self._run, args=(self._markers,),
                                                name="emq-markers", daemon=True)
                self._thread.start()

    def close(self) -> None:
        """A member stopped serving; the last one ends the waiting thread (its blocking
        call is cut short: the connection is dropped)."""
        with self._cond:
            self._users = max(self._users - 1, 0)
            if self._users:
                return
            self._interrupted.clear()
            thread, self._thread = self._thread, None
            markers, self._markers = self._markers, None
            self._cond.notify_all()
        if markers is not None:
            markers.interrupt()
        if thread is not None:
            thread.join(timeout=2.0)

    # --- the waiting thread ----------------------------------------------------------------
    def _run(self, markers: ManyMarkers) -> None:
        backoff = Backoff(0.05, 2.0)
        me = threading.current_thread()
        try:
            self._serve(markers, me, backoff)
        finally:
            markers.close()

    def _serve(self, markers: ManyMarkers, me: threading.Thread, backoff: Backoff) -> None:
        while self._thread is me:
            try:
                got = markers.wait(self._keys, POLL_S)
            except Exception as exc:  # noqa: BLE001 - the members wake on their beat meanwhile
                if self._thread is not me:
                    return
                wait = backoff()
                log.warning("%s: the shared marker wait failed (%s); again in %.2fs",
                            self._who, type(typed(exc)).__name__, wait)
                with self._cond:
                    self._cond.wait(wait)
                continue
            backoff.reset()
            if got is not None:
                key, member, score = got
                with self._cond:
                    kept = self._popped.get(key)
                    if kept is None or score < kept[1]:
                        self._popped[key] = (member, score)
                    self._cond.notify_all()


class MemberMarkers:
    """One member's view of :class:`SharedMarkers`, in the place of its own MarkerWaiter
    (the same ``wait`` / ``interrupt`` / ``close``)."""

    def __init__(self, shared: SharedMarkers, key: str):
        self._shared, self._key = shared, key

    def wait(self, key: str, timeout_s: float) -> Optional[Popped]:
        return self._shared.wait(key, timeout_s)

    def interrupt(self) -> None:
        self._shared.interrupt(self._key)

    def close(self) -> None:
        """Nothing: the connection is the shared wait's."""


def gated(logic: Logic, gate: ContextManager[Any]) -> Generator[Any, Any, Any]:
    """``logic`` with each of its Redis requests performed inside ``gate`` (its waits are
    not: a claim loop asleep on its marker holds no place)."""
    reply: Any = None
    thrown: Optional[BaseException] = None
    try:
        while True:
            request = logic.throw(thrown) if thrown is not None else logic.send(reply)
            thrown = None
            try:
                if isinstance(request, WAITS):
                    reply = yield request
                else:
                    with gate:
                        reply = yield request
            except GeneratorExit:
                raise
            except BaseException as exc:  # noqa: BLE001 - thrown into the logic, as drivers do
                thrown = exc
    except StopIteration as done:
        return done.value
    finally:
        logic.close()


def shared_client(queues: Sequence[Any]) -> Any:
    """The one single-server client every queue uses, or None (several clients, or a
    Cluster: each member then keeps its own marker wait)."""
    clients: List[Any] = list({id(q.redis): q.redis for q in queues}.values())
    if len(clients) != 1:
        return None
    try:
        ManyMarkers(clients[0])
    except Exception:  # noqa: BLE001 - BackendUnavailable: a Cluster client
        return None
    return clients[0]


def gate_size(client: Any) -> int:
    """How many requests the claim loops may have in flight: a quarter of the client's
    pool, at most :data:`GATE_MOST` (the rest stays for the handlers and the acker)."""
    pool = getattr(client, "connection_pool", None)
    most = getattr(pool, "max_connections", None) or 100
    return max(1, min(GATE_MOST, int(most) // 4))
