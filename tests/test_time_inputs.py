"""Python's own time types and the silent mistakes around times and names,
through both facades against a real Redis.

- an aware ``datetime`` is taken wherever a run-at is (``enqueue_at``, ``run_at_ms=``,
  schedules' ``start_at_ms=``) and lands at the same run-at as the equivalent epoch ms;
  a ``timedelta`` wherever a delay is (``enqueue_in``, ``delay_ms=``, ``every_ms=``);
- a naive datetime is refused (``InvalidInput`` saying to attach a zone), and so is a
  run-at that is plainly epoch seconds (``RangeError``), both with Redis untouched;
- queue, schedule and group names that are blank or hold control characters are refused.
"""
from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

import emqfast.aio
from emqfast import InvalidInput, Queue, RangeError

from conftest import dump_queue
from engine_util import server_ms

UNIX = datetime(1970, 1, 1, tzinfo=timezone.utc)
NAIVE = "naive datetime .*attach one.*timezone.utc"
SECONDS = "looks like epoch seconds, not milliseconds.*pass epoch ms"


def as_datetime(ms: int, zone=timezone.utc) -> datetime:
    """The aware datetime of epoch ``ms`` (exact: no float on the way)."""
    return (UNIX + timedelta(milliseconds=ms)).astimezone(zone)


def seeded(r, qname: str) -> Queue:
    """A queue with one job and one schedule, so "untouched" compares real keys."""
    q = Queue(qname, r)
    q.enqueue("seed")
    q.schedules.upsert("existing", every_ms=60_000)
    return q


# --- accepted: datetime and timedelta land where the ms ints do --------------------------

def test_aware_datetimes_land_at_the_same_run_at_as_ms(r, qname, backend):
    q = Queue(qname, r)
    run_at = server_ms(r) + 3_600_000
    paris = as_datetime(run_at, ZoneInfo("Europe/Paris"))
    kolkata = as_datetime(run_at, ZoneInfo("Asia/Kolkata")) + timedelta(microseconds=999)
    refs = [q.enqueue_at("ms", run_at), q.enqueue_at("utc", as_datetime(run_at)),
            q.enqueue_at("paris", paris), q.enqueue("kw", run_at_ms=kolkata),
            *q.enqueue_many(["a", "b"], run_at_ms=paris)]
    assert [ref.status for ref in refs] == ["scheduled"] * 6
    assert [q.get(ref.id).run_at_ms for ref in refs] == [run_at] * 6  # sub-ms truncated


def test_timedeltas_are_delays_in_ms(r, qname, backend):
    q = Queue(qname, r)
    before = server_ms(r)
    refs = [q.enqueue_in("td", timedelta(hours=1)), q.enqueue("kw", delay_ms=timedelta(hours=1)),
            *q.enqueue_many(["a", "b"], delay_ms=timedelta(minutes=60))]
    after = server_ms(r)
    for ref in refs:
        assert ref.status == "scheduled"
        assert before + 3_600_000 <= q.get(ref.id).run_at_ms <= after + 3_600_000
    now = q.enqueue_in("now", timedelta(0))
    assert now.status == "pending"


def test_schedules_take_timedelta_every_and_datetime_start(r, qname):
    q = Queue(qname, r)
    start = server_ms(r) + 600_000
    ms = q.schedules.upsert("ms", every_ms=90_000, start_at_ms=start)
    typed = q.schedules.upsert("typed", every_ms=timedelta(seconds=90),
                               start_at_ms=as_datetime(start, ZoneInfo("America/New_York")))
    assert (typed.every_ms, typed.start_at_ms, typed.next_run_ms) == \
        (ms.every_ms, ms.start_at_ms, ms.next_run_ms) == (90_000, start, start)
    cron = q.schedules.upsert("cron", cron="0 9 * * *", start_at_ms=as_datetime(start))
    assert cron.start_at_ms == start


def test_small_run_ats_still_mean_long_ago_so_due_now(r, qname):
    """0 and other values below 1e9 are not seconds anyone means: as today, due at once."""
    q = Queue(qname, r)
    assert [q.enqueue_at("x", at).status for at in (0, 5, 10**9 - 1)] == ["pending"] * 3
    assert q.enqueue_at("x", 10**11).status == "pending"  # 1973 in ms: past the band


# --- refused, Redis untouched ---------------------------------------------------------------

def naive_calls(q):
    naive = datetime.now() + timedelta(hours=1)
    return [lambda: q.enqueue_at("x", naive), lambda: q.enqueue("x", run_at_ms=naive),
            lambda: q.enqueue_many(["x", "y"], run_at_ms=naive),
            lambda: q.schedules.upsert("s", every_ms=1_000, start_at_ms=naive)]


def seconds_calls(q, seconds: int):
    return [lambda: q.enqueue_at("x", seconds), lambda: q.enqueue("x", run_at_ms=seconds),
            lambda: q.enqueue_many(["x", "y"], run_at_ms=seconds),
            lambda: q.schedules.upsert("s", every_ms=1_000, start_at_ms=seconds)]


def test_naive_datetime_is_refused_and_writes_nothing(r, qname, backend):
    q = seeded(r, qname)
    before = dump_queue(r, qname)
    for call in naive_calls(q):
        with pytest.raises(InvalidInput, match=NAIVE):
            call()
    assert dump_queue(r, qname) == before


@pytest.mark.parametrize("seconds", [int(time.time()), int(time.time()) + 3600, 10**9,
                                     10**11 - 1], ids=["now", "in-an-hour", "low", "high"])
def test_run_at_in_seconds_is_refused_and_writes_nothing(r, qname, backend, seconds):
    q = seeded(r, qname)
    before = dump_queue(r, qname)
    for call in seconds_calls(q, seconds):
        with pytest.raises(RangeError, match=SECONDS):
            call()
    # a datetime in seconds' clothing is still caught after conversion
    with pytest.raises(RangeError, match=SECONDS):
        q.enqueue_at("x", as_datetime(seconds))
    assert dump_queue(r, qname) == before


BAD_NAMES = ["", " ", "\t", "  \n ", "a\nb", "a\tb", "a\x00b", "a\x1fb", "a\x7fb", "tail\r"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=[repr(n) for n in BAD_NAMES])
def test_blank_and_control_character_names_are_refused(r, qname, name):
    with pytest.raises(InvalidInput, match="name"):
        Queue(name, r)
    q = seeded(r, qname)
    before = dump_queue(r, qname)
    with pytest.raises(InvalidInput, match="schedule name"):
        q.schedules.upsert(name, every_ms=1_000)
    with pytest.raises(InvalidInput, match="group name"):
        q.enqueue("x", group=name)
    with pytest.raises(InvalidInput, match="group name"):
        q.enqueue_many(["x"], group=name)
    with pytest.raises(InvalidInput, match="group name"):
        q.groups.set_concurrency(name, 1)
    assert dump_queue(r, qname) == before


def test_names_with_inner_spaces_and_unicode_still_work(r, qname):
    q = Queue(f"{qname} orders é", r)
    ref = q.enqueue({"k": 1}, group="team a")
    q.schedules.upsert("daily report", every_ms=60_000)
    assert q.get(ref.id).payload == {"k": 1}
    assert [s.name for s in q.schedules.list()] == ["daily report"]
    q.obliterate()


# --- the asyncio facade shares all of it --------------------------------------------------

def test_aio_facade_takes_and_refuses_the_same(redis_url, r, qname):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        try:
            run_at = server_ms(r) + 3_600_000
            at = await q.enqueue_at("dt", as_datetime(run_at, ZoneInfo("Europe/Paris")))
            many = await q.enqueue_many(["a"], run_at_ms=as_datetime(run_at))
            before = server_ms(r)
            later = await q.enqueue_in("td", timedelta(minutes=5))
            sched = await q.schedules.upsert("s", every_ms=timedelta(seconds=30),
                                             start_at_ms=as_datetime(run_at))
            assert (await q.get(at.id)).run_at_ms == (await q.get(many[0].id)).run_at_ms == run_at
            assert (await q.get(later.id)).run_at_ms >= before + 300_000
            assert (sched.every_ms, sched.start_at_ms) == (30_000, run_at)
            snapshot = dump_queue(r, qname)
            for call in [*naive_calls(q), *seconds_calls(q, int(time.time()))]:
                with pytest.raises((InvalidInput, RangeError), match=f"{NAIVE}|{SECONDS}"):
                    await call()
            with pytest.raises(InvalidInput, match="group name"):
                await q.enqueue("x", group="a\nb")
            with pytest.raises(InvalidInput, match="queue name"):
                emqfast.aio.Queue("a\nb", q.redis)
            assert dump_queue(r, qname) == snapshot
        finally:
            await q.aclose()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_discovery_skips_a_queue_whose_name_is_no_longer_valid(r, qname):
    """A queue named under older, looser rules (a blank name) must not break `emqfast
    stats` or the metrics exporter for every other queue."""
    from emqfast.core.keys import queue_meta_glob, queue_names_of
    from emqfast.tools.cli_queues import discover_queues

    good = emqfast.Queue(qname, r)
    good.enqueue("x")
    stale = "emq:{ }:meta"
    r.hset(stale, "version", emqfast.KEYSPACE_VERSION)
    try:
        assert qname in discover_queues(r) and " " not in discover_queues(r)
        assert " " not in queue_names_of(r.scan_iter(match=queue_meta_glob()))
        names = emqfast.metrics.Collector(r)._names()
        assert qname in names and " " not in names
    finally:
        r.delete(stale)
        good.obliterate()


def test_rate_windows_and_trim_ages_take_a_timedelta(r, qname):
    q = Queue(qname, r)
    q.set_rate_limit(10, timedelta(seconds=2))
    assert q.rate_limit() == (10, 2000)
    q.groups.set_rate_limit("tenant", 5, timedelta(milliseconds=1500))
    assert q.groups.rate_limit("tenant") == (5, 1500)
    q.enqueue("x")
    assert q.trim(max_age_ms=timedelta(hours=1)) == 0  # accepted: nothing that old
    with pytest.raises(InvalidInput):
        q.set_rate_limit(10, 2.5)  # still ms ints or timedeltas only
    q.obliterate()
