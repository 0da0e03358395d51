"""Cadence math (emqfast/cadence.py): intervals, cron slots across real DST
transitions, and the missed-run plan. Pure functions: no Redis needed.

The cron checks compare croniter-backed results with a brute-force reference
that scans every UTC minute of the window and converts it with zoneinfo, so a
croniter DST quirk cannot hide behind itself.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emqfast.core.cadence import Cron, Interval, plan
from emqfast.core.errors import InvalidInput

UTC = timezone.utc
MIN = 60_000
HOUR = 60 * MIN


def utc_ms(*args) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


def local(ms: int, tz: str) -> datetime:
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz))


def reference_slots(minutes, hours, tz, lo_ms, hi_ms):
    """Slots in [lo, hi] of a daily cron ``minutes hours * * *`` by brute force.

    ``hours=None`` means every hour. Rules (the documented ones): an appointment
    (fixed hours) runs at the first pass of a repeated wall time and, when its wall
    time falls in a spring-forward gap, at the first instant after the gap; an
    every-hour cron follows elapsed time (both passes, nothing for the gap).
    """
    z = ZoneInfo(tz)
    every_hour = hours is None
    hours = set(range(24)) if every_hour else set(hours)
    slots = set()
    t = lo_ms - lo_ms % MIN
    if t < lo_ms:
        t += MIN
    while t <= hi_ms:
        loc = datetime.fromtimestamp(t / 1000, z)
        if loc.hour in hours and loc.minute in minutes:
            second_pass = loc.fold == 1 and loc.replace(fold=0).utcoffset() != loc.utcoffset()
            if every_hour or not second_pass:
                slots.add(t)
        t += MIN
    if not every_hour:  # wall times that did not exist move to the end of the gap
        day = datetime.fromtimestamp(lo_ms / 1000, z).date() - timedelta(days=1)
        last_day = datetime.fromtimestamp(hi_ms / 1000, z).date() + timedelta(days=1)
        while day <= last_day:
            for h in hours:
                for m in minutes:
                    wall = datetime(day.year, day.month, day.day, h, m, tzinfo=z)
                    back = wall.astimezone(UTC).astimezone(z)
                    if (back.hour, back.minute) != (h, m):  # nonexistent wall time
                        # fold=0 reads a missing wall time with the pre-gap offset,
                        # which lands after the gap; walk back to the gap's end
                        t = int(wall.replace(fold=0).astimezone(UTC).timestamp() * 1000)
                        while datetime.fromtimestamp(t / 1000, z).replace(tzinfo=None) > \
                                wall.replace(tzinfo=None):
                            t -= MIN  # walk back to the first minute after the gap
                        t += MIN
                        if lo_ms <= t <= hi_ms:
                            slots.add(t)
            day += timedelta(days=1)
    return sorted(slots)


def forward(cadence, lo_ms, hi_ms):
    out, t = [], lo_ms - 1
    while True:
        t = cadence.next_after(t)
        if t is None or t > hi_ms:
            return out
        out.append(t)


# (tz, local date of the transition) for the four real 2026 transitions
TRANSITIONS = [
    ("Europe/Berlin", (2026, 3, 29)),     # 02:00 CET -> 03:00 CEST
    ("Europe/Berlin", (2026, 10, 25)),    # 03:00 CEST -> 02:00 CET (02:xx twice)
    ("America/New_York", (2026, 3, 8)),   # 02:00 EST -> 03:00 EDT
    ("America/New_York", (2026, 11, 1)),  # 02:00 EDT -> 01:00 EST (01:xx twice)
]
CRONS = [  # (expression, minutes, hours or None for every hour)
    ("30 2 * * *", {30}, {2}),
    ("30 1 * * *", {30}, {1}),
    ("0 2 * * *", {0}, {2}),
    ("0,30 2,3 * * *", {0, 30}, {2, 3}),
    ("*/15 * * * *", {0, 15, 30, 45}, None),
    ("30 * * * *", {30}, None),
]


@pytest.mark.parametrize("tz,day", TRANSITIONS)
@pytest.mark.parametrize("expr,minutes,hours", CRONS)
def test_cron_slots_match_brute_force_across_dst(tz, day, expr, minutes, hours):
    """next_after (forward) and latest (backward) give exactly the reference slots
    over the three days around each real 2026 transition."""
    z = ZoneInfo(tz)
    lo = int(datetime(*day, tzinfo=z).timestamp() * 1000) - 26 * HOUR
    hi = lo + 3 * 24 * HOUR
    cron = Cron(expr, tz)
    want = reference_slots(minutes, hours, tz, lo, hi)
    assert want, "reference found no slots: the window is wrong"
    assert forward(cron, lo, hi) == want
    assert cron.latest(lo, hi, 10_000) == want
    assert cron.latest(lo, hi, 3) == want[-3:]
    for s in want:  # "strictly after" holds from every slot and from just before it
        assert cron.next_after(s - 1) == s
        nxt = cron.next_after(s)
        assert nxt is not None and nxt > s


def day_slots(cron: Cron, tz: str, day) -> list:
    z = ZoneInfo(tz)
    start = int(datetime(*day, tzinfo=z).timestamp() * 1000)
    end = int((datetime(*day, tzinfo=z) + timedelta(days=1)).timestamp() * 1000) - 1
    return forward(cron, start, end)


def test_daily_0230_berlin_spring_forward_runs_once_at_0300():
    cron = Cron("30 2 * * *", "Europe/Berlin")
    slots = day_slots(cron, "Europe/Berlin", (2026, 3, 29))
    assert slots == [utc_ms(2026, 3, 29, 1, 0)]  # 03:00 CEST, the end of the gap
    assert local(slots[0], "Europe/Berlin").strftime("%H:%M%z") == "03:00+0200"


def test_daily_0230_berlin_fall_back_runs_once_at_first_pass():
    cron = Cron("30 2 * * *", "Europe/Berlin")
    slots = day_slots(cron, "Europe/Berlin", (2026, 10, 25))
    assert slots == [utc_ms(2026, 10, 25, 0, 30)]  # 02:30 CEST; not again at 02:30 CET
    # the days around it are ordinary
    assert day_slots(cron, "Europe/Berlin", (2026, 10, 24)) == [utc_ms(2026, 10, 24, 0, 30)]
    assert day_slots(cron, "Europe/Berlin", (2026, 10, 26)) == [utc_ms(2026, 10, 26, 1, 30)]


def test_daily_0230_new_york_spring_forward_and_fall_back():
    cron = Cron("30 2 * * *", "America/New_York")
    assert day_slots(cron, "America/New_York", (2026, 3, 8)) == [utc_ms(2026, 3, 8, 7, 0)]
    assert day_slots(cron, "America/New_York", (2026, 11, 1)) == [utc_ms(2026, 11, 1, 7, 30)]
    # New York repeats 01:xx: a 01:30 appointment also runs once, at 01:30 EDT
    cron = Cron("30 1 * * *", "America/New_York")
    assert day_slots(cron, "America/New_York", (2026, 11, 1)) == [utc_ms(2026, 11, 1, 5, 30)]


def test_every_hour_cron_follows_elapsed_time_across_dst():
    cron = Cron("0 * * * *", "Europe/Berlin")
    assert len(day_slots(cron, "Europe/Berlin", (2026, 3, 29))) == 23
    assert len(day_slots(cron, "Europe/Berlin", (2026, 10, 25))) == 25
    fall = day_slots(cron, "Europe/Berlin", (2026, 10, 25))
    assert all(b - a == HOUR for a, b in zip(fall, fall[1:]))


def test_cron_weekly_in_paris_and_whitespace_normalized():
    cron = Cron("  0 9  * * 1 ", "Europe/Paris")
    assert cron.expr == "0 9 * * 1"
    first = cron.next_after(utc_ms(2026, 3, 20, 12, 0))
    assert local(first, "Europe/Paris").strftime("%a %H:%M") == "Mon 09:00"
    assert cron.next_after(first) - first == 7 * 24 * HOUR - HOUR  # DST on 2026-03-29


def test_cron_next_after_is_strict_at_millisecond_resolution():
    cron = Cron("0 9 * * *", "UTC")
    slot = utc_ms(2026, 5, 1, 9, 0)
    assert cron.next_after(slot - 1) == slot
    assert cron.next_after(slot) == slot + 24 * HOUR
    assert cron.next_after(slot + 500) == slot + 24 * HOUR


def test_exhausted_cron_has_no_next():
    assert Cron("0 0 1 1 * 0 2020", "UTC").next_after(utc_ms(2026, 1, 1)) is None
    assert Cron("0 0 31 2 *", "UTC").next_after(utc_ms(2026, 1, 1)) is None


@pytest.mark.parametrize("expr", ["", "   ", "not a cron", "61 * * * *", "* * * *", "*/0 * * * *", 5])
def test_invalid_cron_is_typed_error(expr):
    with pytest.raises(InvalidInput):
        Cron(expr, "UTC")


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "../../etc/passwd", None, "Europe/"])
def test_unknown_timezone_is_typed_error(tz):
    with pytest.raises(InvalidInput):
        Cron("0 9 * * *", tz)


def test_interval_slots_anchor_on_start():
    iv = Interval(900_000, anchor_ms=1_000)
    assert iv.next_after(0) == 1_000
    assert iv.next_after(999) == 1_000
    assert iv.next_after(1_000) == 901_000
    assert iv.latest(0, 1_000 + 3 * 900_000, 2) == [1_000 + 2 * 900_000, 1_000 + 3 * 900_000]
    assert iv.latest(0, 999, 5) == []
    with pytest.raises(InvalidInput):
        Interval(0, 0)


@settings(max_examples=300, deadline=None)
@given(every=st.integers(1, 50), anchor=st.integers(0, 200), lo=st.integers(0, 400),
       span=st.integers(0, 400), n=st.integers(1, 30))
def test_interval_latest_matches_enumeration(every, anchor, lo, span, n):
    hi = lo + span
    iv = Interval(every, anchor)
    slots = [anchor + k * every for k in range(0, 1000) if lo <= anchor + k * every <= hi]
    assert iv.latest(lo, hi, n) == slots[-n:]
    x = lo
    nxt = iv.next_after(x)
    assert nxt > x and (nxt - anchor) % every == 0 and (nxt == anchor or nxt - every <= x)


# --- the missed-run plan --------------------------------------------------------------
def test_plan_on_time_is_start_to_start():
    iv = Interval(1000, 0)
    # due at 5000, pump runs late at 5999 (or a job would finish late): next is 6000, not 6999
    assert plan(iv, 5000, 5999, "skip", 100) == [(5000, 5000, 6000)]
    assert plan(iv, 5000, 4999, "skip", 100) == []  # not due yet


def test_plan_skip_runs_once_then_realigns():
    iv = Interval(1000, 0)
    assert plan(iv, 5000, 9500, "skip", 100) == [(5000, 9000, 10_000)]


def test_plan_catch_up_mints_each_missed_occurrence_as_a_cas_chain():
    iv = Interval(1000, 0)
    steps = plan(iv, 5000, 9500, "catch_up", 100)
    assert [s[1] for s in steps] == [5000, 6000, 7000, 8000, 9000]
    assert steps[0][0] == 5000 and steps[-1][2] == 10_000
    assert all(a[2] == b[0] for a, b in zip(steps, steps[1:]))  # each expects the previous next


def test_plan_catch_up_is_bounded_to_the_most_recent():
    iv = Interval(1000, 0)
    steps = plan(iv, 5000, 99_500, "catch_up", 3)
    assert [s[1] for s in steps] == [97_000, 98_000, 99_000]
    assert steps[0][0] == 5000 and steps[-1][2] == 100_000


def test_plan_exhausted_cron_mints_last_occurrence_with_no_next():
    cron = Cron("0 0 1 1 * 0 2026", "UTC")
    due = utc_ms(2026, 1, 1)
    assert plan(cron, due, due + 5, "skip", 10) == [(due, due, None)]
