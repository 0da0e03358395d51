"""Promote: release a queue's due delayed jobs to pending, on the server clock, in bounded
calls. ``Queue.promote`` runs :func:`promote_op`; :func:`emqfast.promote_many` sends the
same :func:`promote_call` for many queues at once (:func:`promote_many`, below).

Each round reads up to :data:`DUE_BATCH` due ids with ``due.lua`` (read-only, so the next
step can declare the jobs' keys) and moves them with ``promote.lua``, :data:`PROMOTE_BATCH`
ids per call, a round's calls in one bulk through the backend Batcher, framed from the
ids and streamed in C under the C backend (:func:`ungrouped_columns`: Redis starts on the
first calls while the rest are framed; a round of one call goes on the client's own
connection). Ids and keys stay bytes from the due reply to the wire: a promoted job
costs no text decode or encode on the client.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import redis

from emqfast.backends import select as backend
from emqfast.backends.drive import run
from emqfast.backends.scripts import load, map_error
from emqfast.core.errors import InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import (DUE_BATCH, PROMOTE_BATCH, Batch, Call, Cmd, Columns, Op, Returns,
                              Slot, batches)
from emqfast.core.validation import check_int
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import lanes
from emqfast.server.connection import resolve

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


def ungrouped_columns(k: QueueKeys, ids: List[bytes]) -> Columns:
    """The same promote calls as :func:`ungrouped_calls` (``PROMOTE_BATCH`` ids each), as
    one :class:`~emqfast.core.ops.Columns` bulk: under the C backend the calls are framed
    in C from the ids and streamed, so Redis runs the first calls while the client frames
    the rest, and no per-call lists are built in Python."""
    delayed, marker, meta, events, prefix, pending = _framed(k)
    slots = [Slot(delayed), Slot(pending), Slot(marker), Slot(meta), Slot(events),
             Slot(prefix, 0, PROMOTE_BATCH), Slot(_VERSION), Slot(b"", 0, PROMOTE_BATCH)]
    return Columns(PROMOTE, 6, slots, [ids])


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
    if not grouped:
        if len(ids) <= PROMOTE_BATCH:  # a beat's few due jobs: one call, own connection
            return len(ids), int((yield promote_call(k, k.pending, ids)))
        # a backlog: the round's calls streamed through the Batcher
        return len(ids), (yield from _streamed(ungrouped_columns(k, ids)))
    # a grouped job rejoins its lane: promote.lua runs once per lane, with the lane
    # standing in for its pending set (queues that never had groups skip the lookup)
    by_group = yield from lanes.groups_of(k, [i.decode() for i in ids])
    group_of = {j: g for g, members in by_group.items() for j in members}
    calls = grouped_calls(k, ids, group_of)
    if len(calls) == 1:
        return len(ids), int((yield calls[0]))
    replies = yield Batch(calls, via_batcher=True)  # pipelined through the Batcher
    return len(ids), lanes.combine_moves(calls, replies, lambda moves: sum(map(int, moves)))


def _streamed(bulk: Columns) -> Op:
    """Jobs moved by the promote calls of ``bulk``, the first error reply raised (typed).
    A connection lost part-way raises :class:`~emqfast.backends.transport.BatchCut`, as a
    pipelined :class:`~emqfast.core.ops.Batch` does; nothing is re-sent (promote is
    idempotent per id: the caller's next promote re-reads what is due)."""
    replies = yield bulk
    for reply in replies:
        if isinstance(reply, Exception):
            raise _typed(reply)
    return sum(map(int, replies))


def _typed(reply: Any) -> Any:
    return map_error(reply) if isinstance(reply, redis.RedisError) else reply


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


QueueLike = Union[str, Any]  # a queue name or an emqfast.Queue


def _keys_of(queues: Iterable[QueueLike]) -> List[QueueKeys]:
    out: List[QueueKeys] = []
    for q in queues:
        if isinstance(q, str):
            out.append(QueueKeys(q))  # validates the name
        elif getattr(q, "is_partitioned", False):  # its partitions (see fold_partitions)
            out += [part.keys for part in q.partition_queues]
        elif isinstance(getattr(q, "keys", None), QueueKeys):
            out.append(q.keys)
        else:
            raise InvalidInput(f"expected a queue name or an emqfast.Queue, not {type(q).__name__}")
    return out


def fold_partitions(queues: Iterable[QueueLike], moved: Dict[str, int]) -> Dict[str, int]:
    """``moved`` with each partitioned queue's partitions summed under its own name."""
    for q in queues:
        if getattr(q, "is_partitioned", False):
            parts: Any = getattr(q, "partition_queues")
            moved[getattr(q, "name")] = sum(moved.pop(part.name, 0) for part in parts)
    return moved


def promote_many_op(keys: List[QueueKeys], limit: int,
                    one_server: bool = False) -> Returns[Dict[str, int]]:
    """The operation behind :func:`promote_many` (both facades): rounds of pipelined passes
    (due ids, their groups, the moves); a round reads at most ``DUE_BATCH`` due ids per
    queue and moves them in script calls of at most ``PROMOTE_BATCH`` jobs; a queue takes
    part in the next round while it had a full read due and ``limit`` allows more (a limit
    of at most ``DUE_BATCH`` is a single round). ``one_server``: every queue lives on one
    standalone server, so the due ids of many queues are read in one due_many.lua call."""
    moved = {k.name: 0 for k in keys}
    seen = {k.name: 0 for k in keys}
    active = list(keys)
    while active:
        asked = {k.name: min(DUE_BATCH, limit - seen[k.name]) for k in active}
        found, unread = yield from _promote_round(active, asked, moved, one_server)
        for k, ids in found:
            seen[k.name] += len(ids)
        active = unread + [k for k, ids in found
                           if len(ids) == asked[k.name] and seen[k.name] < limit]
    return moved


def _due_reads(keys: List[QueueKeys], asked: Dict[str, int], one_server: bool) -> Op:
    """The due ids of every queue in one pipelined pass: ``[(keys, (grouped, ids) or None
    when left unread)]``. On one server, due_many.lua reads many queues per call; should
    the server refuse it (e.g. a Cluster node reached by a plain client: the keys span
    slots), the read-only pass is simply made again with due.lua per queue."""
    if one_server:
        parts = [keys[s:s + DUE_MANY_QUEUES] for s in range(0, len(keys), DUE_MANY_QUEUES)]
        replies = yield Batch([due_many_call(part, asked) for part in parts], via_batcher=True)
        if not any(isinstance(reply, Exception) for reply in replies):
            reads: List[Tuple[QueueKeys, Any]] = []
            for part, reply in zip(parts, replies):
                reads += zip(part, due_many_reply(reply))
            return reads
    replies = yield Batch([due_call(k, asked[k.name]) for k in keys], via_batcher=True)
    return [(k, due_reply(_raised(reply))) for k, reply in zip(keys, replies)]


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _promote_round(keys: List[QueueKeys], asked: Dict[str, int], moved: Dict[str, int],
                   one_server: bool) -> Op:
    """One round of :func:`promote_many_op`: adds to ``moved``; returns the due ids seen
    per queue, ``[(keys, ids)]`` (queues with nothing due left out), and the queues left
    unread (read again next round)."""
    found: List[Tuple[QueueKeys, List[bytes]]] = []
    grouped: List[Tuple[QueueKeys, List[bytes]]] = []  # queues that have had grouped jobs
    unread: List[QueueKeys] = []
    for k, read in (yield from _due_reads(keys, asked, one_server)):
        if read is None:
            unread.append(k)
        elif read[1]:
            found.append((k, read[1]))
            if read[0]:
                grouped.append((k, read[1]))
    if not found:
        return found, unread
    group_of = (yield from _groups(grouped)) if grouped else {}
    calls, owners = [], []  # owners: per call, the queues its reply counts (in order)
    few = []  # on one server: queues moved by promote_many.lua, many per call
    for k, ids in found:
        known = group_of.get(k.name)
        if one_server and known is None and len(ids) <= PROMOTE_MANY_FEW:
            few.append((k, ids))
            continue
        # the very calls Queue.promote makes
        moves = ungrouped_calls(k, ids) if known is None else grouped_calls(k, ids, known)
        calls += moves
        owners += [[k.name] if call.script is PROMOTE else [] for call in moves]
    for call, names in promote_many_calls(few):
        calls.append(call)
        owners.append(names)
    # every move of the round in one pipelined batch
    for names, reply in zip(owners, (yield Batch(calls, via_batcher=True))):
        reply = _raised(reply)  # [] owners: a ring join, not a count
        counts = reply if isinstance(reply, list) else [reply] * len(names)
        for name, count in zip(names, counts):
            moved[name] += int(count)
    return found, unread


def _groups(grouped: List[Tuple[QueueKeys, List[bytes]]]) -> Op:
    """A grouped job rejoins its lane: the due jobs' groups, ``{queue: {id: group}}``, in
    one pipelined HGET pass (only for queues that ever held grouped jobs)."""
    found = yield Batch([Cmd.of("HGET", key, "group")
                         for k, ids in grouped for key in k.jobs(i.decode() for i in ids)])
    group_of: Dict[str, Dict[str, Optional[str]]] = {}
    at = 0
    for k, ids in grouped:
        group_of[k.name] = {i.decode(): (_text(g) if g is not None else None)
                            for i, g in zip(ids, found[at:at + len(ids)])}
        at += len(ids)
    return group_of


def validate(queues: Iterable[QueueLike], limit: int) -> List[QueueKeys]:
    """Check ``limit`` and every queue before anything is sent (or connected)."""
    check_int(limit, "limit", 1, 1_000_000)
    return _keys_of(queues)


def promote_many(conn: Any, queues: Iterable[QueueLike], limit: int = 1000) -> Dict[str, int]:
    """Release due delayed jobs of every queue in ``queues`` (server clock).

    ``conn`` is a redis-py client (or URL); ``queues`` are names or
    :class:`emqfast.Queue` objects on that server (a partitioned queue counts as one: its
    partitions' jobs are summed under its name). At most ``limit`` jobs per
    queue move in one call. Returns ``{queue name: jobs released}`` for every
    queue given. Same effect as ``Queue.promote`` on each, in a few pipelined round
    trips per round (a round reads at most ``DUE_BATCH`` due ids per queue and moves
    them ``PROMOTE_BATCH`` per script call: bounded work per call).
    """
    queues = list(queues)
    keys = validate(queues, limit)
    client = resolve(conn)
    held: List[Any] = []

    def one_batcher() -> Any:  # one Batcher for both passes (a C one is a connection)
        if not held:
            held.append(backend.batcher_for(client))
        return held[0]

    try:
        one_server = not isinstance(client, redis.RedisCluster)
        return fold_partitions(queues, run(client, promote_many_op(keys, limit, one_server),
                                           batcher=one_batcher))
    finally:
        for batcher in held:
            batcher.close()
