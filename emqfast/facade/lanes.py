"""Routing jobs into group lanes: the sans-IO pieces the Queue (promote, reap, retry,
release), :func:`~emqfast.promote_many` and the Workers (group turns after an outcome)
share. A grouped job never lands in a lane whose group is off the ring: the ring join
goes first in the same pipeline."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from emqfast.backends.scripts import load
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op
from emqfast.core.version import KEYSPACE_VERSION

_JOIN = load("group_join")
_FREE = load("group_free")


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


def combine_moves(calls: Sequence[Call], replies: Sequence[Any],
                  combine: Callable[[Sequence[Any]], Any]) -> Any:
    """``combine`` the replies of the moves in a batch from :func:`lane_moves` (the ring
    join's reply left out), raising the first error reply."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    moves = replies[1:] if calls and calls[0].script.name == _JOIN.name else replies
    return combine(moves)


def split_counts(replies: Sequence[Any]) -> Tuple[int, int]:
    """Sum of ``(requeued, failed)`` pairs from several reap.lua replies."""
    return (sum(int(requeued) for requeued, _ in replies),
            sum(int(failed) for _, failed in replies))
