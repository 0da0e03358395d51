"""Promote: release a queue's due delayed jobs to pending, on the server clock, in bounded
calls. ``Queue.promote`` runs :func:`promote_op`; :func:`emqfast.promote_many` sends the
same :func:`promote_call` for many queues at once (:mod:`emqfast.facade.bulk`).

Each round reads up to :data:`DUE_BATCH` due ids with ``due.lua`` (read-only, so the next
step can declare the jobs' keys) and moves them with ``promote.lua``, :data:`PROMOTE_BATCH`
ids per call, a round's calls in one pipelined batch through the backend Batcher
(hiredis under C; a round of one call goes on the client's own connection). Ids and keys stay bytes from the due reply to the wire: a promoted job
costs no text decode or encode on the client.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from emqfast.backends.scripts import load
from emqfast.core.ops import DUE_BATCH, PROMOTE_BATCH, batches
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Op, Returns
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import lanes
from typing import Any, List, NamedTuple
from emqfast.core.ops import Call

PROMOTE = load("promote")
PROMOTE_MANY = load("promote_many")
PROMOTE_MANY_FEW = 16  # promote_many.lua takes queues with at most this many due ids...
PROMOTE_MANY_QUEUES = 500  # ...this many queues per call, and at most DUE_BATCH ids in all
_DUE = load("due")
_DUE_MANY = load("due_many")
DUE_MANY_QUEUES = 500  # queues per due_many.lua call (it takes at most 1,000)
_VERSION = KEYSPACE_VERSION.encode()


Framed = Tuple[bytes, bytes, bytes, bytes, bytes, bytes]
_FRAMED: Dict[str, Framed] = {}  # key prefix -> its keys as bytes (bounded: cleared when full)


def _framed(k: QueueKeys) -> Framed:
    """A queue's keys as bytes: delayed, marker, meta, events, the job-key prefix, pending
    (made once per queue: promote_many frames thousands of queues per call)."""
    got = _FRAMED.get(k.base)
    if got is None:
        if len(_FRAMED) >= 16_384:
            _FRAMED.clear()
        got = _FRAMED[k.base] = (k.delayed.encode(), k.marker.encode(), k.meta.encode(),
                                 k.events.encode(), k.job("").encode(), k.pending.encode())
    return got


def due_call(k: QueueKeys, limit: int) -> Call:
    """due.lua: up to ``limit`` due ids on ``delayed``, with the queue's grouped flag (as
    :func:`emqfast.facade.promote.delayed_due`, framed as bytes)."""
    delayed, _, meta, _, _, _ = _framed(k)
    return Call(_DUE, [delayed, meta], [b"%d" % limit, b"1"])


def as_bytes(value: Any) -> bytes:
    """A reply value as bytes (a client made with ``decode_responses=True`` gives str)."""
    return value if isinstance(value, bytes) else str(value).encode()


def due_reply(reply: Sequence[Any]) -> Tuple[bool, List[bytes]]:
    """A ``delayed_due`` reply as ``(grouped, ids as bytes)``, oldest first."""
    ids = list(reply[2:])
    if ids and not isinstance(ids[0], bytes):
        ids = [as_bytes(i) for i in ids]
    return bool(int(reply[1])), ids


def due_many_call(keys: Sequence[QueueKeys], asked: Dict[str, int]) -> Call:
    """due_many.lua: the due ids of many queues of one standalone server in one call (at
    most ``asked[name]`` per queue, 4,000 in all); read by :func:`due_many_reply`."""
    pairs: List[bytes] = []
    for k in keys:
        delayed, _, meta, _, _, _ = _framed(k)
        pairs += (delayed, meta)
    return Call(_DUE_MANY, pairs, [b"%d" % asked[k.name] for k in keys])


def due_many_reply(reply: Sequence[Any]) -> List[Optional[Tuple[bool, List[bytes]]]]:
    """Per queue of a :func:`due_many_call`, in its order: ``(grouped, ids as bytes)``,
    or None for a queue the call left unread (its id budget was spent)."""
    out: List[Optional[Tuple[bool, List[bytes]]]] = []
    at = 1  # reply[0]: the server clock it read
    while at < len(reply):
        grouped, count = int(reply[at]), int(reply[at + 1])
        at += 2
        if count < 0:
            out.append(None)
            continue
        ids = [as_bytes(i) for i in reply[at:at + count]]
        at += count
        out.append((bool(grouped), ids))
    return out


def promote_call(k: QueueKeys, pending: str, ids: Sequence[Any]) -> Call:
    """promote.lua moving due ``ids`` (str or bytes) from ``delayed`` to ``pending`` (the
    flat set or a group's lane); also sent by :func:`emqfast.promote_many`. Framed as
    bytes, so the Batcher packs the call without encoding each value."""
    raw = [i if isinstance(i, bytes) else i.encode() for i in ids]
    delayed, marker, meta, events, prefix, flat = _framed(k)
    lane = flat if pending == k.pending else pending.encode()
    return Call(PROMOTE, [delayed, lane, marker, meta, events, *[prefix + i for i in raw]],
                [_VERSION, *raw])


def promote_many_calls(found: Sequence[Tuple[QueueKeys, List[bytes]]]
                       ) -> List[Tuple[Call, List[str]]]:
    """promote_many.lua calls moving the due ids of many queues of one standalone server
    (each never grouped, with at most ``PROMOTE_MANY_FEW`` ids), as few as its limits
    allow: ``(call, its queues' names)``; a call's reply lists the jobs released per queue,
    in that order."""
    calls: List[Tuple[Call, List[str]]] = []
    keys: List[bytes] = []
    args: List[bytes] = [_VERSION]
    names: List[str] = []
    ids_in = 0
    for k, ids in found:
        if len(names) == PROMOTE_MANY_QUEUES or ids_in + len(ids) > DUE_BATCH:
            calls.append((Call(PROMOTE_MANY, keys, args), names))
            keys, args, names, ids_in = [], [_VERSION], [], 0
        delayed, marker, meta, events, prefix, pending = _framed(k)
        keys += (delayed, pending, marker, meta, events)
        keys += [prefix + i for i in ids]
        args.append(b"%d" % len(ids))
        args += ids
        names.append(k.name)
        ids_in += len(ids)
    if names:
        calls.append((Call(PROMOTE_MANY, keys, args), names))
    return calls


def ungrouped_calls(k: QueueKeys, ids: List[bytes]) -> List[Call]:
    """The promote calls for due ``ids`` of a queue that never held grouped jobs."""
    return [promote_call(k, k.pending, ids[s:s + PROMOTE_BATCH])
            for s in range(0, len(ids), PROMOTE_BATCH)]


def grouped_calls(k: QueueKeys, ids: List[bytes],
                  group_of: Dict[str, Optional[str]]) -> List[Call]:
    """The calls for due ``ids`` of a queue that has held grouped jobs: a ring join first
    when any is grouped, then promote calls per lane (``group_of``: id -> group)."""
    by_group: Dict[Optional[str], List[str]] = {}
    for raw in ids:
        job_id = raw.decode()
        by_group.setdefault(group_of.get(job_id), []).append(job_id)
    return lanes.lane_moves(k, by_group, lambda pending, part: promote_call(k, pending, part),
                            PROMOTE_BATCH)


def promote_op(k: QueueKeys, limit: int) -> Returns[int]:
    """Release up to ``limit`` (checked by the caller) due jobs of one queue; how many
    moved."""
    moved = 0
    for asked in batches(limit, DUE_BATCH):
        seen, n = yield from _round(k, asked)
        moved += n
        if seen < asked:  # the due head is drained
            break
    return moved


def _round(k: QueueKeys, asked: int) -> Op:
    """One round of :func:`promote_op`: ``(due ids seen, jobs moved)``."""
    grouped, ids = due_reply((yield due_call(k, asked)))
    if not ids:
        return 0, 0
    if grouped:
        # a grouped job rejoins its lane: promote.lua runs once per lane, with the lane
        # standing in for its pending set (queues that never had groups skip the lookup)
        by_group = yield from lanes.groups_of(k, [i.decode() for i in ids])
        group_of = {j: g for g, members in by_group.items() for j in members}
        calls = grouped_calls(k, ids, group_of)
    else:
        calls = ungrouped_calls(k, ids)
    if len(calls) == 1:  # a beat's few due jobs: one call on the client's own connection
        return len(ids), int((yield calls[0]))
    # a backlog: the round's calls pipelined through the Batcher (framed in C)
    replies = yield Batch(calls, via_batcher=True)
    return len(ids), lanes.combine_moves(calls, replies, lambda moves: sum(map(int, moves)))


_DUE = load("due")


class Due(NamedTuple):
    """A due.lua reply."""

    now_ms: int      # the server clock the script read
    grouped: bool    # the queue has ever held grouped jobs (False when meta was not asked)
    ids: List[str]   # due members, oldest first


def delayed_due(k: QueueKeys, limit: int) -> Call:
    """Due job ids on ``delayed`` (packed run-at scores), with the queue's grouped flag."""
    return Call(_DUE, [k.delayed, k.meta], [limit, 1])


def expired_leases(k: QueueKeys, limit: int) -> Call:
    """Job ids on ``active`` whose lease deadline passed, with the grouped flag."""
    return Call(_DUE, [k.active, k.meta], [limit, 0])


def due_schedules(k: QueueKeys, limit: int) -> Call:
    """Schedule names whose next run (``repeat`` score, epoch ms) has come."""
    return Call(_DUE, [k.repeat], [limit, 0])


def parse_due(reply: List[Any], with_meta: bool = True) -> Due:
    """Read a due.lua reply; ``with_meta``: the call declared the meta hash."""
    first = 2 if with_meta else 1
    return Due(int(reply[0]), with_meta and bool(int(reply[1])),
               [_text(member) for member in reply[first:]])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
