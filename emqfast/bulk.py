"""Moves across many queues in a few round trips.

:func:`promote_many` is ``Queue.promote`` for a thousand queues at once: one
pipelined pass of ``due.lua`` (read-only, on the server clock) learns every
queue's due ids, then one pipelined pass of ``promote.lua`` releases them, with
every job key declared. Both passes go through the live backend's Batcher
(hiredis under the C backend), so the cost per queue is framing, not a round trip.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Union

from . import backend
from .errors import InvalidInput
from .keys import QueueKeys
from .ops import Batch, Call, Op, run
from .scripts import load
from .version import KEYSPACE_VERSION

_DUE = load("due")
_PROMOTE = load("promote")

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


def promote_many_op(keys: List[QueueKeys], limit: int) -> Op:
    """The operation behind :func:`promote_many` (both facades): two pipelined passes."""
    moved = {k.name: 0 for k in keys}
    if not keys:
        return moved
    due = yield Batch([Call(_DUE, [k.delayed], [limit, 1]) for k in keys], wire=True)
    calls, owners = [], []
    for k, reply in zip(keys, due):
        if isinstance(reply, Exception):
            raise reply
        ids = [_text(i) for i in reply[1:]]
        if ids:
            # the same call Queue.promote makes (tests hold the two in step)
            calls.append(Call(_PROMOTE, [k.delayed, k.pending, k.marker, k.meta, k.events,
                                             *k.jobs(ids)],
                              [KEYSPACE_VERSION, *ids]))
            owners.append(k.name)
    # One round trip per distinct due count (a single one when every queue had `limit`).
    for name, reply in zip(owners, (yield Batch(calls, wire=True))):
        if isinstance(reply, Exception):
            raise reply
        moved[name] += int(reply)
    return moved


def validate(queues: Iterable[QueueLike], limit: int) -> List[QueueKeys]:
    """Check ``limit`` and every queue before anything is sent (or connected)."""
    from .queue import check_int

    check_int(limit, "limit", 1, 1_000_000)
    return _keys_of(queues)


def promote_many(conn: Any, queues: Iterable[QueueLike], limit: int = 1000) -> Dict[str, int]:
    """Release due delayed jobs of every queue in ``queues`` (server clock).

    ``conn`` is a redis-py client (or URL); ``queues`` are names or
    :class:`emqfast.Queue` objects on that server. At most ``limit`` jobs per
    queue move in one call. Returns ``{queue name: jobs released}`` for every
    queue given. Same effect as ``Queue.promote`` on each, in two round trips.
    """
    from .connection import resolve

    keys = validate(queues, limit)
    client = resolve(conn)
    held: List[Any] = []

    def wire() -> Any:  # one Batcher for both passes (a C one is a connection)
        if not held:
            held.append(backend.batcher_for(client))
        return held[0]

    try:
        return run(client, promote_many_op(keys, limit), wire)
    finally:
        for batcher in held:
            batcher.close()
