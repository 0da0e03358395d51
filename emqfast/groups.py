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

This module holds the ``q.groups`` facade and the sans-IO helpers that route
jobs coming back from delayed / active / failed into their lanes.
"""
from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .keys import QueueKeys, check_group_name
from .ops import Batch, Call, Cmd, Op, operation
from .scripts import load
from .version import KEYSPACE_VERSION

if TYPE_CHECKING:
    from .queue import Queue

_JOIN = load("group_join")
_FREE = load("group_free")
_LIMIT = load("group_limit")
_RATE = load("group_rate")
MAX_CONCURRENCY = 1 << 31
MAX_WINDOW_MS = 1 << 40


def groups_of(k: QueueKeys, job_ids: Sequence[str]) -> Op:
    """``{group or None: [ids]}`` for ``job_ids`` (one pipelined HGET per id)."""
    found = yield Batch([Cmd.of("HGET", key, "group") for key in k.jobs(job_ids)])
    by: Dict[Optional[str], List[str]] = defaultdict(list)
    for job_id, g in zip(job_ids, found):
        by[g.decode() if g is not None else None].append(job_id)
    return by


def join_call(k: QueueKeys, groups: Sequence[str]) -> Call:
    """group_join.lua: put ``groups`` on the ring (sent before moving jobs into their lanes)."""
    return Call(_JOIN, [k.groups, k.meta], [KEYSPACE_VERSION, *groups])


def free_call(k: QueueKeys, finished: Sequence[Tuple[str, str]]) -> Call:
    """group_free.lua for ``(group, job id)`` of finished grouped jobs (sent after the
    outcomes' writes): each leaves its group's active count, and a group parked at its
    concurrency cap rejoins the turn order, waking a blocked worker."""
    return Call(_FREE, [k.groups, k.meta, k.marker, k.gactive, k.leases],
                [KEYSPACE_VERSION, *[x for pair in finished for x in pair]])


def lane_moves(k: QueueKeys, by_group: Dict[Optional[str], List[str]],
               move: Any, size: Optional[int] = None) -> List[Call]:
    """The calls that move jobs into their lanes: ``move(pending_key, ids)`` per group
    (the flat pending set for ungrouped ids), preceded by one ring join when any job
    is grouped, so that a lane never fills while its group is off the ring. With
    ``size``, a group's ids go ``size`` per call (bounded work per script call)."""
    groups = [g for g in by_group if g is not None]
    calls = [join_call(k, groups)] if groups else []
    for g, ids in by_group.items():
        pending = k.pending if g is None else k.group_pending(g)
        step = size or max(len(ids), 1)
        for start in range(0, len(ids), step):
            calls.append(move(pending, ids[start:start + step]))
    return calls


class Groups:
    """``q.groups``: caps and counts of a queue's group lanes (sync or awaited under aio)."""

    def __init__(self, queue: "Queue"):
        self.queue = queue
        self.keys = queue.keys

    def _drive(self, op: Op) -> Any:
        return self.queue._drive(op)

    @operation
    def set_concurrency(self, group: str, n: Optional[int]) -> None:
        """Let at most ``n`` jobs of ``group`` be active at once across all workers
        (``None`` removes the cap). Jobs already running when a cap is first set are
        not counted against it."""
        from .queue import check_int
        check_group_name(group)
        cap = 0 if n is None else check_int(n, "n", 1, MAX_CONCURRENCY)
        k = self.keys
        yield Call(_LIMIT, [k.glimit, k.meta, k.marker, k.groups], [KEYSPACE_VERSION, group, cap])

    @operation
    def concurrency(self, group: str) -> Optional[int]:
        """The group's cap, or None when it has none."""
        check_group_name(group)
        got = yield Cmd.of("HGET", self.keys.glimit, group)
        return int(got) if got is not None else None

    @operation
    def set_rate_limit(self, group: str, max_jobs: int, window_ms: int) -> None:
        """Let workers start at most ``max_jobs`` jobs of ``group`` in any ``window_ms``
        (a sliding window on the Redis server clock, enforced in claim.lua; while the
        group's window is full its lane is skipped and other groups are served)."""
        from .queue import check_int
        check_group_name(group)
        check_int(max_jobs, "max_jobs", 1, MAX_CONCURRENCY)
        check_int(window_ms, "window_ms", 1, MAX_WINDOW_MS)
        k = self.keys
        yield Call(_RATE, [k.grate, k.meta, k.marker, k.groups],
                   [KEYSPACE_VERSION, group, max_jobs, window_ms])

    @operation
    def clear_rate_limit(self, group: str) -> None:
        """Remove ``group``'s rate limit (wakes a worker waiting on it)."""
        check_group_name(group)
        k = self.keys
        yield Call(_RATE, [k.grate, k.meta, k.marker, k.groups], [KEYSPACE_VERSION, group, 0, 0])

    @operation
    def rate_limit(self, group: str) -> Optional[Tuple[int, int]]:
        """``(max_jobs, window_ms)`` of ``group``, or None when it has no rate limit."""
        check_group_name(group)
        got = yield Cmd.of("HGET", self.keys.grate, group)
        if got is None:
            return None
        max_jobs, window_ms = got.decode().split(":")
        return int(max_jobs), int(window_ms)

    @operation
    def counts(self, group: str) -> Dict[str, int]:
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
    def list(self) -> List[str]:
        """Groups with jobs waiting in their lanes, in serving order."""
        return [g.decode() for g in (yield Cmd.of("ZRANGE", self.keys.groups, 0, -1))]


def split_counts(replies: Sequence[Any]) -> Tuple[int, int]:
    """Sum of ``(requeued, failed)`` pairs from several reap.lua replies."""
    return (sum(int(r[0]) for r in replies), sum(int(r[1]) for r in replies))
