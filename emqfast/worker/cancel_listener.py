"""The thread Worker's stop listeners: :class:`CancelListener` (a thread hearing the
cancel channels over pub/sub) and :class:`TimeoutTimer` (a thread firing each run's
timeout and the grace after a stop). What a stop does is the machine's
(:mod:`emqfast.worker.cancels`)."""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from emqfast.worker.cancels import Deadlines
from emqfast.worker.resend import Backoff, typed

log = logging.getLogger("emqfast.worker")

# How long one cancel-channel read waits. close() does not wait for it to run out: it shuts
# the listener's socket, which ends the read at once (a Worker's stop stays instant).
_POLL_S = 5.0


class CancelListener:
    """Hears the cancel channels on ``client`` (sync redis-py, or Cluster): ``routes`` maps
    each channel to what hears its job ids (one connection for every queue of a Worker)."""

    def __init__(self, client: Any, routes: Dict[str, Callable[[str], None]],
                 on_subscribed: Callable[[], None], who: str):
        self._client, self._routes = client, dict(routes)
        self._channels = list(self._routes)
        self._on_subscribed, self._who = on_subscribed, who
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._pubsub: Any = None  # the live pub/sub, for close() to cut its read short
        self._backoff = Backoff(0.05, 2.0)  # between re-subscribes after losses
        self.subscribed = threading.Event()  # set while subscribed (tests wait on it)

    def start(self) -> None:
        self._closed.clear()
        self._thread = threading.Thread(target=self._run, name="emq-cancels", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening (returns once the thread ended, or after a couple of seconds)."""
        self._closed.set()
        _cut(self._pubsub)
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2.0)

    def _run(self) -> None:
        backoff = self._backoff
        while not self._closed.is_set():
            try:
                self._listen()
                return
            except Exception as exc:  # noqa: BLE001 - re-subscribe; the beat covers the gap
                self.subscribed.clear()
                if self._closed.is_set():  # close() cut the connection: not a loss
                    return
                wait = backoff()
                log.warning("%s: cancel listener lost its connection (%s); re-subscribing "
                            "in %.2fs", self._who, type(typed(exc)).__name__, wait)
                self._closed.wait(wait)

    def _listen(self) -> None:
        pubsub = self._pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            if self._closed.is_set():  # closed while this connection was being made
                return
            pubsub.subscribe(*self._channels)
            self._backoff.reset()  # a loss after this one waits the first step again
            self.subscribed.set()
            self._on_subscribed()
            while not self._closed.is_set():
                message = pubsub.get_message(timeout=_POLL_S)
                if message and message.get("type") == "message":
                    route = self._routes.get(_text(message["channel"]))
                    if route is not None:
                        route(_text(message["data"]))
        finally:
            self.subscribed.clear()
            self._pubsub = None
            try:
                pubsub.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cut(pubsub: Any) -> None:
    """Shut the socket of ``pubsub``'s connection (from another thread): its blocked read
    ends at once with a connection error, which the closed listener takes as its end."""
    connection = getattr(pubsub, "connection", None) if pubsub is not None else None
    sock = getattr(connection, "_sock", None)
    if sock is None:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


class TimeoutTimer:
    """Hands each passed deadline ``(job id, token, kind)`` to ``on_due`` (its thread)."""

    def __init__(self, on_due: Callable[[str, str, str], None]):
        self._on_due = on_due
        self._deadlines = Deadlines()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def add(self, at: float, job_id: str, token: str, kind: str) -> None:
        """``on_due(job_id, token, kind)`` at ``at`` (monotonic s)."""
        with self._cond:
            if self._closed:
                return
            if self._deadlines.add(at, job_id, token, kind):
                self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="emq-timeouts",
                                                daemon=True)
                self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=2.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                due: List[Tuple[str, str, str]] = []
                while not self._closed and not due:
                    due = self._deadlines.due(time.monotonic())
                    if not due:
                        nxt = self._deadlines.next_at()
                        self._cond.wait(None if nxt is None else max(nxt - time.monotonic(), 0))
                if self._closed:
                    return
            for job_id, token, kind in due:
                try:
                    self._on_due(job_id, token, kind)
                except Exception:  # noqa: BLE001 - one job's stop must not end the timer
                    log.exception("stopping timed-out job %r failed", job_id)

