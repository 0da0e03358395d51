"""Group lanes: per-tenant waiting lines with a concurrency cap, served in turn.

A job enqueued with ``group="tenant-42"`` waits in its group's lane
(``emq:{q}:g:<group>:pending``) instead of the flat pending set; the group sits on
the ring of ready groups (``emq:{q}:groups``). ``claim.lua`` takes one job per
ready group per turn, the flat pending set taking its turn like one more group, so a
tenant with 100k jobs cannot starve one with 10. A group at its cap
(:meth:`Groups.set_concurrency`) or with a full rate window is parked on the ring
(a negative score: the instant to re-check it) until a slot frees (the Workers send
``group_free.lua`` after a grouped job's outcome) or its window opens, so claims skip
it for free. Active jobs of capped groups are tracked in ``emq:{q}:gactive`` and
pruned by lease.

This module holds the ``q.groups`` facade; :mod:`emqfast.facade.lanes` the sans-IO
helpers that route jobs coming back from delayed / active / failed into their lanes.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from emqfast.core.validation import check_group_name, check_int
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.backends.scripts import load
from emqfast.core.times import Delay, delay_ms
from emqfast.core.version import KEYSPACE_VERSION


_LIMIT = load("group_limit")
_RATE = load("group_rate")
MAX_CONCURRENCY = 1 << 31
MAX_WINDOW_MS = 1 << 40


class Groups:
    """``q.groups``: caps and counts of a queue's group lanes (sync or awaited under aio)."""

    def __init__(self, queue: Any):  # the Queue owning this part (it imports this module)
        self.queue = queue
        self.keys = queue.keys

    def _drive(self, op: Op) -> Any:
        return self.queue._drive(op)

    @operation
    def set_concurrency(self, group: str, n: Optional[int]) -> Returns[None]:
        """Let at most ``n`` jobs of ``group`` be active at once across all workers
        (``None`` removes the cap). Jobs already running when a cap is first set are
        not counted against it."""
        check_group_name(group)
        cap = 0 if n is None else check_int(n, "n", 1, MAX_CONCURRENCY)
        k = self.keys
        yield Call(_LIMIT, [k.glimit, k.meta, k.marker, k.groups], [KEYSPACE_VERSION, group, cap])

    @operation
    def concurrency(self, group: str) -> Returns[Optional[int]]:
        """The group's cap, or None when it has none."""
        check_group_name(group)
        got = yield Cmd.of("HGET", self.keys.glimit, group)
        return int(got) if got is not None else None

    @operation
    def set_rate_limit(self, group: str, max_jobs: int, window_ms: Delay) -> Returns[None]:
        """Let workers start at most ``max_jobs`` jobs of ``group`` in any ``window_ms``
        (ms or a ``timedelta``; a sliding window on the Redis server clock, enforced in claim.lua; while the
        group's window is full its lane is skipped and other groups are served)."""
        check_group_name(group)
        check_int(max_jobs, "max_jobs", 1, MAX_CONCURRENCY)
        window_ms = delay_ms(window_ms, "window_ms", 1, MAX_WINDOW_MS)
        k = self.keys
        yield Call(_RATE, [k.grate, k.meta, k.marker, k.groups],
                   [KEYSPACE_VERSION, group, max_jobs, window_ms])

    @operation
    def clear_rate_limit(self, group: str) -> Returns[None]:
        """Remove ``group``'s rate limit (wakes a worker waiting on it)."""
        check_group_name(group)
        k = self.keys
        yield Call(_RATE, [k.grate, k.meta, k.marker, k.groups], [KEYSPACE_VERSION, group, 0, 0])

    @operation
    def rate_limit(self, group: str) -> Returns[Optional[Tuple[int, int]]]:
        """``(max_jobs, window_ms)`` of ``group``, or None when it has no rate limit."""
        check_group_name(group)
        got = yield Cmd.of("HGET", self.keys.grate, group)
        if got is None:
            return None
        max_jobs, window_ms = got.decode().split(":")
        return int(max_jobs), int(window_ms)

    @operation
    def counts(self, group: str) -> Returns[Dict[str, int]]:
        """``{"pending": jobs waiting in the lane, "active": running jobs counted
        against the cap}`` (active is only tracked while the group has a cap, and may
        include finished jobs until the next claim prunes them)."""
        check_group_name(group)
        k = self.keys
        pending, active = yield Batch([
            Cmd.of("ZCARD", k.group_pending(group)),
            Cmd.of("ZLEXCOUNT", k.gactive, f"[{group}\0".encode(),
                   f"[{group}\0".encode() + b"\xff")])
        return {"pending": int(pending), "active": int(active)}

    @operation
    def list(self) -> Returns[List[str]]:
        """Groups with jobs waiting in their lanes, in serving order."""
        return [g.decode() for g in (yield Cmd.of("ZRANGE", self.keys.groups, 0, -1))]
