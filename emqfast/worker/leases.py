"""Keeping the queue and this worker's leases healthy: the beat, lease renewal, releases.

Sans-IO generators (see :mod:`emqfast.core.ops`). The thread Worker renews leases
on its claim loop's beat; the asyncio Worker renews them from a task of its own (a claim
loop blocked on the marker must not let a long job's lease lapse), so the beat there
leaves them out (``renew_on_beat``).
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple, Union

from emqfast.core.validation import check_int
from emqfast.core.ops import Hook, Logic
from emqfast.facade.queue import Queue
from emqfast.facade.schedules import Schedules
from emqfast.worker import calls
from emqfast.worker.resend import pipeline_until, transient, typed, until_done
from emqfast.worker.stats import HeldLease, RunningJob

if TYPE_CHECKING:  # a checker sees what the host holds; at run time the base is object
    from emqfast.worker.host import MachineHost as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")

TRIM_EVERY_S = 5.0  # retention (trim) runs on the beat at most this often

Held = Tuple[str, str, Optional[str]]  # (job id, lease token, group or None)
Lease = Union[RunningJob, HeldLease]  # a lease this worker renews


class LeaseKeeping(_Host):
    """The beat, lease and release half of the worker machine (mixed into
    :class:`~emqfast.worker.machine.WorkerMachine`)."""

    renew_on_beat = True

    # --- the beat -----------------------------------------------------------------------
    def _beat_if_due(self) -> Logic:
        """Once per ``beat_s``: renew leases, reap, promote, trim, pump schedules, release held
        jobs of a paused queue, hooks."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + self.beat_s
        if self.renew_on_beat:
            yield from self._renew_on_beat(now)
        queue = self.queue
        yield from Queue.reap.op(queue, max_stalled=self.max_stalled)
        # due jobs are promoted on the beat too: a worker whose slots are all busy
        # does not claim, and the claim reply is where promotion is usually noticed
        yield from Queue.promote.op(queue, limit=calls.PROMOTE_BATCH)
        if now >= self._next_trim:
            self._next_trim = now + TRIM_EVERY_S
            yield from Queue.trim.op(queue, keep_completed=self.keep_completed,
                                     keep_failed=self.keep_failed, max_age_ms=self.max_age_ms)
        yield from self._pump_schedules()
        yield from self._check_paused()
        yield from self._heartbeat.beat()
        yield from self._deps.settle()
        yield from self._recheck_cancels()  # a cancel message lost meanwhile
        for hook in self.beat_hooks:
            yield Hook(hook)

    def _pump_schedules(self) -> Logic:
        """Mint due schedule occurrences; remember when the next one is due."""
        sweep = yield from Schedules.sweep.op(self.queue.schedules)
        self._next_schedule_ms = calls.next_schedule_ms(sweep)

    # --- leases -------------------------------------------------------------------------
    def _due_leases(self, now: float) -> List[Lease]:
        """Leases a third used (not lost, not being acked): running jobs' and held ones'
        (claimed, waiting for a handler slot)."""
        third = self.lease_ms / 3000.0
        with self._guard:
            held: List[Lease] = list(self._held.values())
            return [r for r in [*self._running.values(), *held]
                    if not r.lost and not r.acking and now - r.extended_at > third]

    def _renew(self, due: Sequence[Lease], now: float) -> Logic:
        """Extend ``due`` leases by ``lease_ms``, ``LEASE_CHUNK`` per call; a lease found
        gone is marked lost (logged) unless the job's outcome is being written."""
        for chunk in calls.chunked(due):
            call = calls.extend_call(self._keys, self.lease_ms,
                                    [(r.job_id, r.token) for r in chunk])
            replies = yield call
            for r, ok in zip(chunk, replies):
                if ok:
                    r.extended_at = now
                else:
                    self._lease_gone(r)

    def _lease_gone(self, r: Lease) -> None:
        """A renewal found the lease gone (reaped after a stall, deleted by hand)."""
        if isinstance(r, HeldLease):
            if self._held.get(r.job_id) is r:  # never started: just forget it
                r.lost = True
                log.warning("lease on held job %s was lost", r.job_id)
        elif self._running.get(r.job.id) is r and not r.acking:
            r.lost = True
            log.warning("lease on running job %s was lost", r.job.id)

    def _renew_due(self) -> Logic:
        """Renew every lease that is due now (errors raised)."""
        now = time.monotonic()
        yield from self._renew(self._due_leases(now), now)

    def _renew_on_beat(self, now: float) -> Logic:
        """Renew due leases; a transient fault leaves them due: the next beat (a third of
        the lease later at most) tries again, long before they expire."""
        due = self._due_leases(now)
        try:
            yield from self._renew(due, now)
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            if not transient(exc):
                raise
            log.warning("%s: cannot extend %d leases (%s); next beat", self._who, len(due),
                        type(typed(exc)).__name__)

    def _extend_one(self, job_id: str, token: str, ms: int) -> Logic:
        """A handler's ``job.extend_lease(ms)``: re-sent until it lands; LeaseLost when
        the lease is gone."""
        check_int(ms, "ms", 1, 1 << 40)
        call = calls.extend_call(self._keys, ms, [(job_id, token)])
        calls.check_extended(job_id, (yield from until_done(call, "extend", self._who)))
        running = self._running.get(job_id)
        if running is not None:
            running.extended_at = time.monotonic()

    def _progress(self, job_id: str, token: str, value: Any) -> Logic:
        """A handler's ``job.progress(value)``: recorded under the run's lease token."""
        yield calls.progress_call(self._keys, job_id, token, value)

    # --- releasing ----------------------------------------------------------------------
    def _releasing(self, held: Sequence[Held], until: float) -> Logic:
        """Give claimed jobs back to pending (grouped ones to their lanes), at most
        ``LEASE_CHUNK`` per round trip; transient faults are retried until ``until``
        (monotonic s), then left to the reaper (their leases expire)."""
        for chunk in calls.chunked(held):
            release, skip = calls.release_calls(self._keys, chunk)
            replies = yield from pipeline_until(release, until, f"release {len(chunk)} jobs")
            self._count_released(chunk, replies[skip:])

    def _count_released(self, chunk: Sequence[Held], replies: Sequence[Any]) -> None:
        with self._guard:
            for (job_id, token, _), reply in zip(chunk, replies):
                if reply == 1:
                    self.stats.released += 1
                elif isinstance(reply, Exception):
                    log.warning("could not release %s (%s); the reaper will", job_id,
                                reply)
                running = self._running.get(job_id)
                if running is not None and running.token == token:
                    del self._running[job_id]
            self._notify()
