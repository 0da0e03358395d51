"""Cancelling running jobs and timeouts: what both Workers share, without I/O.

A running job is *stopped* for a reason:

- ``"cancelled"``: ``q.cancel(id)`` found it active; cancel.lua marked its hash
  (``cancel`` = 1) and published the id on the queue's cancel channel. The Worker's
  listener (a thread, :class:`emqfast.worker.threads.CancelListener`; a task,
  :mod:`emqfast.aio.cancel_listener`) hears it at once; the beat (and each re-subscribe)
  re-reads the marks of the running jobs, so a message lost meanwhile is caught.
- ``"timeout"``: it ran past its ``timeout_ms`` (enqueue option ``"t"``, else the
  Worker's ``job_timeout_ms``).

Stopping sets ``job.cancelled`` (``job.raise_if_cancelled()`` raises
:class:`~emqfast.Cancelled` / :class:`~emqfast.JobTimeout`) and cancels a coroutine
handler's task. Whatever the handler does next (returns, raises, swallows the
``CancelledError``), its run ends by the reason, never by its result: ``cancelled`` ->
``cancel_active.lua`` (a kept ``cancelled`` record, never retried, waiters and
dependents told); ``timeout`` -> a failure with error ``JobTimeout: timeout ...``,
retried per the job's attempts and backoff.

A handler still running ``grace`` after the stop is *abandoned*: its outcome is written
then (the lease ends with it: never left dangling) and its late return is ignored. Its
thread (or task) keeps its handler slot until it really returns: Python cannot kill a
thread, and freeing the slot would run more handlers than ``concurrency`` at once.
"""
from __future__ import annotations

import heapq
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from emqfast.core.errors import Cancelled, JobTimeout
from emqfast.core.validation import check_int
from emqfast.facade.job import Job
from emqfast.facade.options import TIMEOUT_KEY
from emqfast.core.ops import Batch, Cmd, Logic
from emqfast.worker.calls import cancel_active_call, free_calls
from emqfast.worker.outcomes import CancelledRun, Failed, Outcome, log_context
from emqfast.worker.resend import until_landed
from emqfast.worker.leases import RunningJob

if TYPE_CHECKING:  # a checker sees the machine it is mixed with; at run time: object
    from emqfast.worker.machine import WorkerMachine as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")

CANCELLED, TIMEOUT = "cancelled", "timeout"  # why a running job was stopped
ABANDON = "abandon"  # a Deadlines kind: the grace after a stop has passed
DEFAULT_GRACE_MS = 5000  # a stopped handler's time to end before its run is abandoned


@dataclass
class Stop:
    """A running job asked to stop: its run (lease token), why, and whether its outcome
    was already handed to the acker (abandoned: the handler's late return is ignored)."""

    token: str
    reason: str
    settled: bool = False


def timeout_ms_of(job: Job, default_ms: Optional[int]) -> Optional[int]:
    """The job's own ``timeout_ms`` (options ``"t"``), else the Worker's default (a value
    not written by emqfast, not a positive int, counts as none of its own)."""
    own = job.extra.get(TIMEOUT_KEY)
    return own if type(own) is int and own > 0 else default_ms


def stop_outcome(job: Job, token: str, reason: str, tb: str = "") -> Failed:
    """The outcome of a stopped run: a :class:`CancelledRun` (never retried), or a
    timeout failure (retried per the job's attempts/backoff)."""
    if reason == CANCELLED:
        return CancelledRun(job, token, Cancelled(f"job {job.id} was cancelled"), tb, False)
    limit = job.extra.get(TIMEOUT_KEY)
    exc = JobTimeout(f"timeout (the run passed its timeout_ms{'=' + str(limit) if limit else ''})")
    return Failed(job, token, exc, tb, True)


def check_timeouts(job_timeout_ms: Optional[int], grace_ms: int) -> Tuple[Optional[int], int]:
    """The Worker's ``job_timeout_ms`` (None: jobs run as long as they take, unless
    enqueued with ``timeout_ms``) and ``cancel_grace_ms``, checked."""
    if job_timeout_ms is not None:
        check_int(job_timeout_ms, "job_timeout_ms", 1, 1 << 40)
    return job_timeout_ms, check_int(grace_ms, "cancel_grace_ms", 0, 1 << 40)


class Deadlines:
    """When each running job must stop (``kind`` TIMEOUT) or be abandoned (``kind``
    ABANDON, the grace after a stop), monotonic s, soonest first. Entries of runs that
    ended meanwhile are skipped when they come due (cheaper than removing them)."""

    def __init__(self) -> None:
        self._heap: List[Tuple[float, int, str, str, str]] = []
        self._seq = itertools.count()

    def add(self, at: float, job_id: str, token: str, kind: str) -> bool:
        """Add one; True when it is now the soonest (a waiting timer must re-arm)."""
        seq = next(self._seq)
        heapq.heappush(self._heap, (at, seq, job_id, token, kind))
        return self._heap[0][1] == seq

    def next_at(self) -> Optional[float]:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> List[Tuple[str, str, str]]:
        """``(job id, token, kind)`` of every deadline passed by ``now``, removed."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, _, job_id, token, kind = heapq.heappop(self._heap)
            out.append((job_id, token, kind))
        return out


class StopKeeping(_Host):
    """Stopping running jobs, mixed into both Workers before the machine (its
    ``_write_batch`` writes cancelled runs, then hands the rest to the machine's)."""

    _stops: Dict[str, Stop]
    job_timeout_ms: Optional[int]
    cancel_grace_ms: int

    def _setup_stops(self, job_timeout_ms: Optional[int], cancel_grace_ms: int) -> None:
        self.job_timeout_ms, self.cancel_grace_ms = check_timeouts(job_timeout_ms,
                                                                   cancel_grace_ms)
        self._stops = {}
        self._early: Set[str] = set()  # held (claimed, not started) jobs asked to cancel

    def _cancel_held(self, job_id: str) -> None:
        """A cancel of a job this Worker holds but has not started (prefetched): it is
        stopped as soon as it is handed to a handler (:meth:`_stop_early`)."""
        with self._guard:
            if job_id in self._held:
                self._early.add(job_id)

    def _stop_early(self, started: Sequence[Tuple[Job, str]]) -> None:
        """Jobs just handed out: stop those cancelled while they were held, whether this
        Worker heard the cancel (pub/sub) or start.lua found its mark (a cancel whose
        message had not arrived yet: the mark is read in the same step that starts it)."""
        for job, token in started:
            if self._early:
                with self._guard:
                    early = job.id in self._early
                    self._early.discard(job.id)
            else:
                early = False
            if early or "_cancel_at_start" in job.__dict__:
                self._on_cancel(job.id, token)

    def _stop_run(self, job_id: str, reason: str, token: Optional[str] = None
                  ) -> Optional[RunningJob]:
        """Ask a running job to stop (``token``: only that run); the run, or None when it
        is not ours, ended, is being acked or was stopped already. The driver then
        cancels a coroutine's task and arms the abandonment after the grace."""
        with self._guard:
            run = self._running.get(job_id)
            if run is None or run.acking or run.lost or job_id in self._stops \
                    or (token is not None and run.token != token):
                return None
            run.job._stop_reason = reason
            self._stops[job_id] = Stop(run.token, reason)
        log.info("%s: job %r %s; stopping its handler", self._who, job_id,
                 "was cancelled" if reason == CANCELLED else "timed out",
                 extra=log_context(run.job))
        return run

    def _settle_run(self, outcome: Outcome) -> Optional[Outcome]:
        """A handler ended with ``outcome``: for a stopped run, the outcome of its stop
        instead (None: the run was abandoned, its outcome written already)."""
        if not self._stops:  # the common case: nothing stopped, no lock taken
            return outcome
        job_id, token = outcome.job.id, outcome.token
        with self._guard:
            stop = self._stops.get(job_id)
            if stop is None or stop.token != token:
                return outcome
            del self._stops[job_id]
        if stop.settled:
            return None
        tb = outcome.traceback if isinstance(outcome, Failed) else ""
        return stop_outcome(outcome.job, token, stop.reason, tb)

    def _abandon_run(self, job_id: str, token: str) -> Optional[Failed]:
        """The grace after a stop has passed: the outcome to write now if the handler is
        still running (its late return is then ignored), else None."""
        with self._guard:
            stop = self._stops.get(job_id)
            if stop is None or stop.token != token or stop.settled:
                return None
            run = self._running.get(job_id)
            if run is None or run.token != token or run.acking:
                del self._stops[job_id]  # ended meanwhile: nothing to abandon
                return None
            stop.settled = True
        log.warning("%s: job %r's handler did not end within cancel_grace_ms=%d of its %s; "
                    "abandoning the run (its thread keeps its slot until it returns)",
                    self._who, job_id, self.cancel_grace_ms,
                    "cancel" if stop.reason == CANCELLED else "timeout",
                    extra=log_context(run.job))
        return stop_outcome(run.job, token, stop.reason)

    def _unstopped(self) -> List[Tuple[str, str]]:
        """``(id, token)`` of running jobs not stopped yet: whose cancel marks the beat
        re-reads."""
        with self._guard:
            return [(i, r.token) for i, r in self._running.items()
                    if i not in self._stops and not r.acking and not r.lost]

    def _recheck_cancels(self) -> Logic:
        """Read the cancel marks of the running jobs not stopped yet (on the beat, and after
        the listener (re-)subscribed) and stop those marked: a cancel whose message was
        lost."""
        runs = self._unstopped()
        if not runs:
            return
        flags = yield Batch([Cmd.of("HGET", self._keys.job(job_id), "cancel")
                             for job_id, _ in runs])
        for (job_id, token), flag in zip(runs, flags):
            if flag:
                self._on_cancel(job_id, token)

    def _on_cancel(self, job_id: str, token: Optional[str] = None) -> None:
        """A cancel of ``job_id`` was heard (the driver's listener) or its mark read (the
        beat): its run is stopped, or, held and not started yet, it is stopped as it starts."""
        run = self._stop_run(job_id, CANCELLED, token)
        if run is None and token is None:
            self._cancel_held(job_id)
        self._stopped(run)

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """The driver's part of stopping ``run`` (None: nothing ran): cancel its task or
        let its thread see ``job.cancelled``, and arm the grace before it is abandoned."""
        raise NotImplementedError

    # --- writing outcomes --------------------------------------------------------------
    def _write_batch(self, batch: List[Outcome]) -> Logic:
        """Cancelled runs end by cancel_active.lua; the rest as the machine writes them.
        A mixed batch is written in two parts, each failing on its own (so no part is
        forgotten twice): the replies come back in the batch's order."""
        ended = [o for o in batch if isinstance(o, CancelledRun)]
        if not ended:
            return (yield from super()._write_batch(batch))
        rest = [o for o in batch if not isinstance(o, CancelledRun)]
        mine = iter((yield from self._write_part(self._write_cancelled, ended)))
        got = iter((yield from self._write_part(super()._write_batch, rest)) if rest else [])
        return [next(mine) if isinstance(o, CancelledRun) else next(got) for o in batch]

    def _write_part(self, write: Any, part: List[Any]) -> Logic:
        """``write(part)``'s replies; a failure is handled as the acker handles a batch's
        (logged, forgotten, a permanent error stops the worker) and is each one's reply."""
        try:
            return (yield from write(part))
        except Exception as exc:  # noqa: BLE001 - the other part must still be written
            self._ack_failed(part, exc)
            return [exc] * len(part)

    def _write_cancelled(self, ended: List[CancelledRun]) -> Logic:
        """End cancelled runs (re-sent until they land: each is fenced by its token),
        free their groups' slots, count and forget them."""
        calls = [cancel_active_call(self._keys, o) for o in ended]
        calls += free_calls(self._keys, ended)
        replies = yield from until_landed(calls, self._who, self._ack_until)
        out = []
        for o, reply in zip(ended, replies):
            if isinstance(reply, Exception):
                log.warning("%s: could not end cancelled job %r (%r)", self._who, o.job.id,
                            reply, extra=log_context(o.job))
            else:
                self.stats.cancelled += 1
                log.info("%s: job %r cancelled", self._who, o.job.id,
                         extra=log_context(o.job))
            out.append(reply)
        self._forget(ended)
        return out
