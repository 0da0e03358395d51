"""The worker's hot path helpers: how many jobs to hold, and cheap Job objects.

- :class:`Prefetch` sizes how many claimed jobs a worker may hold beyond its
  ``concurrency``: none until handlers have been timed, then enough that a
  waiting job starts within about :data:`PREFETCH_BUDGET_S`. Slow handlers get
  no prefetch (other workers keep the work); no-op handlers get whole batches
  per round trip. Every held job still has its own lease, extended on the beat.
- :class:`JobRows` turns ``start.lua`` rows into :class:`emqfast.Job` objects,
  parsing each distinct options blob once (a bulk enqueue shares one blob).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from . import codec, options
from .job import Job

PREFETCH_BUDGET_S = 0.002  # how long a prefetched job may wait for a handler slot
PREFETCH_MAX = 2048        # jobs held beyond concurrency, at most
_EWMA_WEIGHT = 0.1


class Prefetch:
    """Jobs to hold beyond ``concurrency``: fixed (``limit``) or adaptive (``None``)."""

    def __init__(self, concurrency: int, limit: Optional[int]):
        self.concurrency = concurrency
        self.limit = limit
        self.handler_s: Optional[float] = None  # EWMA of handler run time

    def observe(self, seconds: float) -> None:
        """Record one handler run (called from handler threads; a lost update is harmless)."""
        avg = self.handler_s
        self.handler_s = seconds if avg is None else avg + _EWMA_WEIGHT * (seconds - avg)

    def extra(self) -> int:
        """How many jobs may wait beyond ``concurrency`` right now."""
        if self.limit is not None:
            return self.limit
        avg = self.handler_s
        if avg is None:
            return 0  # not timed yet: take only what can start at once
        return min(PREFETCH_MAX, int(self.concurrency * PREFETCH_BUDGET_S / max(avg, 1e-7)))

    def capacity(self) -> int:
        """Jobs the worker may hold (running + waiting)."""
        return self.concurrency + self.extra()


_Parsed = options.Options


class JobRows:
    """Builds the running :class:`Job` of one ``start.lua`` row, like ``Job.from_hash``."""

    _MAX_CACHED = 256

    def __init__(self, queue: str):
        self.queue = queue
        self._opts: Dict[bytes, _Parsed] = {}

    def _parse(self, opts: Optional[bytes]) -> _Parsed:
        key = opts or b""
        hit = self._opts.get(key)
        if hit is None:
            # no 'opts' (start.lua's nil) or an empty one: the library defaults
            hit = options.decode(opts)
            # Extra options may hold mutable values: each job parses its own.
            if not hit.extra:
                if len(self._opts) >= self._MAX_CACHED:
                    self._opts.clear()
                self._opts[key] = hit
        return hit

    def job(self, job_id: str, row: Any) -> Job:
        """``row`` = ``[attempts, payload, enc, opts, created, run_at, started]`` from
        start.lua (``enc``, ``opts`` and ``run_at`` are None when the hash omits them: JSON,
        the default options, never delayed; rows of older scripts end after ``created``)."""
        attempts, payload, enc, opts, created, *times = row
        run_at, started = times if times else (None, None)
        max_attempts, priority, backoff, extra = self._parse(opts)
        return Job(id=job_id, queue=self.queue, state="active",
                   payload=codec.decode(payload, enc), attempts=int(attempts),
                   max_attempts=max_attempts, priority=priority, backoff=backoff,
                   created_ms=int(created) if created is not None else None,
                   run_at_ms=int(run_at) if run_at is not None else None,
                   started_ms=int(started) if started is not None else None,
                   extra=dict(extra))
