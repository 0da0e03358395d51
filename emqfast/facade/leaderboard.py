"""Leaderboards: members ranked by score on one sorted set (R4.05).

    board = emqfast.Leaderboard(conn, "course-42")
    board.set_many({"ada": 97, "linus": 88, "grace": 97})
    board.top(3)      # [Entry(1, 'ada', 97.0), Entry(2, 'grace', 97.0), Entry(3, 'linus', 88.0)]
    board.rank("linus")   # 3

Ordering: higher score first; **equal scores rank by member ascending** (byte
order of the UTF-8 member, i.e. alphabetical for ASCII names), the order people
expect from a table. Redis orders equal scores by member bytes *ascending*
inside a sorted set, so a plain ``ZREVRANGE`` would list ties Z..A. To make the
natural order and the cheap read coincide, the board stores the **negated**
score: ``ZRANGE`` / ``ZRANK`` (still O(log N)) then read highest-first with ties
A..Z, and ``top``, ``rank`` and ``around`` agree by construction. Negation is
exact for every double, so scores round-trip unchanged. (Seen raw in
``redis-cli``, the scores are negative: that is the stored form.)

Ranks are 1-based. Members are ``str`` (stored as UTF-8) or ``bytes``; they are
returned as ``str`` (bytes that are not UTF-8 come back with ``surrogateescape``
and can be passed back unchanged).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Union

import redis

from emqfast.server.connection import resolve
from emqfast.core.errors import InvalidInput, RangeError
from emqfast.core.keys import leaderboard_key
from emqfast.core.ops import Batch, Cmd, Op, Returns, Watched, operation
from emqfast.backends.drive import run

Member = Union[str, bytes]

# Doubles represent every integer up to 2**53 exactly; beyond, a score would be
# silently rounded, so such ints are refused instead.
MAX_EXACT_INT = 1 << 53
SET_MANY_CHUNK = 10_000  # members per ZADD inside the pipeline


class Entry(NamedTuple):
    """One row of a board: 1-based ``rank``, ``member`` and its ``score``."""

    rank: int
    member: str
    score: float


def check_member(member: Any) -> bytes:
    """``member`` as the bytes stored in Redis; :class:`InvalidInput` unless non-empty str/bytes."""
    if isinstance(member, str):
        try:
            data = member.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raise InvalidInput("member must be valid unicode text") from None
    elif isinstance(member, (bytes, bytearray, memoryview)):
        data = bytes(member)
    else:
        raise InvalidInput(f"member must be str or bytes, not {type(member).__name__}")
    if not data:
        raise InvalidInput("member must not be empty")
    return data


def check_score(score: Any, name: str = "score") -> float:
    """``score`` as a finite float; ints beyond 2**53 (not exact as doubles) are refused."""
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise InvalidInput(f"{name} must be an int or float, not {type(score).__name__}")
    if isinstance(score, int):
        if abs(score) > MAX_EXACT_INT:
            raise RangeError(f"{name}={score} is not exactly representable (|{name}| > 2**53)")
        return float(score)
    if not math.isfinite(score):
        raise RangeError(f"{name} must be finite, not {score!r}")
    return score


def _member_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def _score(stored: float) -> float:
    # stored = -score; "+ 0.0" turns the -0.0 of a zero score back into 0.0
    return -float(stored) + 0.0


class Leaderboard:
    """A named leaderboard on Redis. Cheap to create; holds no state but its key.

    ``conn`` is a redis client, a URL, or None (``EMQ_REDIS_URL`` / the embedded server).
    Operations are :mod:`emqfast.core.ops` generators; :class:`emqfast.aio.Leaderboard`
    overrides only ``_drive`` and the resolver.
    """

    _resolve = staticmethod(resolve)

    def __init__(self, conn: Any, name: str):
        self.key = leaderboard_key(name)
        self.name = name
        self.redis: redis.Redis = self._resolve(conn)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _drive(self, op: Op) -> Any:
        return run(self.redis, op)

    # --- writes ----------------------------------------------------------------
    @operation
    def set(self, member: Member, score: float) -> Returns[None]:
        """Set ``member``'s score (adding the member if new)."""
        data, value = check_member(member), check_score(score)
        yield Cmd.of("ZADD", self.key, -value, data)

    @operation
    def incr(self, member: Member, by: float = 1) -> Returns[float]:
        """Add ``by`` to ``member``'s score (from 0 if absent); returns the new score."""
        data, value = check_member(member), check_score(by, "by")
        return _score((yield Cmd.of("ZINCRBY", self.key, -value, data)))

    @operation
    def set_many(self, mapping: Mapping[Member, float]) -> Returns[int]:
        """Set many scores in one pipelined round trip; returns how many members were new.

        Every member and score is validated before anything is sent, so bad input
        writes nothing.
        """
        if not isinstance(mapping, Mapping):
            raise InvalidInput("set_many needs a mapping of member -> score")
        items: Dict[bytes, float] = {}
        for member, score in mapping.items():
            items[check_member(member)] = -check_score(score)
        if not items:
            return 0
        pairs = list(items.items())
        cmds = [Cmd.of("ZADD", self.key, *[x for member, score in pairs[start:start + SET_MANY_CHUNK]
                                           for x in (score, member)])
                for start in range(0, len(pairs), SET_MANY_CHUNK)]
        return sum(int(n) for n in (yield Batch(cmds)))

    @operation
    def remove(self, member: Member) -> Returns[bool]:
        """Remove ``member``; False if it was not on the board."""
        return bool((yield Cmd.of("ZREM", self.key, check_member(member))))

    @operation
    def clear(self) -> Returns[None]:
        """Delete the whole board."""
        yield Cmd.of("UNLINK", self.key)

    # --- reads -----------------------------------------------------------------
    @operation
    def size(self) -> Returns[int]:
        """Number of members."""
        return int((yield Cmd.of("ZCARD", self.key)))

    @operation
    def score(self, member: Member) -> Returns[Optional[float]]:
        """``member``'s score, or None when absent."""
        stored = yield Cmd.of("ZSCORE", self.key, check_member(member))
        return None if stored is None else _score(stored)

    @operation
    def rank(self, member: Member) -> Returns[Optional[int]]:
        """``member``'s 1-based rank (1 = highest score), or None when absent."""
        r = yield Cmd.of("ZRANK", self.key, check_member(member))
        return None if r is None else int(r) + 1

    @operation
    def top(self, n: int) -> Returns[List[Entry]]:
        """The ``n`` best entries, best first (fewer when the board is smaller)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidInput("n must be an int >= 0")
        if n == 0:
            return []
        rows = yield Cmd.of("ZRANGE", self.key, 0, n - 1, "WITHSCORES", withscores=True)
        return self._entries(rows, first_rank=1)

    @operation
    def around(self, member: Member, k: int) -> Returns[List[Entry]]:
        """``member`` with the ``k`` entries ranked above and the ``k`` below it
        (fewer at either end of the board); ``[]`` when ``member`` is absent.

        Rank and range are read under WATCH, so the window is one consistent
        snapshot even while other clients write.
        """
        data = check_member(member)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidInput("k must be an int >= 0")

        def window(r: Any) -> List[Cmd]:
            # r is read under WATCH (before MULTI); the range is then read atomically
            if r is None:
                return []
            return [Cmd.of("ZRANGE", self.key, max(int(r) - k, 0), int(r) + k, "WITHSCORES",
                           withscores=True)]

        r, replies = yield Watched([self.key], Cmd.of("ZRANK", self.key, data), window)
        if r is None:
            return []
        return self._entries(replies[0], first_rank=max(int(r) - k, 0) + 1)

    @staticmethod
    def _entries(rows: List[Any], first_rank: int) -> List[Entry]:
        return [Entry(first_rank + i, _member_text(m), _score(s)) for i, (m, s) in enumerate(rows)]
