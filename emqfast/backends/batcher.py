"""Running script calls through a Batcher (hiredis under the C backend).

:func:`run_calls` is :func:`emqfast.backends.scripts.run_pipeline` for a Batcher: the
same list of :class:`~emqfast.core.ops.Call` s, replies in call order, Lua errors
returned typed in their slot (a plain ``(script, keys, args)`` tuple is a Call too). A
Batcher frames one ``numkeys`` per batch, so calls are grouped by (script, KEYS count):
one round trip per group.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from emqfast.core import errors
from emqfast.core.ops import Call
from emqfast.backends.scripts import map_error
from emqfast.backends.transport import UNSENT, Wait, cut_error

__all__ = ["run_calls"]


def run_calls(batcher: Any, calls: Sequence[Call], wait: Wait = None) -> List[Any]:
    """Run every call (no MULTI); typed error replies are returned, not raised.

    Never re-sent after a lost reply: a batch cut part-way raises
    :class:`~emqfast.backends.transport.BatchCut` whose ``replies`` are in call order
    (typed). ``wait=(replicas, timeout_ms)``: a WAIT follows each group's writes on its
    connection; the list then ends with the fewest replicas that acknowledged."""
    if len(calls) == 1 and not wait:  # one call (a single enqueue): no grouping to do
        script, keys, args = calls[0]
        try:
            [reply] = batcher.evalsha_many(script.sha, script.source.encode(), len(keys),
                                           [[*keys, *args]])
        except errors.ConnectionFailed as cut:
            got = getattr(cut, "replies", None) or [UNSENT]
            raise cut_error(cut, [_typed(r) for r in got]) from cut
        return [_typed(reply)]
    groups: Dict[Tuple[str, int], List[int]] = {}
    for i, (script, keys, _) in enumerate(calls):
        groups.setdefault((script.sha, len(keys)), []).append(i)
    replies: List[Any] = [UNSENT] * len(calls)
    acked: Optional[int] = None
    for (_, numkeys), members in groups.items():
        script = calls[members[0]][0]
        rows = [[*keys, *args] for _, keys, args in (calls[i] for i in members)]
        try:
            if wait:
                got = batcher.evalsha_many(script.sha, script.source.encode(), numkeys, rows,
                                           wait)  # positional: wrappers forward *args
                acked = got[-1] if acked is None else min(acked, got[-1])
                got = got[:-1]
            else:
                got = batcher.evalsha_many(script.sha, script.source.encode(), numkeys, rows)
        except errors.ConnectionFailed as cut:  # earlier groups landed: report them too
            for i, reply in zip(members, getattr(cut, "replies", None) or [UNSENT] * len(rows)):
                replies[i] = _typed(reply)
            raise cut_error(cut, replies) from cut
        for i, reply in zip(members, got):
            replies[i] = _typed(reply)
    return replies + [acked] if wait else replies


def _typed(reply: Any) -> Any:
    # Not only ResponseError: a LOADING reply comes back as redis-py's BusyLoadingError
    # (a ConnectionError subclass), which map_error types as ServerBusy too.
    return map_error(reply) if isinstance(reply, redis.RedisError) else reply
