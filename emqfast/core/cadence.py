"""Cadence math for repeatable schedules: turning "when next?" into epoch-ms instants.

A cadence is a set of *slots* (instants, epoch ms). Two kinds:

- :class:`Interval` — ``anchor + k * every_ms`` for k >= 0 (a fixed gap, start to start).
- :class:`Cron` — the wall-clock matches of a cron expression in an IANA time zone,
  computed by ``croniter`` on ``zoneinfo``-aware datetimes (no hand-written parsing).

Both answer the same two questions, which is all the schedule pump needs:
``next_after(x)`` (the first slot strictly after instant x, or None when the cadence
is exhausted) and ``latest(lo, hi, n)`` (up to n most recent slots in [lo, hi]).
Nothing here reads a clock: callers pass the Redis server's "now".

DST rules for :class:`Cron` (checked against real transition dates in
tests/test_cadence.py):

- Spring forward: wall times inside the skipped hour do not exist. A cron pinned
  to particular hours (an appointment, e.g. ``30 2 * * *``) still runs once that
  day, at the first instant after the gap (02:30 becomes 03:00 in Europe/Berlin
  and America/New_York), because croniter moves a missing wall time to the end
  of the gap; an appointment silently dropped once a year is the worse surprise.
  A cron that fires every hour just has no slots in the hour that did not happen.
- Fall back: wall times in the repeated hour happen twice. An appointment runs
  once, at the first pass; a cron that fires every hour follows elapsed time and
  runs in both passes (Vixie cron's rule), so ``*/15 * * * *`` keeps its gap.
"""
from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import List, Optional, Tuple, Union
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from croniter.croniter import CroniterError

from emqfast.core.errors import InvalidInput

# A cron that matches nothing after a point (a year field in the past, Feb 30)
# makes croniter give up after a bounded search; this bounds our own skipping
# of second-pass slots on top of that.
_MAX_SCAN = 10_000


def normalize_cron(expr: str) -> str:
    """``expr`` with runs of whitespace collapsed (so equal crons compare equal)."""
    return " ".join(expr.split())


def zone(tz: str) -> ZoneInfo:
    """The IANA zone ``tz``, or :class:`InvalidInput` when it is unknown or malformed."""
    if not isinstance(tz, str) or not tz:
        raise InvalidInput("tz must be a non-empty IANA zone name such as 'Europe/Paris'")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"unknown time zone {tz!r}") from None


@lru_cache(maxsize=1024)
def _parse(expr: str) -> bool:
    """Validate a (normalized) cron expression; True when it fires every hour.

    croniter.is_valid rejects bad syntax; expanding the fields tells an every-hour
    cron from an appointment. Cached: parsing dominates the cost of an upsert.
    """
    if not croniter.is_valid(expr):
        raise InvalidInput(f"invalid cron expression {expr!r}")
    try:
        fields = croniter(expr).expanded
    except (CroniterError, ValueError, KeyError) as exc:
        raise InvalidInput(f"invalid cron expression {expr!r}: {exc}") from None
    every_hour: bool = fields[1] == ["*"]
    return every_hour


class Interval:
    """Slots ``anchor_ms + k * every_ms`` (k >= 0): a fixed gap measured start to start."""

    kind = "every"

    def __init__(self, every_ms: int, anchor_ms: int):
        if every_ms <= 0:
            raise InvalidInput("every_ms must be > 0")
        self.every_ms = every_ms
        self.anchor_ms = anchor_ms

    def __repr__(self) -> str:
        return f"Interval(every_ms={self.every_ms}, anchor_ms={self.anchor_ms})"

    def next_after(self, ms: int) -> Optional[int]:
        """The first slot strictly after ``ms``."""
        if ms < self.anchor_ms:
            return self.anchor_ms
        return self.anchor_ms + ((ms - self.anchor_ms) // self.every_ms + 1) * self.every_ms

    def latest(self, lo: int, hi: int, n: int) -> List[int]:
        """Up to ``n`` most recent slots in ``[lo, hi]``, oldest first (closed-form)."""
        first = self.next_after(lo - 1)
        if first is None or first > hi or n <= 0:
            return []
        last = self.anchor_ms + ((hi - self.anchor_ms) // self.every_ms) * self.every_ms
        count = min(n, (last - first) // self.every_ms + 1)
        return [last - (count - 1 - i) * self.every_ms for i in range(count)]


class Cron:
    """Wall-clock slots of a cron expression in time zone ``tz`` (see the module's DST rules)."""

    kind = "cron"

    def __init__(self, expr: str, tz: str = "UTC"):
        if not isinstance(expr, str) or not expr.strip():
            raise InvalidInput("cron must be a non-empty cron expression such as '0 9 * * 1'")
        self.expr = normalize_cron(expr)
        self.tz = tz
        self.zone = zone(tz)
        self.every_hour = _parse(self.expr)

    def __repr__(self) -> str:
        return f"Cron({self.expr!r}, tz={self.tz!r})"

    def _start(self, sec: int) -> datetime:
        # fromtimestamp sets `fold` right for the repeated hour; croniter's own
        # fold bookkeeping is not trusted anywhere below.
        return datetime.fromtimestamp(sec, self.zone)

    def _keep(self, sec: int) -> bool:
        """False for the second pass of a repeated wall time when this cron is an appointment."""
        if self.every_hour:
            return True
        local = datetime.fromtimestamp(sec, self.zone)
        return not (local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset())

    def next_after(self, ms: int) -> Optional[int]:
        """The first slot strictly after ``ms``; None when the cron never fires again."""
        # Slots are whole seconds, so "after ms" is "after floor(ms / 1000) s".
        it = croniter(self.expr, self._start(ms // 1000))
        for _ in range(_MAX_SCAN):
            try:
                sec: int = round(it.get_next(float))
            except CroniterError:
                return None
            if self._keep(sec):
                return sec * 1000
        return None

    def fires_after(self, ms: int) -> bool:
        """True when the cron has a slot after ``ms``.

        Without a year field a cron that fires once fires every few years at
        most, so the answer does not depend on ``ms`` and is cached.
        """
        if len(self.expr.split()) < 7 and not self.expr.startswith("@"):
            return _fires_at_all(self.expr, self.tz)
        return self.next_after(ms) is not None

    def latest(self, lo: int, hi: int, n: int) -> List[int]:
        """Up to ``n`` most recent slots in ``[lo, hi]``, oldest first.

        Walks backwards from ``hi`` so a long outage costs ``n`` steps, not one
        step per missed slot.
        """
        out: List[int] = []
        if n <= 0 or hi < lo:
            return out
        it = croniter(self.expr, self._start(hi // 1000 + 1))  # slots < floor(hi)+1 s
        for _ in range(n + _MAX_SCAN):
            try:
                sec = round(it.get_prev(float))
            except CroniterError:
                break
            ms = sec * 1000
            if ms < lo:
                break
            if ms <= hi and self._keep(sec) and (not out or ms < out[-1]):
                out.append(ms)
                if len(out) == n:
                    break
        out.reverse()
        return out


@lru_cache(maxsize=1024)
def _fires_at_all(expr: str, tz: str) -> bool:
    return Cron(expr, tz).next_after(_CHECK_FROM_MS) is not None


_CHECK_FROM_MS = 1_704_067_200_000  # 2024-01-01: any instant works for year-less crons

Cadence = Union[Interval, Cron]
# (expected registry ms, occurrence ms, next run ms or None); the expected ms is an int
# in every step made (Optional only because it is the previous step's next run)
Step = Tuple[Optional[int], int, Optional[int]]


def plan(cadence: Cadence, due_ms: int, now_ms: int, missed: str,
         catch_up_limit: int) -> List[Step]:
    """The occurrences to mint for a registry entry due at ``due_ms``, as of ``now_ms``.

    Returns ``[(expected_registry_ms, occurrence_ms, next_run_ms_or_None), ...]``:
    each step is one compare-and-set on the registry (the first expects ``due_ms``,
    each later one the previous step's next run). Next runs come from the
    occurrence's *scheduled* instant (start to start), never from "now" or from
    when a job finished, except when runs were missed:

    - on time (the slot after ``due_ms`` is still in the future): mint ``due_ms``;
    - ``skip``: mint once, the most recent missed slot, then realign to the cadence;
    - ``catch_up``: mint every missed slot in order, at most ``catch_up_limit`` of
      them (the most recent ones; older ones are dropped).
    """
    if due_ms > now_ms:
        return []
    nxt = cadence.next_after(due_ms)
    if nxt is None or nxt > now_ms:
        return [(due_ms, due_ms, nxt)]
    n = 1 if missed == "skip" else catch_up_limit
    slots = cadence.latest(due_ms, now_ms, n) or [due_ms]
    steps: List[Step] = []
    expected: Optional[int] = due_ms
    for i, occ in enumerate(slots):
        following = slots[i + 1] if i + 1 < len(slots) else cadence.next_after(occ)
        steps.append((expected, occ, following))
        expected = following
    return steps
