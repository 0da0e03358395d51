"""How the thread Worker stops running jobs (issue 15; the rules are in
:mod:`emqfast.worker.cancels`): a listener thread hears cancels
(:class:`~emqfast.worker.cancel_listener.CancelListener`), a timer thread fires timeouts
and the graces after a stop (:class:`~emqfast.worker.cancel_listener.TimeoutTimer`), the
beat re-reads the cancel marks of the running jobs. A sync handler cannot be interrupted:
it sees ``job.cancelled``; one that ignores it is abandoned after ``cancel_grace_ms``
(its outcome written, its thread keeping its slot until it returns)."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, List, Optional

from emqfast.facade.job import Job
from emqfast.worker.cancel_listener import CancelListener, TimeoutTimer
from emqfast.worker.cancels import ABANDON, TIMEOUT, StopKeeping, timeout_ms_of
from emqfast.worker.outcomes import Outcome
from emqfast.worker.stats import RunningJob


class ThreadStops(StopKeeping):
    """Mixed into :class:`emqfast.Worker` (before the machine)."""

    _listener: Optional[CancelListener]
    _timer: Optional[TimeoutTimer]
    _redis: Any

    if TYPE_CHECKING:
        def _hand_over(self, outcomes: List[Outcome]) -> None: ...

    def _setup_listening(self) -> None:
        self._listener = None
        self._timer = None

    def _start_listening(self) -> None:
        """At the start of a run: the timer, and the listener thread subscribing."""
        self._timer = TimeoutTimer(self._on_due)
        self._listener = CancelListener(self._redis, self._cancel_channels(), self._on_cancel,
                                        lambda: self._drive(self._recheck_cancels()),
                                        self._who)
        self._listener.start()

    def _stop_listening(self) -> None:
        """At the end of a run, once no handler of ours is left to stop."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.close()

    def _cancel_channels(self) -> List[str]:
        """The pub/sub channels the cancels of this Worker's jobs are published on."""
        return [self._keys.cancel_channel]

    def _arm_timeout(self, job: Job, token: str, now: float) -> None:
        """A job handed to a handler: stop it when its timeout passes (if it has one)."""
        limit = timeout_ms_of(job, self.job_timeout_ms)
        if limit and self._timer is not None:
            self._timer.add(now + limit / 1000.0, job.id, token, TIMEOUT)

    def _on_due(self, job_id: str, token: str, kind: str) -> None:
        """A deadline passed (timer thread): a run's timeout, or a stop's grace."""
        if kind == TIMEOUT:
            self._stopped(self._stop_run(job_id, TIMEOUT, token))
        elif kind == ABANDON:
            outcome = self._abandon_run(job_id, token)
            if outcome is not None:
                self._hand_over([outcome])

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """A run was asked to stop (its handler sees ``job.cancelled``): abandon it if it
        has not ended within the grace."""
        timer = self._timer
        if run is not None and timer is not None:
            timer.add(time.monotonic() + self.cancel_grace_ms / 1000.0, run.job.id,
                      run.token, ABANDON)
