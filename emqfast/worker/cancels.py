"""Cancelling running jobs and timeouts: the records and rules both Workers share, without
I/O (the machine applies them: ``WorkerMachine._stop_run``, ``_settle_run``, ``_abandon_run``).

A running job is *stopped* for a reason:

- ``"cancelled"``: ``q.cancel(id)`` found it active; cancel.lua marked its hash
  (``cancel`` = 1) and published the id on the queue's cancel channel. The Worker's
  listener (a thread, :class:`emqfast.worker.cancel_listener.CancelListener`; a task,
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
from typing import List, Optional, Tuple

from emqfast.core.errors import Cancelled, JobTimeout
from emqfast.core.validation import check_int
from emqfast.facade.job import Job
from emqfast.facade.options import TIMEOUT_KEY
from emqfast.worker.outcomes import CancelledRun, Failed

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
