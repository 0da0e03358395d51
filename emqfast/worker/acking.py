"""Writing outcomes (the acker's logic, shared by both Workers).

Sans-IO generators (see :mod:`emqfast.core.ops`): a batch of outcomes is written
by one :class:`~emqfast.worker.calls.AckPlan`, re-sent until it lands
(:func:`~emqfast.worker.resend.until_landed`), counted, forgotten, then its run times
are added to the histograms. How outcomes reach the acker (a thread's queue, an asyncio
list) is the driver's.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, List, Sequence

from emqfast.core.errors import PermissionDenied, VersionMismatch
from emqfast.core.ops import Batch, Logic
from emqfast.worker.calls import AckPlan, metrics_call, run_times
from emqfast.worker.outcomes import Outcome, forget_run, tally
from emqfast.worker.resend import typed, until_landed

if TYPE_CHECKING:  # a checker sees what the host holds; at run time the base is object
    from emqfast.worker.host import MachineHost as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")

ACK_BATCH = 1000  # outcomes written per AckPlan at most


class Acking(_Host):
    """The acker's half of the worker machine (mixed into
    :class:`~emqfast.worker.machine.WorkerMachine`)."""

    def _mark_acking(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes handed to the acker: their leases are renewed no more (the write ends
        them, and a renewal racing it would read as a lost lease). Under ``_guard``."""
        running = self._running
        for outcome in outcomes:
            run = running.get(outcome.job.id)
            if run is not None and run.token == outcome.token:
                run.acking = True

    def _write_batch(self, batch: List[Outcome]) -> Logic:
        """Write a batch of outcomes, count and forget them; the replies (for the run
        times). A stopping worker re-sends until ``_ack_until`` only."""
        plan = AckPlan(self._keys, batch)
        replies = plan.replies((yield from until_landed(plan.calls, self._who, self._ack_until)))
        tally(self.stats, batch, replies, plan.retrying)
        self._forget(batch)
        return replies

    def _write_run_times(self, batch: List[Outcome], replies: List[Any]) -> Logic:
        """Add the batch's wait/run times to the histograms in one call. Best effort: the
        outcomes (and the exact counters) are already written, so a failure is logged,
        not retried."""
        obs = run_times(batch, replies)
        if not obs:
            return
        try:
            [reply] = yield Batch([metrics_call(self._keys, obs)], via_batcher=True)
            if isinstance(reply, Exception):
                raise reply
        except Exception as exc:  # noqa: BLE001 - never lose the acks over metrics
            log.warning("%s: could not record run times of %d jobs (%s)", self._who,
                        len(batch), exc)

    def _forget(self, batch: Sequence[Outcome]) -> None:
        """The batch is written (or abandoned): its runs are over; wake whoever waits."""
        with self._guard:
            for outcome in batch:
                forget_run(self._running, outcome)
            self._pending_acks -= len(batch)
            self._notify()

    def _ack_failed(self, batch: Sequence[Outcome], exc: BaseException) -> None:
        """A batch could not be written: forget its jobs (no longer extending their leases
        hands them to the reaper: re-run, never lost, never hung). A permanent error
        stops the worker, and :meth:`run` raises it."""
        error = typed(exc)
        log.error("%s: could not write %d outcomes (%s: %s); their leases will expire and "
                  "the reaper will re-run them", self._who, len(batch), type(error).__name__,
                  error)
        self._forget(batch)
        if isinstance(error, (PermissionDenied, VersionMismatch)) and self._fatal is None:
            self._fatal = error
            self.stop()
