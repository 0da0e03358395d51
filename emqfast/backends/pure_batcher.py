"""Pure-Python twin of the C core's Batcher: many EVALSHA calls in one round trip
over redis-py (with the hiredis parser when installed)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from emqfast.core.errors import InvalidInput
from emqfast.core.ops import column_calls, expand_columns, rows_per_call
from emqfast.backends.scripts import send
from emqfast.backends.transport import Wait


class _Source:
    """A script known by its sha and source only (what a Batcher call carries)."""

    def __init__(self, sha: str, source: str, numkeys: int):
        self.sha = sha
        self.source = source
        self.numkeys = numkeys  # as given: a wrong count is the server's error to report

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> Tuple[Any, ...]:
        return ("EVALSHA", self.sha, self.numkeys, *keys, *args)


def _source(sha: Any, script: Any, numkeys: int) -> "_Source":
    sha = sha.decode() if isinstance(sha, bytes) else sha
    return _Source(sha, script.decode() if isinstance(script, bytes) else script, numkeys)


class Batcher:
    """Pipelines batches of EVALSHA calls on an existing redis-py client."""

    def __init__(self, client: "redis.Redis"):
        self.client = client

    @classmethod
    def from_redis(cls, client: "redis.Redis") -> "Batcher":
        """Wrap ``client`` (any redis-py client, cluster included)."""
        return cls(client)

    def evalsha_many(self, sha: str, script: bytes, numkeys: int,
                     calls: Sequence[Sequence[Any]], wait: Wait = None) -> List[Any]:
        """Run ``EVALSHA sha numkeys *call`` for every call, in order, in one round trip.

        Error replies are returned in their slot as ``redis.ResponseError``; calls that
        met NOSCRIPT are re-sent once after ``SCRIPT LOAD``. Never re-sent after a lost
        reply: see :func:`emqfast.backends.scripts.send` (partial replies in
        :class:`~emqfast.backends.transport.BatchCut`). ``wait``: as the C Batcher's.
        """
        if not calls:
            return [0] if wait else []
        source = _source(sha, script, numkeys)
        return send(self.client, [(source, call[:numkeys], call[numkeys:]) for call in calls],
                    wait, raw=True)

    def evalsha_flat(self, sha: str, script: bytes, numkeys: int, argc: int,
                     flat: Sequence[Any], wait: Wait = None) -> List[Any]:
        """Same as :meth:`evalsha_many` with every call ``argc`` values long, back to back."""
        calls = [flat[i:i + argc] for i in range(0, len(flat), argc)]
        if wait:
            return self.evalsha_many(sha, script, numkeys, calls, wait=wait)
        return self.evalsha_many(sha, script, numkeys, calls)

    def evalsha_columns(self, sha: str, script: bytes, numkeys: int,
                        slots: Sequence[Tuple[Any, Optional[int]]],
                        columns: Sequence[Sequence[Any]], wait: Wait = None) -> List[Any]:
        """Call ``i``'s argument ``s`` is ``slots[s][0]`` followed, when ``slots[s][1]`` is a
        column index, by ``columns[slots[s][1]][i]``; otherwise as :meth:`evalsha_many`.
        Slots with ``each`` (a third value) carry that many rows per call (see
        :class:`~emqfast.core.ops.Columns`): one reply per call."""
        ncalls = len(columns[0]) if columns else 0
        if any(len(col) != ncalls for col in columns):
            raise InvalidInput("columns differ in length")
        if any(slot[1] is not None and not 0 <= slot[1] < len(columns) for slot in slots):
            raise InvalidInput("a slot names a column that does not exist")
        if rows_per_call(slots) > 1:  # many rows per call: KEYS counts differ by call
            if not ncalls:
                return [0] if wait else []
            sources: Dict[int, Any] = {}
            return send(self.client, [
                (sources.setdefault(len(keys), _source(sha, script, len(keys))), keys, args)
                for keys, args in column_calls(numkeys, slots, columns)], wait, raw=True)
        calls = expand_columns(slots, columns)
        if wait:
            return self.evalsha_many(sha, script, numkeys, calls, wait=wait)
        return self.evalsha_many(sha, script, numkeys, calls)

    def close(self) -> None:
        """Nothing to release: the redis-py client owns the connection."""

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
