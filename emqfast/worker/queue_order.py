"""Which of a worker's queues may claim now: strict priority or weighted turns.

A worker serving several queues (:mod:`emqfast.worker.crew`) runs one claim loop per
queue; before a loop claims, it asks :class:`QueueOrder` (no I/O, no clock: the caller
holds the worker's lock). A queue is **ready** while its loop is not waiting on its wake
marker: from the start (and after every wake-up) until a claim comes back empty (nothing
pending, the queue paused, or its rate window full), when the loop goes back to block on
the marker. "Ready" therefore means "may have work claimable now", judged by the last
claim, not by a read of Redis.

- ``strict`` (RQ's and Celery's habit): queue *i* claims only while no queue before it
  is ready or holds claimed-but-unstarted jobs, and starts its own held jobs only while no
  queue before it holds any. Jobs a lower queue claimed before a higher one woke up may
  still start first: with prefetch, at most the prefetch budget (~2 ms of work, or the
  ``prefetch`` given); with ``prefetch=0`` and ``concurrency=1`` none.
- ``weighted`` (Sidekiq's): each claim round is granted to one ready queue drawn at random
  in proportion to its weight (a seeded :class:`random.Random` makes it repeatable); the
  grant ends when that queue's claim returns, and the next round draws again. A round
  claims at most ``concurrency`` jobs (:mod:`emqfast.worker.crew`), so the split per job
  follows the weights even where fast handlers would let the prefetch take hundreds.
- ``rotate`` (a partitioned queue's, :mod:`emqfast.facade.partitioned`): claim rounds go
  to the ready queues in turn, each after the last one served, so a queue with work waits
  at most one rotation. A round claims what the budget allows (a whole batch for fast
  handlers: a partitioned queue drains as fast as one queue); at ``concurrency=1`` with
  ``prefetch=0`` a round is one job, so an urgent job waits behind at most P - 1 others
  (one per other partition) and the running one.
"""
from __future__ import annotations

import random
from typing import List, Optional, Sequence

from emqfast.core.errors import InputTypeError, InvalidInput
from emqfast.core.validation import check_int

ORDERS = ("strict", "weighted", "rotate")
MAX_WEIGHT = 1_000_000


def check_order(order: str, weights: Optional[Sequence[int]], n: int) -> List[int]:
    """The weights to use for ``n`` queues (all 1 under ``strict``); typed errors for a
    wrong ``order``, a weight list of the wrong length, or a weight outside 1..10**6."""
    if order not in ORDERS:
        raise InvalidInput(f"order must be 'strict', 'weighted' or 'rotate', not {order!r}")
    if weights is None:
        return [1] * n
    if order != "weighted":
        raise InvalidInput("weights apply to order='weighted' only")
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise InputTypeError(f"weights must be a list of ints, not {type(weights).__name__}")
    if len(weights) != n:
        raise InvalidInput(f"{len(weights)} weights for {n} queues: give one per queue")
    return [check_int(w, "weight", 1, MAX_WEIGHT) for w in weights]


class QueueOrder:
    """The claim order of ``n`` queues, first = highest (see the module docstring)."""

    def __init__(self, n: int, order: str = "strict", weights: Optional[Sequence[int]] = None,
                 rng: Optional[random.Random] = None):
        self.weights = check_order(order, weights, n)
        self.strict = order == "strict"
        self.rotate = order == "rotate"
        self.last: int = -1  # rotate: the queue whose round came last
        self.ready = [True] * n     # loop not blocked on its marker (see the docstring)
        self.serving = [False] * n  # its claim loop runs
        self.turn: Optional[int] = None  # weighted: the queue granted this claim round
        self.rng = rng or random.Random()

    def reset(self) -> None:
        """Before the loops start: every queue counts as ready (a higher queue whose loop
        has not begun yet is not passed over)."""
        self.ready = [True] * len(self.ready)
        self.turn = None

    def join(self, i: int) -> None:
        """Queue ``i``'s claim loop starts (ready until its first empty claim)."""
        self.serving[i] = True
        self.ready[i] = True

    def leave(self, i: int) -> None:
        """Queue ``i``'s claim loop ended."""
        self.serving[i] = False
        self.set_ready(i, False)

    def set_ready(self, i: int, ready: bool) -> bool:
        """Mark queue ``i`` ready or not; True when that changed (wake the other loops)."""
        ready = ready and self.serving[i]
        changed = self.ready[i] != ready
        self.ready[i] = ready
        if not ready and self.turn == i:
            self.turn = None
        return changed

    def may_start(self, i: int, holding: Sequence[bool]) -> bool:
        """May queue ``i`` start its held jobs (``holding[j]``: queue j holds unstarted
        claimed jobs)? Strict: only when no queue before it holds any."""
        return not self.strict or not any(holding[:i])

    def may_claim(self, i: int, holding: Sequence[bool]) -> bool:
        """May queue ``i`` claim now? Weighted: draws this round's queue when none is
        drawn (see :meth:`draw`)."""
        if self.strict:
            return not any(r or h for r, h in zip(self.ready[:i], holding[:i]))
        if self.turn is None or not self.ready[self.turn]:
            self.draw()
        # no queue ready (all idle, waiting on their markers between beats): any may
        # claim, which is how an idle one meets its marker again and becomes ready
        return self.turn is None or self.turn == i

    def draw(self) -> Optional[int]:
        """Grant the next claim round to a ready queue, drawn in proportion to weight
        (rotate: the first ready one after the last served)."""
        candidates = [j for j, r in enumerate(self.ready) if r]
        if not candidates:
            self.turn = None
        elif self.rotate:
            after = [j for j in candidates if j > self.last]
            self.turn = self.last = (after or candidates)[0]
        else:
            self.turn = self.rng.choices(candidates,
                                         [self.weights[j] for j in candidates])[0]
        return self.turn

    def claimed(self, i: int) -> bool:
        """Queue ``i``'s claim returned: its round is over. True when a round ended."""
        if self.turn == i:
            self.turn = None
            return True
        return False
