"""Moves across many queues in a few round trips.

:func:`promote_many` is ``Queue.promote`` for a thousand queues at once: one
pipelined pass of ``due.lua`` (read-only, on the server clock) learns every
queue's due ids, one pipelined HGET pass reads their groups (a grouped job rejoins
its lane, see :mod:`emqfast.facade.groups`), then one pipelined pass of ``promote.lua``
releases them, with every job key declared. The script passes go through the live
backend's Batcher (hiredis under the C backend), so the cost per queue is framing,
not a round trip.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import redis

from emqfast.backends import select as backend
from emqfast.backends.drive import run
from emqfast.core.ops import DUE_BATCH
from emqfast.core.errors import InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Cmd, Op, Returns
from emqfast.core.validation import check_int
from emqfast.facade.promote import (DUE_MANY_QUEUES, PROMOTE, PROMOTE_MANY_FEW, due_call,
                                    due_many_call, due_many_reply, due_reply, grouped_calls,
                                    promote_many_calls, ungrouped_calls)
from emqfast.server.connection import resolve

QueueLike = Union[str, Any]  # a queue name or an emqfast.Queue


def _keys_of(queues: Iterable[QueueLike]) -> List[QueueKeys]:
    out: List[QueueKeys] = []
    for q in queues:
        if isinstance(q, str):
            out.append(QueueKeys(q))  # validates the name
        elif isinstance(getattr(q, "keys", None), QueueKeys):
            out.append(q.keys)
        else:
            raise InvalidInput(f"expected a queue name or an emqfast.Queue, not {type(q).__name__}")
    return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


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
    :class:`emqfast.Queue` objects on that server. At most ``limit`` jobs per
    queue move in one call. Returns ``{queue name: jobs released}`` for every
    queue given. Same effect as ``Queue.promote`` on each, in a few pipelined round
    trips per round (a round reads at most ``DUE_BATCH`` due ids per queue and moves
    them ``PROMOTE_BATCH`` per script call: bounded work per call).
    """
    keys = validate(queues, limit)
    client = resolve(conn)
    held: List[Any] = []

    def one_batcher() -> Any:  # one Batcher for both passes (a C one is a connection)
        if not held:
            held.append(backend.batcher_for(client))
        return held[0]

    try:
        one_server = not isinstance(client, redis.RedisCluster)
        return run(client, promote_many_op(keys, limit, one_server), batcher=one_batcher)
    finally:
        for batcher in held:
            batcher.close()
