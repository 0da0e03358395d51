"""How many claimed jobs a worker may hold beyond its ``concurrency``.

:class:`Prefetch` allows none until handlers have been timed, then enough that a
waiting job starts within about :data:`PREFETCH_BUDGET_S`. Slow handlers get no
prefetch (other workers keep the work); no-op handlers get whole batches per round
trip. Every held job still has its own lease, extended on the beat.
"""
from __future__ import annotations

from typing import Optional

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
