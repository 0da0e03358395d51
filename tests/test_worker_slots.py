"""The sync Worker's hot path: a Job built from a start.lua row is the Job the
dataclass constructor builds, and handler slots counted without a lock per run still bound
the handlers to ``concurrency`` and hand each freed slot to the next held job."""
from __future__ import annotations

import threading
from typing import Any, List

import pytest

import emqfast
from emqfast.core import codec
from emqfast.core.errors import PayloadError
from emqfast.facade import options
from emqfast.facade.job import Job
from emqfast.worker.calls import JobRows
from waiting import wait_until


def _by_constructor(queue: str, job_id: str, row: List[Any]) -> Job:
    """The plain dataclass __init__ with every field: what rows.job must equal."""
    attempts, payload, enc, opts, created, run_at, started = row
    undecodable = None
    try:
        max_attempts, priority, backoff, extra = options.decode(opts)
        payload = codec.decode(payload, enc)
    except PayloadError as exc:
        undecodable = exc
        max_attempts, priority, backoff, extra = options.decode(None)
    return Job(id=job_id, queue=queue, state="active", _undecodable=undecodable,
               payload=payload, attempts=int(attempts), max_attempts=max_attempts,
               priority=priority, backoff=backoff,
               created_ms=int(created) if created is not None else None,
               run_at_ms=int(run_at) if run_at is not None else None,
               started_ms=int(started) if started is not None else None, extra=dict(extra))


def _start_reply(now: int, *rows: Any) -> List[Any]:
    """start.lua's flat reply: its start instant, then per job a short row (attempts,
    payload, enc, created) when the full row says nothing more and started ``now``, else
    -1 and the full row; a lone 0 for a job not started (``None`` here)."""
    out: List[Any] = [now]
    for row in rows:
        if row is None:
            out.append(0)
        elif row[3] is None and row[5] is None and row[6] == now and not row[7] \
                and not row[8]:
            out += [row[0], row[1], row[2], row[4]]
        else:
            out += [-1, *row]
    return out


@pytest.mark.parametrize("row", [
    [1, b"x" * 100, b"b", None, b"1700000000000", None, b"1700000000001"],
    [2, b'{"a": [1, 2]}', None, b'{"a":3,"p":2,"b":{"k":"f","d":10}}', b"5", b"6", b"7"],
    [1, b'"s"', b"j", b'{"a":1,"p":0,"g":"grp","t":50}', b"5", None, b"9"],
    [1, b"{not json", None, None, b"5", None, b"6"],           # a corrupt payload
    [1, b'"fine"', None, b"{corrupt", b"5", None, b"6"],       # corrupt options
])
def test_a_row_builds_the_job_the_constructor_builds(row):
    rows = JobRows("q")
    for _ in range(2):  # the second from the options cache
        built, wanted = rows.job("ID1", row), _by_constructor("q", "ID1", row)
        assert built == wanted and repr(built) == repr(wanted)
        assert vars(built).keys() == vars(wanted).keys()
        assert type(built._undecodable) is type(wanted._undecodable)
    a, b = rows.job("ID1", row), rows.job("ID2", row)
    a.extra["mine"] = 1  # each job owns its extra dict
    assert "mine" not in b.extra


@pytest.mark.parametrize("row", [
    [1, b"x" * 100, b"b", None, 1700000000000, None, 1700000000001, None, None],
    [2, b'{"a": [1, 2]}', None, b'{"a":3,"p":2,"b":{"k":"f","d":10}}', 5, 6, 7, None, None],
    [1, b'"s"', b"j", b'{"a":1,"p":0,"g":"grp","t":50}', 5, None, 9, None, None],
    [1, b"{not json", None, None, 5, None, 6, None, None],      # a corrupt payload
    [1, b'"fine"', None, b"{corrupt", 5, None, 6, None, None],  # corrupt options
    [1, b'"c"', None, None, 5, None, 6, b"1", None],            # cancelled while held
    [2, b'"r"', None, None, 5, 6, 7, None, 1],                  # an earlier run failed
])
def test_the_short_way_of_many_rows_builds_what_one_row_builds(row):
    """start.lua's flat reply (integer times; short rows, full rows, 0: not started)
    through ``jobs``: each job equals ``job``'s, field for field, twice (the second from the
    options cache); jobs not started are skipped; only a job with no earlier failure may
    skip clearing it. The first job took the short row when it could, the last the full."""
    rows = JobRows("q")
    for _ in range(2):
        got = rows.jobs([("ID1", "t1"), ("ID2", "t2"), ("ID3", "t3")],
                        _start_reply(row[6], row, None) + [-1, *row])
        assert [t for _, t in got] == ["t1", "t3"]
        wanted = rows.job("ID3", row)
        assert vars(got[1][0]).keys() == vars(wanted).keys()
        assert got[1][0] == wanted and repr(got[1][0]) == repr(wanted)
        assert type(got[1][0]._undecodable) is type(wanted._undecodable)
        assert ("_cancel_at_start" in vars(got[1][0])) == bool(row[7])
        assert got[0][0]._clean_start is wanted._clean_start is (not row[8])
        first = rows.job("ID1", row)  # the same job from its (maybe short) row
        assert vars(got[0][0]).keys() == vars(first).keys()
        assert got[0][0] == first and repr(got[0][0]) == repr(first)
    got[0][0].extra["mine"] = 1  # each job owns its extra dict
    assert "mine" not in got[1][0].extra


def test_slots_bound_the_handlers_and_a_freed_slot_starts_the_next_job(redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    q.enqueue_many(list(range(12)))
    lock, gate = threading.Lock(), threading.Event()
    running: List[int] = []
    peak, done = [0], []

    def handler(job: Job) -> None:
        with lock:
            running.append(job.payload)
            peak[0] = max(peak[0], len(running))
        if job.payload < 3:
            gate.wait(30)  # three slow jobs hold three of the four slots
        with lock:
            running.remove(job.payload)
            done.append(job.payload)

    w = emqfast.Worker(q, handler, concurrency=4)
    t = threading.Thread(target=w.run_until_idle, kwargs={"timeout_s": 60})
    t.start()
    try:
        # the one free slot runs every other job, one after another, while three wait
        wait_until(lambda: len(done) == 9, 30, "the nine fast jobs ran through one slot")
        assert sorted(running) == [0, 1, 2]
        # the last fast job's end is counted just after its handler returns
        wait_until(lambda: w._in_hand == 3, 30, "three slots in use")
        gate.set()
        t.join(60)
    finally:
        gate.set()
    assert not t.is_alive() and sorted(done) == list(range(12)) and peak[0] <= 4
    assert w.stats.completed == 12 and w._in_hand == 0


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_finished_job_is_written_while_its_slot_runs_a_long_next_job(redis_url, qname,
                                                                       concurrency):
    """A handler slot runs queued jobs one after another; the outcome of a quick job must
    reach Redis while the same slot runs a long one after it (it once waited in the slot's
    private batch until that next handler returned: a job that another waits on, through
    job.wait or depends_on, then never completed)."""
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    quick = q.enqueue({"n": "quick"})
    slow = q.enqueue({"n": "slow"})
    saw: List[Any] = []

    def handler(job):
        if job.payload == {"n": "slow"}:  # runs until it sees quick's result in Redis
            try:
                saw.append(quick.wait(timeout_s=10))
            except emqfast.WaitTimeout:
                saw.append("timed out")
        return job.payload

    w = emqfast.Worker(q, handler, concurrency=concurrency)
    w.run_until_idle(timeout_s=60)
    assert saw == [{"n": "quick"}]
    assert slow.wait(timeout_s=5) == {"n": "slow"}


def test_jobs_after_fast_handlers_still_reach_every_slot_when_handlers_turn_slow(redis_url,
                                                                                qname):
    """Once handlers are timed fast, a started chunk goes to fewer handler tasks than slots
    (they run it within the prefetch budget); when its handlers then turn slow, the jobs
    left waiting still reach every free slot: four that wait for each other all run at once."""
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    q.enqueue_many(["fast"] * 600 + ["meet"] * 4)
    meeting = threading.Barrier(4, timeout=30)
    met: List[int] = []

    def handler(job: Job) -> None:
        if job.payload == "meet":
            met.append(meeting.wait())  # raises BrokenBarrierError if one never comes

    w = emqfast.Worker(q, handler, concurrency=4)
    stats = w.run_until_idle(timeout_s=90)
    assert sorted(met) == [0, 1, 2, 3]
    assert stats.completed == 604 and stats.failed == 0 and stats.retried == 0
