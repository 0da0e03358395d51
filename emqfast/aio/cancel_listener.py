"""How the asyncio Worker stops running jobs (issue 15; the rules are in
:mod:`emqfast.worker.cancels`).

A task of the Worker listens on its queues' cancel channels (one pub/sub connection,
re-made with backoff after a loss; after each subscribe, and on the beat, the cancel
marks of the running jobs are re-read, so a message lost meanwhile is caught). A
coroutine handler's task is cancelled (``CancelledError`` at its next ``await``); a plain
handler in the executor sees ``job.cancelled``. Timeouts and the graces after a stop are
``loop.call_later`` timers. A handler still running ``cancel_grace_ms`` after its stop is
abandoned: its outcome is written then, its task keeps its slot until it ends.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple

from emqfast.aio import cancels
from emqfast.facade.job import Job
from emqfast.worker.cancels import ABANDON, TIMEOUT, StopKeeping, timeout_ms_of
from emqfast.worker.outcomes import Outcome
from emqfast.worker.resend import Backoff, typed
from emqfast.worker.stats import RunningJob

if TYPE_CHECKING:
    from emqfast.aio.host import AioHost as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")

_POLL_S = 1.0  # a listener's longest wait for a message (it is cancelled to stop anyway)


async def listen(client: Any, channels: Sequence[str], on_cancel: Callable[[str], None],
                 on_subscribed: Callable[[], Awaitable[None]], who: str,
                 subscribed: Optional[asyncio.Event] = None) -> None:
    """Hand every id published on ``channels`` to ``on_cancel`` until cancelled."""
    backoff = Backoff(0.05, 2.0)
    while True:
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
        except (AttributeError, NotImplementedError):  # a client without pub/sub
            log.warning("%s: this client has no pub/sub: cancels are seen on the beat only",
                        who)
            return
        try:
            await pubsub.subscribe(*channels)
            if subscribed is not None:
                subscribed.set()
            backoff.reset()
            await on_subscribed()
            while True:
                message = await pubsub.get_message(timeout=_POLL_S)
                if message and message.get("type") == "message":
                    data = message["data"]
                    on_cancel(data.decode() if isinstance(data, bytes) else str(data))
        except Exception as exc:  # noqa: BLE001 - re-subscribe; the beat covers the gap
            wait = backoff()
            log.warning("%s: cancel listener lost its connection (%s); re-subscribing in "
                        "%.2fs", who, type(typed(exc)).__name__, wait)
            await asyncio.sleep(wait)
        finally:
            if subscribed is not None:
                subscribed.clear()
            with contextlib.suppress(Exception):
                await pubsub.aclose()


class AioStops(StopKeeping, _Host):
    """Mixed into :class:`emqfast.aio.Worker` (before the machine)."""

    _timers: Dict[Tuple[str, str], asyncio.TimerHandle]
    _listener: Optional["asyncio.Task[None]"]
    cancel_listening: Optional[asyncio.Event]  # set while subscribed (tests wait on it)

    def _setup_listening(self) -> None:
        self._timers = {}
        self._listener = None
        self.cancel_listening = None
        self.beat_hooks.append(self._recheck_cancels)  # a cancel message lost meanwhile

    def _start_listening(self) -> None:
        self.cancel_listening = asyncio.Event()  # (made on the running loop: Python 3.9)
        self._listener = cancels.spawn(
            listen(self._redis, self._cancel_channels(), self._on_cancel,
                   self._recheck_cancels, self._who, self.cancel_listening),
            name="emq-cancels")

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            await asyncio.wait([listener], timeout=2.0)
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _cancel_channels(self) -> List[str]:
        return [self._keys.cancel_channel]

    def _arm(self, job_id: str, token: str, delay_s: float, kind: str) -> None:
        assert self._loop is not None
        old = self._timers.pop((job_id, token), None)
        if old is not None:
            old.cancel()
        self._timers[(job_id, token)] = self._loop.call_later(delay_s, self._on_due, job_id,
                                                              token, kind)

    def _arm_timeout(self, job: Job, token: str) -> None:
        """A job handed to a handler: stop it when its timeout passes (if it has one)."""
        limit = timeout_ms_of(job, self.job_timeout_ms)
        if limit:
            self._arm(job.id, token, limit / 1000.0, TIMEOUT)

    def _disarm(self, job_id: str, token: str) -> None:
        """A run's handler ended: its timers go."""
        handle = self._timers.pop((job_id, token), None)
        if handle is not None:
            handle.cancel()

    def _on_due(self, job_id: str, token: str, kind: str) -> None:
        self._timers.pop((job_id, token), None)
        if kind == TIMEOUT:
            self._stopped(self._stop_run(job_id, TIMEOUT, token))
        elif kind == ABANDON:
            outcome = self._abandon_run(job_id, token)
            if outcome is not None:
                self._queue_ack(job_id, token, outcome=outcome)

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """A run was asked to stop: a coroutine's task is cancelled; abandoned if it has
        not ended within the grace."""
        if run is None:
            return
        if self._is_coro and run.task is not None:
            run.task.cancel()
        self._arm(run.job.id, run.token, self.cancel_grace_ms / 1000.0, ABANDON)

    async def _recheck_cancels(self) -> None:
        """Read the cancel marks of the running jobs not stopped yet (beat, re-subscribe)."""
        runs = self._unstopped()
        if not runs:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, _ in runs:
                pipe.hget(self._keys.job(job_id), "cancel")
            flags = await pipe.execute()
        self._marked(runs, flags)

    if TYPE_CHECKING:
        def _queue_ack(self, job_id: str, token: str, outcome: Optional[Outcome] = None,
                       release: Any = None) -> None: ...
