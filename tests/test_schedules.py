"""Repeatable schedules end to end on a real Redis (emqfast/schedules.py and the
schedule_*.lua scripts): upsert idempotency, exactly one job per occurrence under
racing pumps (threads and processes), start-to-start cadence, missed-run
policies, DST over real transitions, the wake marker, bad input, both backends.

The Redis clock cannot be moved, so tests that need many occurrences place a
schedule's start in the recent past (missed runs) or use gaps of a few ms.
Waits are conditions polled against deadlines, never sleeps.
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple
from zoneinfo import ZoneInfo

import pytest
import redis

import emqfast
from emqfast import Queue, Worker
from conftest import dump_queue
from emqfast.core.errors import InvalidInput, KindError, codes
from emqfast.core.ids import new_id
from emqfast.facade.schedules import Sweep, occurrence_job_id, occurrence_of
from emqfast.backends.scripts import load
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


# --- helpers -------------------------------------------------------------------------

class WorkerThread:
    """Run ``worker.run()`` in a thread; stop it and surface its error on exit."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.errors: List[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced in __exit__
            self.errors.append(exc)

    def __enter__(self) -> Worker:
        self.thread.start()
        return self.worker

    def __exit__(self, *exc: Any) -> None:
        self.worker.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "worker thread did not stop"
        if self.errors:
            raise self.errors[0]


def schedule_jobs(r: redis.Redis, q: Queue) -> Dict[str, List[Tuple[int, str]]]:
    """Every job hash of queue ``q`` minted by a schedule: name -> [(occurrence, id)], sorted.

    Read from the job hashes themselves (SCAN), independently of the registry."""
    out: Dict[str, List[Tuple[int, str]]] = {}
    prefix = q.keys.job("")
    keys = list(r.scan_iter(match=q.keys.glob()[:-1] + "job:*", count=1000))
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.hmget(key, "sched", "occ")
    for key, (name, occ) in zip(keys, pipe.execute()):
        if name is None:
            continue
        job_id = key.decode()[len(prefix):]
        out.setdefault(name.decode(), []).append((int(occ), job_id))
    for v in out.values():
        v.sort()
    return out


def now_ms(q: Queue) -> int:
    return q.server_time_ms()


# --- upsert ----------------------------------------------------------------------------
def boot_specs(n: int = 50) -> List[dict]:
    specs = []
    for i in range(n):
        if i % 2:
            specs.append(dict(name=f"job-{i}", cron=f"{i} 9 * * 1", tz="Europe/Paris",
                              payload={"i": i}))
        else:
            specs.append(dict(name=f"job-{i}", every_ms=900_000 + i, payload={"i": i},
                              priority=i))
    return specs


def test_1000_boots_upserting_the_same_50_schedules_leave_exactly_50(r, qname):
    """Each boot re-registers all 50 schedules (900 boots in one pipelined call, 100
    boots one upsert at a time): one registry entry and one record per name, and
    the timing set by the first boot is untouched."""
    q = Queue(qname, r)
    specs = boot_specs()
    first = {s.name: s for s in q.schedules.upsert_many(specs)}
    before = {s.name: (s.next_run_ms, s.generation, s.anchor_ms) for s in q.schedules.list()}
    for boot in range(1000):
        if boot % 10:
            q.schedules.upsert_many(specs)
        else:
            for spec in specs:
                spec = dict(spec)
                q.schedules.upsert(spec.pop("name"), **spec)
    assert r.zcard(q.keys.repeat) == 50
    records = list(r.scan_iter(match=q.keys.glob()[:-1] + "repeat:*", count=1000))
    assert len(records) == 50
    after = {s.name: (s.next_run_ms, s.generation, s.anchor_ms) for s in q.schedules.list()}
    assert after == before
    assert all(first[n].next_run_ms == before[n][0] for n in first)
    assert q.counts()["scheduled"] == q.counts()["pending"] == 0  # nothing pre-minted


def test_upsert_same_cadence_updates_options_in_place(r, qname):
    q = Queue(qname, r)
    start = now_ms(q) - 30
    a = q.schedules.upsert("report", every_ms=60_000, start_at_ms=start, payload="v1")
    b = q.schedules.upsert("report", every_ms=60_000, start_at_ms=start, payload="v2",
                           priority=7)
    assert (b.next_run_ms, b.generation) == (a.next_run_ms, a.generation)
    assert q.schedules.pump() == 1
    job = q.get(occurrence_job_id("report", start))
    assert job.payload == "v2" and job.priority == 7  # minted with the newest options


def test_cadence_change_rewrites_the_one_entry_and_fences_stale_pumps(r, qname):
    """A pump that planned under the old cadence cannot mint after the change; the
    registry holds one entry at the new cadence's next slot; nothing was pre-minted."""
    q = Queue(qname, r)
    old_start = now_ms(q) - 10_000
    old = q.schedules.upsert("rollup", every_ms=3_000, start_at_ms=old_start,
                             missed="catch_up")
    # A pump reads the due entry and plans its mints (as a slow pump would)...
    stale_calls = q.schedules._mint_calls(
        "rollup", r.hgetall(q.keys.schedule("rollup")), r.zscore(q.keys.repeat, "rollup"),
        now_ms(q))
    assert len(stale_calls) == 4  # old slots at -10s, -7s, -4s, -1s
    # ...meanwhile the cadence changes to a daily cron.
    new = q.schedules.upsert("rollup", cron="0 3 * * *", tz="Europe/Berlin")
    assert new.generation != old.generation
    assert r.zcard(q.keys.repeat) == 1
    assert new.next_run_ms > now_ms(q)
    assert datetime.fromtimestamp(new.next_run_ms / 1000, ZoneInfo("Europe/Berlin")) \
        .strftime("%H:%M") == "03:00"
    # the stale plan is a no-op: no job under the old cadence, registry untouched
    assert q.schedules._run_mints(stale_calls) == 0
    assert schedule_jobs(r, q) == {}
    assert q.schedules.pump() == 0
    assert q.schedules.get("rollup").next_run_ms == new.next_run_ms
    assert q.counts() == {"scheduled": 0, "pending": 0, "grouped": 0, "active": 0,
                          "completed": 0, "failed": 0, "cancelled": 0,
                          "waiting_deps": 0, "expired": 0}


def test_cadence_change_with_an_unchanged_next_run_still_fences_stale_pumps(r, qname):
    """Old and new cadence share their first slot (same start, different gap), so the
    registry score does not move: the generation alone stops a pump that planned
    under the old gap from minting the old grid."""
    q = Queue(qname, r)
    start = now_ms(q) - 10_000
    q.schedules.upsert("grid", every_ms=3_000, start_at_ms=start, missed="catch_up")
    stale_calls = q.schedules._mint_calls(
        "grid", r.hgetall(q.keys.schedule("grid")), r.zscore(q.keys.repeat, "grid"), now_ms(q))
    new = q.schedules.upsert("grid", every_ms=7_000, start_at_ms=start, missed="catch_up")
    assert new.next_run_ms == start  # same registry score as before the change
    assert q.schedules._run_mints(stale_calls) == 0
    assert schedule_jobs(r, q) == {}
    assert q.schedules.pump() == 2
    assert [o for o, _ in schedule_jobs(r, q)["grid"]] == [start, start + 7_000]


def test_cadence_change_never_reruns_a_minted_occurrence(r, qname):
    """The new cadence starts after the last minted occurrence, even when its first
    slot would otherwise fall on or before it."""
    q = Queue(qname, r)
    start = now_ms(q) - 5_000
    q.schedules.upsert("s", every_ms=1_000, start_at_ms=start, missed="catch_up")
    assert q.schedules.pump() == 6
    before = {o for o, _ in schedule_jobs(r, q)["s"]}
    last = q.schedules.get("s").last_occurrence_ms
    assert last == max(before)
    # the new 700 ms grid from the same start has slots at or before `last` (0, 2100, 4200)
    changed = q.schedules.upsert("s", every_ms=700, start_at_ms=start, missed="catch_up")
    assert changed.next_run_ms > last and (changed.next_run_ms - start) % 700 == 0
    q.schedules.pump()
    wait_until(lambda: q.schedules.pump() or now_ms(q) > changed.next_run_ms + 700, 10,
               "two slots of the new grid")
    q.schedules.pump()
    new = {o for o, _ in schedule_jobs(r, q)["s"]} - before
    assert new and all(o > last and (o - start) % 700 == 0 for o in new)


# --- exactly one job per occurrence ---------------------------------------------------
def assert_contiguous(occs: List[int], start: int, every: int) -> None:
    assert occs == list(range(start, start + every * len(occs), every)), \
        "occurrences are not exactly the cadence's slots, each once"


def test_eight_racing_pump_threads_mint_each_occurrence_once(r, redis_url, qname, backend):
    """8 threads pump as fast as they can while 4 schedules (every 20 ms) work off a
    backlog of 60 missed slots each and keep producing new ones: each occurrence is
    minted exactly once, with no gaps (catch_up), and the pumps' own counts agree."""
    q = Queue(qname, r)
    every, backlog, names = 20, 60, [f"tick-{i}" for i in range(4)]
    start = now_ms(q) - backlog * every
    for name in names:
        q.schedules.upsert(name, every_ms=every, start_at_ms=start, missed="catch_up",
                           catch_up_limit=10_000, payload=name)
    end = now_ms(q) + 600
    barrier = threading.Barrier(8)
    minted: List[int] = []
    errors: List[BaseException] = []

    def pump_loop() -> None:
        try:
            mine = Queue(qname, redis.Redis.from_url(redis_url))
            barrier.wait()
            total = 0
            while now_ms(mine) < end:
                total += mine.schedules.pump(limit=2)
            minted.append(total)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=pump_loop) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    jobs = schedule_jobs(r, q)
    total = sum(len(v) for v in jobs.values())
    assert total >= 200
    assert sum(minted) == total  # no pump counted a job another also counted
    for name in names:
        occs = [o for o, _ in jobs[name]]
        assert_contiguous(occs, start, every)
        assert all(job_id == occurrence_job_id(name, o) for o, job_id in jobs[name])
        sched = q.schedules.get(name)
        assert sched.last_occurrence_ms == occs[-1]
        assert sched.next_run_ms == occs[-1] + every
    assert q.counts()["pending"] == total


def test_eight_racing_pump_processes_mint_each_occurrence_once(r, redis_url, qname, backend):
    """8 separate processes, released together, pump the same backlog of 5 schedules ×
    60 missed occurrences: exactly 300 jobs, one per occurrence, and the processes'
    mint counts add up to 300."""
    q = Queue(qname, r)
    every, backlog = 60_000, 60
    start = now_ms(q) - backlog * every + 30_000  # 60 slots in the past, next in ~30 s
    names = [f"hourly-{i}" for i in range(5)]
    for name in names:
        q.schedules.upsert(name, every_ms=every, start_at_ms=start, missed="catch_up",
                           catch_up_limit=1_000)
    ready, go = f"test:{qname}:ready", f"test:{qname}:go"
    script = str(ROOT / "tests" / "schedule_procs.py")
    procs = [subprocess.Popen([sys.executable, script, redis_url, qname, backend, ready, go],
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        wait_until(lambda: r.llen(ready) == 8, 60, "8 pump processes ready")
        r.rpush(go, *range(8))  # release them together
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        r.delete(ready, go)
    assert [p.returncode for p in procs] == [0] * 8
    counts = [json.loads(o)["minted"] for o in outs]
    jobs = schedule_jobs(r, q)
    assert sum(counts) == 300
    for name in names:
        assert_contiguous([o for o, _ in jobs[name]], start, every)
        assert len(jobs[name]) == backlog
    assert q.counts()["pending"] == 300


def test_occurrence_id_is_derived_from_name_and_instant():
    a = occurrence_job_id("nightly", 1_795_000_000_000)
    assert a == occurrence_job_id("nightly", 1_795_000_000_000)
    assert a.startswith("JOB") and len(a) == 32
    assert occurrence_of(a) == 1_795_000_000_000
    assert a != occurrence_job_id("nightly2", 1_795_000_000_000)
    assert occurrence_job_id("x", 1_000) < occurrence_job_id("x", 2_000)  # sorts by instant
    assert occurrence_of(new_id()) is None


def test_second_mint_of_the_same_occurrence_is_a_no_op(r, qname, backend):
    q = Queue(qname, r)
    start = now_ms(q) - 10
    q.schedules.upsert("once", every_ms=3_600_000, start_at_ms=start)
    calls = q.schedules._mint_calls("once", r.hgetall(q.keys.schedule("once")),
                                    r.zscore(q.keys.repeat, "once"), now_ms(q))
    assert q.schedules._run_mints(calls) == 1
    snapshot = dump_queue(r, qname)
    assert q.schedules._run_mints(calls) == 0  # replayed: CAS fails, nothing written
    assert dump_queue(r, qname) == snapshot
    # A pump that planned long ago replays after the job ran and was trimmed away:
    # the registry has moved on, so the occurrence is not minted a second time.
    Worker(q, lambda job: None).run_until_idle(timeout_s=20)
    assert q.trim(keep_completed=0) == 1
    assert q.get(occurrence_job_id("once", start)) is None
    assert q.schedules._run_mints(calls) == 0
    assert q.get(occurrence_job_id("once", start)) is None


# --- start to start -------------------------------------------------------------------
def test_slow_job_does_not_drift_the_cadence(r, qname, backend):
    """A worker with one slot is stuck in the first occurrence's handler while the
    schedule keeps its cadence: occurrences and the next run stay on the
    start + k * every grid, measured from scheduled instants, not finishes."""
    q = Queue(qname, r)
    every = 100
    release = threading.Event()
    started: List[str] = []

    def handler(job: emqfast.Job) -> None:
        started.append(job.id)
        release.wait(20)  # the slow job

    start = now_ms(q) + 50
    q.schedules.upsert("beat", every_ms=every, start_at_ms=start, missed="catch_up")
    worker = Worker(q, handler, concurrency=1, lease_ms=400)  # beat every 100 ms
    with WorkerThread(worker):
        wait_until(lambda: len(schedule_jobs(r, q).get("beat", [])) >= 6, 20,
                   "6 occurrences minted while the first job is still running")
        assert len(started) == 1 and q.get(started[0]).state == "active"
        release.set()
    sched = q.schedules.get("beat")  # the worker has stopped: a consistent view
    occs = [o for o, _ in schedule_jobs(r, q)["beat"]]
    assert_contiguous(occs, start, every)
    assert sched.next_run_ms == sched.last_occurrence_ms + every
    assert (sched.next_run_ms - start) % every == 0


# --- missed runs ------------------------------------------------------------------------
def test_missed_runs_skip_runs_once_then_realigns(r, qname, backend):
    q = Queue(qname, r)
    # a cadence far longer than the test takes on a loaded machine: the last pump must not
    # find the next slot due already
    every = 60_000
    start = now_ms(q) - 10 * every - 500  # 11 slots missed
    q.schedules.upsert("digest", every_ms=every, start_at_ms=start)  # missed="skip"
    before = now_ms(q)
    assert q.schedules.pump() == 1
    jobs = schedule_jobs(r, q)["digest"]
    assert len(jobs) == 1
    occ = jobs[0][0]
    assert (occ - start) % every == 0 and before - every < occ <= now_ms(q)  # most recent slot
    sched = q.schedules.get("digest")
    assert sched.next_run_ms == occ + every > before  # realigned to the cadence
    assert q.get(jobs[0][1]).state == "pending"       # runs now
    assert q.schedules.pump() == 0


def test_missed_runs_catch_up_mints_every_missed_occurrence(r, qname, backend):
    q = Queue(qname, r)
    every = 60_000  # longer than the test takes under load: no 12th slot comes due
    start = now_ms(q) - 10 * every - 500
    q.schedules.upsert("billing", every_ms=every, start_at_ms=start, missed="catch_up")
    assert q.schedules.pump() == 11
    occs = [o for o, _ in schedule_jobs(r, q)["billing"]]
    assert_contiguous(occs, start, every)
    assert q.schedules.get("billing").next_run_ms == occs[-1] + every > now_ms(q) - every
    assert q.counts()["pending"] == 11


def test_missed_runs_catch_up_is_bounded_to_the_most_recent(r, qname, backend):
    q = Queue(qname, r)
    every = 60_000
    start = now_ms(q) - 10 * every - 500
    q.schedules.upsert("b", every_ms=every, start_at_ms=start, missed="catch_up",
                       catch_up_limit=4)
    assert q.schedules.pump() == 4
    occs = [o for o, _ in schedule_jobs(r, q)["b"]]
    assert occs == [start + k * every for k in range(7, 11)]


# --- DST, end to end -------------------------------------------------------------------
def recent_transitions(tz: str, now: int) -> Dict[str, datetime]:
    """The most recent spring-forward and fall-back local dates (midnight) before ``now``."""
    z = ZoneInfo(tz)
    day = datetime.fromtimestamp(now / 1000, z).replace(hour=12, minute=0, second=0,
                                                        microsecond=0)
    found: Dict[str, datetime] = {}
    for _ in range(800):
        prev = day - timedelta(days=1)
        delta = day.utcoffset() - prev.utcoffset()
        if delta > timedelta(0):
            found.setdefault("spring", day.replace(hour=0))
        elif delta < timedelta(0):
            found.setdefault("fall", day.replace(hour=0))
        if len(found) == 2:
            return found
        day = prev
    raise AssertionError(f"no DST transitions found for {tz}")


@pytest.mark.parametrize("tz,expr,spring_hm,fall_utc_offset", [
    ("Europe/Berlin", "30 2 * * *", "03:00", "+0200"),    # 02:30 repeats in Berlin
    ("America/New_York", "30 1 * * *", "01:30", "-0400"),  # 01:30 repeats in New York
    ("America/New_York", "30 2 * * *", "03:00", "-0500"),
])
def test_daily_cron_over_real_dst_transitions_runs_once_each_day(
        r, qname, backend, tz, expr, spring_hm, fall_utc_offset):
    """A daily appointment started two days before the most recent spring-forward
    (and fall-back) transition is caught up to now: exactly one job per local day,
    including both transition days; spring-forward runs at the end of the gap when
    the wall time did not exist, fall-back runs at the first pass."""
    q = Queue(qname, r)
    now = now_ms(q)
    days = recent_transitions(tz, now)
    begin = min(days.values()) - timedelta(days=2)
    total_days = (datetime.fromtimestamp(now / 1000, ZoneInfo(tz)) - begin).days + 2
    q.schedules.upsert("nightly", cron=expr, tz=tz, start_at_ms=int(begin.timestamp() * 1000),
                       missed="catch_up", catch_up_limit=total_days + 5)
    q.schedules.pump()
    z = ZoneInfo(tz)
    per_day: Dict[Any, List[datetime]] = {}
    for occ, _ in schedule_jobs(r, q)["nightly"]:
        at = datetime.fromtimestamp(occ / 1000, z)
        per_day.setdefault(at.date(), []).append(at)
    assert all(len(v) == 1 for v in per_day.values()), "a day ran twice"
    first_day, last_day = min(per_day), max(per_day)
    assert len(per_day) == (last_day - first_day).days + 1, "a day was skipped"
    spring = per_day[days["spring"].date()][0]
    fall = per_day[days["fall"].date()][0]
    assert spring.strftime("%H:%M") == spring_hm
    assert fall.strftime("%H:%M") == expr.split()[1].zfill(2) + ":" + expr.split()[0]
    assert fall.strftime("%z") == fall_utc_offset


# --- wake marker -----------------------------------------------------------------------
def test_mint_points_the_wake_marker_at_the_next_run(r, qname, backend):
    q = Queue(qname, r)
    start = now_ms(q) - 10
    q.schedules.upsert("m", every_ms=60_000, start_at_ms=start)
    r.zadd(q.keys.marker, {"1": 5})  # a spent wake-up from long ago must not hide the next run
    assert q.schedules.pump() == 1
    assert r.zscore(q.keys.marker, "1") == start + 60_000
    assert r.zscore(q.keys.marker, "0") == 0  # the minted job is ready now


def test_upsert_points_the_wake_marker_at_the_first_run(r, qname):
    q = Queue(qname, r)
    s = q.schedules.upsert("m", every_ms=5_000)
    assert r.zscore(q.keys.marker, "1") == s.next_run_ms


def blocked_on_marker(r: redis.Redis, client_name: str) -> bool:
    """True while a connection named ``client_name`` is blocked in BZPOPMIN (an idle worker)."""
    return any(c.get("name") == client_name and "b" in c.get("flags", "")
               and c.get("cmd") == "bzpopmin" for c in r.client_list())


def test_idle_worker_wakes_for_each_run_not_on_its_beat(r, redis_url, qname, backend):
    """A worker blocked idle (beat every 1 s) mints and runs occurrences 400 ms apart
    within a few ms of each scheduled instant: the upsert's and each mint's wake
    marker, and the pump's next run, bound the worker's wait (not its beat, nor
    Redis's 100 ms blocking-timeout tick)."""
    q = Queue(qname, r)
    done: List[str] = []
    name = f"w-{qname}"
    wq = Queue(qname, redis.Redis.from_url(redis_url, client_name=name))
    worker = Worker(wq, lambda job: done.append(job.id), concurrency=2, lease_ms=30_000)
    assert worker.beat_s == 1.0
    with WorkerThread(worker):
        wait_until(lambda: blocked_on_marker(r, name), 10, "worker blocked idle")
        start = now_ms(q) + 300
        q.schedules.upsert("ping", every_ms=400, start_at_ms=start)  # registered elsewhere
        wait_until(lambda: len(done) >= 4, 15, "4 occurrences run")
    lateness = sorted(q.get(j).started_ms - occurrence_of(j) for j in done[:4])
    # a beat-driven pump would be up to 1000 ms late, Redis's own timeout tick up to 100
    assert lateness[0] >= 0 and lateness[-1] < 90 and lateness[1] < 30, lateness


# --- bad input -------------------------------------------------------------------------
BAD = [
    dict(cron="not a cron"),
    dict(cron="61 * * * *"),
    dict(cron="0 0 31 2 *"),                       # valid syntax, never fires
    dict(cron="0 9 * * *", tz="Mars/Olympus"),
    dict(cron="0 9 * * *", tz=""),
    dict(every_ms=0),
    dict(every_ms=-5),
    dict(every_ms=1.5),
    dict(every_ms=True),
    dict(cron="0 9 * * *", every_ms=1_000),        # both
    dict(),                                        # neither
    dict(every_ms=1_000, tz="UTC"),                # tz means nothing for an interval
    dict(every_ms=1_000, missed="sometimes"),
    dict(every_ms=1_000, catch_up_limit=0),
    dict(every_ms=1_000, payload=object()),
    dict(every_ms=1_000, priority=-1),
    dict(every_ms=1_000, attempts=0),
    dict(every_ms=1_000, start_at_ms=-1),
]


@pytest.mark.parametrize("kwargs", BAD, ids=[repr(b) for b in BAD])
def test_bad_input_is_typed_and_leaves_redis_unchanged(r, qname, kwargs):
    q = Queue(qname, r)
    q.schedules.upsert("existing", cron="0 9 * * 1", tz="Europe/Paris", payload={"a": 1})
    q.schedules.upsert("nightly", every_ms=60_000)
    snapshot = dump_queue(r, qname)
    with pytest.raises(InvalidInput):
        q.schedules.upsert("existing", **kwargs)
    with pytest.raises(InvalidInput):
        q.schedules.upsert("fresh", **kwargs)
    with pytest.raises(InvalidInput):
        q.schedules.upsert_many([dict(name="nightly", every_ms=60_000), dict(name="x", **kwargs)])
    assert dump_queue(r, qname) == snapshot


@pytest.mark.parametrize("name", ["", "a{b}", "x" * 201, 42, "\udcff"])
def test_bad_schedule_name_is_typed_and_leaves_redis_unchanged(r, qname, name):
    q = Queue(qname, r)
    q.schedules.upsert("existing", every_ms=60_000)
    snapshot = dump_queue(r, qname)
    for call in (lambda: q.schedules.upsert(name, every_ms=1_000), lambda: q.schedules.get(name),
                 lambda: q.schedules.remove(name)):
        with pytest.raises(InvalidInput):
            call()
    assert dump_queue(r, qname) == snapshot


def test_bad_input_is_refused_by_the_scripts_too(r, qname):
    """Called directly with nonsense, the Lua side refuses before its first write."""
    q = Queue(qname, r)
    k = q.keys
    snapshot = dump_queue(r, qname)
    mint, upsert = load("schedule_mint"), load("schedule_upsert")
    mint_keys = [k.repeat, k.schedule("s"), k.job("JOBX"), k.pending, k.delayed, k.marker,
                 k.meta, k.counter, k.events]
    for args in (["s", 10, "1", 5, 20, "JOBX", "emqfast:1.0"],      # occurrence < expected
                 ["s", 10, "1", 10, 10, "JOBX", "emqfast:1.0"],     # next <= occurrence
                 ["s", "x", "1", 10, 20, "JOBX", "emqfast:1.0"]):
        with pytest.raises(InvalidInput):
            mint(r, mint_keys, args)
    with pytest.raises(KindError):
        mint(r, mint_keys, ["s", 10, "1", 10, 20, "NOPE", "emqfast:1.0"])
    up_keys = [k.repeat, k.schedule("s"), k.meta, k.marker, k.counter]
    for args in (["s", "sig", "bogus", "", "", "", "emqfast:1.0", "kind", "every"],
                 ["s", "sig", "set", "", "soon", "", "emqfast:1.0", "kind", "every"],
                 ["s", "sig", "set", "", 5, "", "emqfast:1.0", "gen", "99"],
                 ["s", "sig", "keep", "", "", "", "emqfast:1.0", "odd"]):
        with pytest.raises(InvalidInput):
            upsert(r, up_keys, args)
    assert dump_queue(r, qname) == snapshot


def test_schedule_scripts_are_fenced_against_another_keyspace_major(r, qname):
    """A queue written by another major version: upsert, pump and remove refuse
    (VersionMismatch) and write nothing."""
    q = Queue(qname, r)
    q.schedules.upsert("due", every_ms=60_000, start_at_ms=now_ms(q) - 10)
    r.hset(q.keys.meta, "version", "emqfast:9.0")
    snapshot = dump_queue(r, qname)
    for call in (lambda: q.schedules.upsert("new", every_ms=1_000),
                 lambda: q.schedules.upsert("due", every_ms=60_000, start_at_ms=5),
                 lambda: q.schedules.pump(),
                 lambda: q.schedules.remove("due")):
        with pytest.raises(emqfast.VersionMismatch):
            call()
    assert dump_queue(r, qname) == snapshot


# --- inspection, removal, exhaustion -----------------------------------------------------
def test_get_list_remove(r, qname):
    q = Queue(qname, r)
    assert q.schedules.get("nope") is None and q.schedules.list() == []
    weekly = q.schedules.upsert("weekly", cron="0 9 * * 1", tz="Europe/Paris", payload=b"\x00")
    start = now_ms(q) - 10
    q.schedules.upsert("fast", every_ms=5_000, start_at_ms=start, missed="catch_up",
                       catch_up_limit=7, attempts=2)
    assert q.schedules.pump() == 1
    got = q.schedules.get("weekly")
    assert got == weekly and got.cadence == "cron '0 9 * * 1' Europe/Paris"
    assert got.payload == b"\x00" and got.last_occurrence_ms is None
    fast = q.schedules.get("fast")
    assert fast.cadence == "every 5000 ms" and fast.anchor_ms == start
    assert (fast.last_occurrence_ms, fast.next_run_ms) == (start, start + 5_000)
    assert fast.last_job_id == occurrence_job_id("fast", start)
    assert (fast.missed, fast.catch_up_limit, fast.attempts) == ("catch_up", 7, 2)
    assert [s.name for s in q.schedules.list()] == ["fast", "weekly"]  # soonest first
    assert len(q.schedules) == 2
    assert q.schedules.remove("fast") is True
    assert q.schedules.remove("fast") is False
    assert q.schedules.get("fast") is None and len(q.schedules) == 1
    assert q.get(fast.last_job_id).state == "pending"  # minted jobs stay


def test_exhausted_cron_mints_its_last_occurrence_then_stays_listed(r, qname, backend):
    q = Queue(qname, r)
    now = now_ms(q)
    year = datetime.fromtimestamp(now / 1000, timezone.utc).year
    jan1 = int(datetime(year, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
    q.schedules.upsert("once", cron=f"0 0 1 1 * 0 {year}", start_at_ms=jan1 - 1000)
    assert q.schedules.pump() == 1
    s = q.schedules.get("once")
    assert s.next_run_ms is None and s.last_occurrence_ms == jan1
    assert q.schedules.pump() == 0 and [x.name for x in q.schedules.list()] == ["once"]
    assert q.schedules.sweep().next_run_ms is None


def test_jobs_minted_by_schedules_are_ordinary_jobs(r, qname, backend):
    q = Queue(qname, r)
    start = now_ms(q) - 61_000  # two slots due, the third a minute away
    q.schedules.upsert("work", every_ms=60_000, start_at_ms=start, missed="catch_up",
                       payload={"n": 1})
    q.schedules.pump()
    seen = []
    Worker(q, lambda job: seen.append(job.payload)).run_until_idle(timeout_s=20)
    assert seen == [{"n": 1}, {"n": 1}]
    assert q.counts()["completed"] == 2


# --- the server clock, script headers and error codes ---------------------------------
def test_schedule_code_reads_only_the_server_clock():
    """No local clock in the schedule modules; every writing script reads TIME."""
    for mod in ("facade/schedules.py", "core/cadence.py"):
        tree = ast.parse((ROOT / "emqfast" / mod).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("time", "time_ns", "now", "utcnow", "today",
                                         "monotonic"), f"{mod} reads a local clock ({node.attr})"
    for script in ("schedule_upsert", "schedule_mint"):
        assert "emq_now()" in load(script).raw


def test_sweep_reports_the_server_clock(r, qname):
    q = Queue(qname, r)
    before = now_ms(q)
    sweep = q.schedules.sweep()
    assert isinstance(sweep, Sweep) and before <= sweep.now_ms <= now_ms(q)


@pytest.mark.parametrize("name,n_keys", [("schedule_upsert", 5), ("schedule_mint", 9),
                                         ("schedule_remove", 3)])
def test_script_headers_declare_their_keys_and_codes(name, n_keys):
    script = load(name)
    assert script.fixed_keys == n_keys and not script.variadic
    header = script.raw.split("\n\n", 1)[0]
    for section in ("-- ARGV[1]", "-- Returns:", "-- Errors:"):
        assert section in header
    used = set(re.findall(r"'(EMQ[A-Z]+) ", script.source))
    assert used and used <= set(codes()), used - set(codes())
