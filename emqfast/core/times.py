"""Times and delays as the public API takes them: epoch-ms ints as always, or Python's own
aware :class:`~datetime.datetime` (a run-at) and :class:`~datetime.timedelta` (a delay).

Every path that takes a run-at or a delay (enqueue, enqueue_at, enqueue_in, enqueue_many,
schedules) converts it here, once, before anything is sent, so bad input never reaches
Redis. Conversions are exact integer arithmetic, truncated to whole milliseconds.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Union

from emqfast.core.errors import InvalidInput, RangeError
from emqfast.core.validation import check_int

RunAt = Union[int, datetime]      # epoch ms, or an aware datetime
Delay = Union[int, timedelta]     # ms, or a timedelta

_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_ONE_MS = timedelta(milliseconds=1)

# An epoch-ms run-at in [1e9, 1e11) is 1970-01-12 .. 1973-03-03: nobody means that. The
# same number read as epoch *seconds* is 2001-09-09 .. 5138 AD, i.e. every future time
# (and the recent past) a caller could have written as int(time.time()) by mistake, which
# would otherwise run at once. Smaller values (0, 5, ...) stay accepted: they are plainly
# "long ago, so due now" either way.
SECONDS_LOOKALIKE = (10**9, 10**11)


def _datetime_ms(value: datetime, name: str) -> int:
    """Epoch ms of an aware datetime; a naive one is refused (its zone is a guess)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidInput(
            f"{name} got a naive datetime (no time zone), which is ambiguous: attach one, "
            "e.g. datetime.now(timezone.utc) or dt.replace(tzinfo=ZoneInfo('Europe/Paris'))")
    return (value - _UNIX_EPOCH) // _ONE_MS


def run_at_ms(value: Any, name: str, hi: int) -> int:
    """``value`` (epoch ms int or aware datetime) as epoch ms in ``[0, hi]``.

    Raises :class:`InvalidInput` for a naive datetime or a non-int, :class:`RangeError`
    outside the range, and :class:`RangeError` for an int in ``[1e9, 1e11)``: it looks
    like epoch seconds (2001..5138 AD), not ms (1970..1973).
    """
    if isinstance(value, datetime):
        value = _datetime_ms(value, name)
    ms = check_int(value, name, 0, hi)
    lo, top = SECONDS_LOOKALIKE
    if lo <= ms < top:
        raise RangeError(
            f"{name}={ms} looks like epoch seconds, not milliseconds (as ms it is in "
            "1970-1973): pass epoch ms, e.g. int(time.time() * 1000), or an aware "
            "datetime such as datetime.now(timezone.utc) + timedelta(minutes=5)")
    return ms


def delay_ms(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` (ms int or timedelta, truncated to whole ms) as ms in ``[lo, hi]``."""
    if isinstance(value, timedelta):
        value = value // _ONE_MS
    return check_int(value, name, lo, hi)
