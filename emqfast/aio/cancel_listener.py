"""How the asyncio Worker stops running jobs (the rules are in
:mod:`emqfast.worker.cancels`).

A task of the Worker listens on its queues' cancel channels (one pub/sub connection,
re-made with backoff after a loss; after each subscribe, and on the beat, the cancel
marks of the running jobs are re-read, so a message lost meanwhile is caught). A
coroutine handler's task is cancelled (``CancelledError`` at its next ``await``); a plain
handler in its executor thread sees ``job.cancelled`` (a job still waiting for a slot has
its task cancelled: its handler never runs). Timeouts, armed when a handler starts, and
the graces after a stop are ``loop.call_later`` timers. A handler still running
``cancel_grace_ms`` after its stop is abandoned: its outcome is written then, its task
keeps its slot until it ends.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable, Dict, Optional

from emqfast.aio import tasks
from emqfast.worker.resend import Backoff, typed


log = logging.getLogger("emqfast.worker")

_POLL_S = 1.0  # a listener's longest wait for a message
_CANCEL_GRACE_S = 0.2  # how long close() trusts the cancel alone before cutting the socket


class AioCancelListener:
    """Hands every id published on a channel of ``routes`` to that channel's route until
    :meth:`close` (one connection for every queue of a Worker).

    Stopping it takes more than a cancel: when the cancel lands just as a pub/sub read's own
    timeout fires, redis.asyncio can swallow it and read on with no timeout at all (seen
    in CI: a Worker whose listener outlived it hung ``asyncio.run``'s teardown). So the
    loop also stops on a flag and on any cancel request it can count
    (:func:`emqfast.aio.tasks.requests`), and :meth:`close` cuts the connection of a
    read the cancel did not end.
    """

    def __init__(self, client: Any, routes: Dict[str, Callable[[str], None]],
                 on_subscribed: Callable[[], Awaitable[None]], who: str):
        self._client, self._routes = client, dict(routes)  # channel -> who hears its ids
        self._channels = list(self._routes)
        self._on_subscribed, self._who = on_subscribed, who
        self._closed = False
        self._pubsub: Any = None  # the live pub/sub, for close() to cut
        self._task: Optional["asyncio.Task[None]"] = None
        self._backoff = Backoff(0.05, 2.0)  # between re-subscribes after losses
        self.subscribed = asyncio.Event()  # set while subscribed (tests wait on it)

    def start(self) -> None:
        self._closed = False
        self._task = tasks.spawn(self._run(), name="emq-cancels")

    async def close(self) -> None:
        """Stop listening; returns once the task ended (or after a couple of seconds)."""
        self._closed = True
        task, self._task = self._task, None
        if task is None or task.done():
            return
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=_CANCEL_GRACE_S)
        if not done:  # the cancel was swallowed inside redis.asyncio: end the read itself
            log.debug("%s: cancel listener ignored its cancel; cutting its connection",
                      self._who)
            _cut(self._pubsub)
            task.cancel()
            await asyncio.wait([task], timeout=2.0)

    def _stopping(self) -> bool:
        me = asyncio.current_task()
        return self._closed or (me is not None and tasks.requests(me) > 0)

    async def _run(self) -> None:
        while not self._stopping():
            try:
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
            except (AttributeError, NotImplementedError):  # a client without pub/sub
                log.warning("%s: this client has no pub/sub: cancels are seen on the beat "
                            "only", self._who)
                return
            self._pubsub = pubsub
            try:
                await self._listen(pubsub)
            except Exception as exc:  # noqa: BLE001 - re-subscribe; the beat covers the gap
                if self._stopping():  # a swallowed cancel, or close() cut the connection
                    return
                wait = self._backoff()
                log.warning("%s: cancel listener lost its connection (%s); re-subscribing "
                            "in %.2fs", self._who, type(typed(exc)).__name__, wait)
                await asyncio.sleep(wait)
            finally:
                self.subscribed.clear()
                self._pubsub = None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def _listen(self, pubsub: Any) -> None:
        await pubsub.subscribe(*self._channels)
        self.subscribed.set()
        self._backoff.reset()
        await self._on_subscribed()
        while not self._stopping():
            message = await pubsub.get_message(timeout=_POLL_S)
            if message and message.get("type") == "message":
                route = self._routes.get(_text(message["channel"]))
                if route is not None:
                    route(_text(message["data"]))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cut(pubsub: Any) -> None:
    """Abort the transport of ``pubsub``'s connection: a read blocked on it ends at once."""
    connection = getattr(pubsub, "connection", None) if pubsub is not None else None
    writer = getattr(connection, "_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is not None:
        transport.abort()

