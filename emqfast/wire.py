"""Running script calls through a Batcher (hiredis under the C backend).

:func:`run_calls` is :func:`emqfast.scripts.run_pipeline` for a Batcher: the
same ``[(script, keys, args), ...]`` list, replies in call order, Lua errors
returned typed in their slot. A Batcher frames one ``numkeys`` per batch, so
calls are grouped by (script, KEYS count): one round trip per group.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import redis

from .scripts import Script, map_error

Call = Tuple[Script, Sequence[Any], Sequence[Any]]


def run_calls(batcher: Any, calls: Sequence[Call]) -> List[Any]:
    """Run every call (no MULTI); typed error replies are returned, not raised."""
    groups: Dict[Tuple[str, int], List[int]] = {}
    for i, (script, keys, _) in enumerate(calls):
        groups.setdefault((script.sha, len(keys)), []).append(i)
    replies: List[Any] = [None] * len(calls)
    for (_, numkeys), members in groups.items():
        script = calls[members[0]][0]
        got = batcher.evalsha_many(script.sha, script.source.encode(), numkeys,
                                   [[*calls[i][1], *calls[i][2]] for i in members])
        for i, reply in zip(members, got):
            replies[i] = map_error(reply) if isinstance(reply, redis.ResponseError) else reply
    return replies
