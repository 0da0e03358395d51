"""The worker machine driven by a script instead of Redis: every I/O it does is a request
(:mod:`emqfast.core.ops`) the test answers, so each rule of the claim loop, the beat, the
acks and the shutdown is checked without a server, threads or timing. The real-Redis
tests (test_engine_worker, test_worker_faults, ...) check the scripts and the drivers."""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest
import redis

from emqfast import Queue
from emqfast.core.errors import LeaseLost, PermissionDenied, ReplyLost, ServerBusy
from emqfast.core.ops import (Batch, Call, Cmd, Hook, PopMarker, Sleep, WaitDrained,
                              WaitForRoom)
from emqfast.worker.machine import WorkerMachine
from emqfast.worker.outcomes import CancelledRun, Done, Failed
from emqfast.worker.leases import RunningJob

NOW = 1_800_000_000_000  # server ms the scripted claim replies carry


class Machine(WorkerMachine):
    """The machine with the smallest driver: handed-out jobs are recorded, never run."""

    def __init__(self, queue: Queue, **options: Any):
        self._setup_stops(options.pop("job_timeout_ms", None), 5000)
        settings = dict(concurrency=2, lease_ms=30_000, max_stalled=1, batch_size=None,
                        batch_floor=256, keep_completed=1000, keep_failed=10_000,
                        max_age_ms=None, shutdown_timeout_s=1.0, name="w1",
                        allow_eviction=True, prefetch=0)
        settings.update(options)
        self._setup(queue, lambda job: None, **settings)
        self._guard = contextlib.nullcontext()
        self.handed: List[Tuple[Any, str]] = []
        self.stopping = False

    def _hand_out(self, started: List[Tuple[Any, str]]) -> None:
        self.handed += started
        for job, token in started:
            self._running[job.id] = RunningJob(job, token, time.monotonic())
            self._in_hand += 1
        self._stop_early(started)  # as every driver does, before a handler could begin

    def _take_held(self, peek: bool = False) -> List[Tuple[str, str, Optional[str]]]:
        return []

    def _wake(self) -> None:
        pass

    def _stop_requested(self) -> bool:
        return self.stopping

    def _stopped(self, run: Any) -> None:
        pass

    def stop(self) -> None:
        self.stopping = True


Answer = Callable[[Any], Any]  # a request -> its reply (or an exception to throw in)


def drive(logic: Any, answer: Answer, log: List[Any]) -> Any:
    """Run ``logic`` to its end, answering each request with ``answer`` (recorded in ``log``);
    an exception ``answer`` returns is thrown in at the yield, as the drivers do."""
    reply: Any = None
    throw: Optional[BaseException] = None
    try:
        while True:
            request = logic.throw(throw) if throw is not None else logic.send(reply)
            log.append(request)
            got = answer(request)
            reply, throw = (None, got) if isinstance(got, BaseException) else (got, None)
    except StopIteration as done:
        return done.value


def name_of(request: Any) -> str:
    """A request by what it does: a script's name, a command's verb, a wait's class."""
    if isinstance(request, Call):
        return request.script.name
    if isinstance(request, Cmd):
        return request.args[0]
    if isinstance(request, Batch):
        return "batch:" + ",".join(sorted({name_of(i) for i in request.items}))
    return type(request).__name__


def start_row(attempts: int = 1) -> List[Any]:
    """One job's start.lua values: attempts, payload, enc, opts, created, run_at, started,
    cancel, failed_before."""
    return [attempts, b'{"n": 1}', None, None, NOW - 10, None, NOW - 5, None, None]


def start_reply(*rows: List[Any]) -> List[Any]:
    """start.lua's reply: its start instant, then each row in full after -1 (a lone 0 for
    a job not started)."""
    return [NOW - 5, *[x for row in rows for x in ([-1, *row] if row[0] else [0])]]


def claim_reply(*pairs: Tuple[str, str], status: int = 1, next_due: int = -1) -> List[Any]:
    return [NOW, status, next_due, *[x.encode() for pair in pairs for x in pair]]


@pytest.fixture
def machine() -> Machine:
    # a client that is never used: every I/O goes through the scripted answers
    q = Queue("scripted", redis.Redis(host="127.0.0.1", port=1))
    m = Machine(q)
    m._next_beat = float("inf")  # beats only where a test asks for one
    return m


def test_a_turn_claims_starts_and_hands_out_the_claimed_jobs(machine):
    answers = {"WaitForRoom": (2, 2), "claim": claim_reply(("JOBa", "w1:1"), ("JOBb", "w1:2")),
               "batch:start": [start_reply(start_row(), start_row())]}
    log: List[Any] = []
    done = drive(machine._turn(until_idle=True, wait_scheduled=False),
                 lambda r: answers[name_of(r)], log)
    assert done is False  # jobs were claimed: not idle
    assert [name_of(r) for r in log] == ["WaitForRoom", "claim", "batch:start"]
    claim = log[1]
    assert claim.args[0] == 2  # no more than the room
    assert [(job.id, token) for job, token in machine.handed] == [("JOBa", "w1:1"),
                                                                   ("JOBb", "w1:2")]
    assert machine.stats.claimed == 2 and not machine._held


def test_an_empty_claim_of_an_idle_worker_ends_run_until_idle_without_blocking(machine):
    answers = {"WaitForRoom": (2, 2), "claim": claim_reply(), "ZCARD": 0}
    log: List[Any] = []
    assert drive(machine._turn(until_idle=True, wait_scheduled=False),
                 lambda r: answers[name_of(r)], log) is True
    assert "PopMarker" not in [name_of(r) for r in log]


def test_an_empty_claim_of_a_serving_worker_blocks_on_the_marker_until_the_beat(machine):
    answers = {"WaitForRoom": (2, 2), "claim": claim_reply(), "PopMarker": None}
    log: List[Any] = []
    drive(machine._turn(until_idle=False, wait_scheduled=False),
          lambda r: answers[name_of(r)], log)
    pops = [r for r in log if isinstance(r, PopMarker)]
    assert len(pops) == 1 and pops[0].key == machine.queue.keys.marker
    assert 0 < pops[0].seconds <= machine.beat_s


def test_a_claim_reply_naming_a_due_job_promotes_it_before_the_next_claim(machine):
    answers = {"WaitForRoom": (2, 2), "claim": claim_reply(next_due=NOW - 1), "due": [NOW, 0],
               "ZCARD": 0}
    log: List[Any] = []
    drive(machine._turn(until_idle=True, wait_scheduled=False),
          lambda r: answers.get(name_of(r), []), log)
    assert "due" in [name_of(r) for r in log]  # the promote operation's first read


def test_a_lost_claim_reply_is_re_sent_with_the_same_request_id(machine):
    sent: List[Any] = []

    def answer(r: Any) -> Any:
        n = name_of(r)
        if n == "claim":
            sent.append(r)
            return ReplyLost("cut") if len(sent) == 1 else claim_reply(("JOBa", "w1:1"))
        return {"WaitForRoom": (2, 2), "Sleep": None,
                "batch:start": [start_reply(start_row())]}[n]

    drive(machine._turn(until_idle=True, wait_scheduled=False), answer, [])
    assert len(sent) == 2 and sent[0].args == sent[1].args  # same request id: no new pops
    assert [job.id for job, _ in machine.handed] == ["JOBa"]


def test_a_busy_server_is_waited_out_and_a_permission_error_stops_the_loop(machine):
    busy = iter([ServerBusy("BUSY"), ServerBusy("BUSY")])

    def answer(r: Any) -> Any:
        n = name_of(r)
        if n == "claim":
            return next(busy, PermissionDenied("NOPERM claim"))
        return {"WaitForRoom": (2, 2), "Sleep": None}[n]

    log: List[Any] = []
    with pytest.raises(PermissionDenied):
        drive(machine._serve_loop(until_idle=True, deadline=None, wait_scheduled=False),
              answer, log)
    sleeps = [r for r in log if isinstance(r, Sleep)]
    assert len(sleeps) == 2 and sleeps[1].seconds > sleeps[0].seconds  # backed off


def _running(machine: Machine, *pairs: Tuple[str, str]) -> None:
    answers = {"WaitForRoom": (2, 2), "claim": claim_reply(*pairs),
               "batch:start": [start_reply(*(start_row() for _ in pairs))]}
    drive(machine._turn(until_idle=True, wait_scheduled=False),
          lambda r: answers[name_of(r)], [])


def test_outcomes_are_written_in_one_complete_call_and_counted(machine):
    _running(machine, ("JOBa", "w1:1"), ("JOBb", "w1:2"))
    batch = [Done(job, token, b"1") for job, token in machine.handed]
    machine._pending_acks += len(batch)  # what the driver's acker counts as it takes them
    log: List[Any] = []
    replies = drive(machine._write_batch(batch),
                    lambda r: [[[1, 2], [1, 2]]] if name_of(r) == "batch:complete" else [], log)
    assert [name_of(r) for r in log] == ["batch:complete"]
    assert log[0].via_batcher  # the acks go through the backend Batcher
    assert machine.stats.completed == 2 and replies == [[1, 2], [1, 2]]
    assert not machine._running and machine._pending_acks == 0


def test_an_outcome_whose_lease_was_lost_is_discarded_not_counted(machine):
    _running(machine, ("JOBa", "w1:1"))
    job, token = machine.handed[0]
    drive(machine._write_batch([Done(job, token, b"1")]),
          lambda r: [[b"EMQLEASE lease on JOBa is no longer held"]], [])
    assert machine.stats.completed == 0 and machine.stats.lease_lost == 1


def test_a_failure_retries_through_fail_lua_with_the_backoff_delay(machine):
    _running(machine, ("JOBa", "w1:1"))
    job, token = machine.handed[0]
    log: List[Any] = []
    drive(machine._write_batch([Failed(job, token, ValueError("x"), "tb", True)]),
          lambda r: [[1, 0, 5]], log)
    [fail] = log[0].items
    assert fail.script.name == "fail" and fail.args[0] == "JOBa" and fail.args[1] == "w1:1"
    assert machine.stats.retried == 1


def test_the_beat_renews_leases_a_third_used_and_marks_lost_ones(machine):
    _running(machine, ("JOBa", "w1:1"), ("JOBb", "w1:2"))
    for run in machine._running.values():
        run.extended_at -= machine.lease_ms / 1000  # all due
    log: List[Any] = []
    # JOBb's lease is gone but its hash is there: a lost lease (a queue's keys gone would
    # have taken the hash too)
    drive(machine._renew_due(), lambda r: [1] if name_of(r) == "batch:EXISTS" else [1, 0], log)
    extend, exists = log
    assert extend.script.name == "extend"
    assert list(extend.args[2:]) == ["JOBa", "w1:1", "JOBb", "w1:2"]
    assert [c.args for c in exists.items] == [("EXISTS", machine._keys.job("JOBb"))]
    assert not machine._running["JOBa"].lost and machine._running["JOBb"].lost
    assert not machine._keys_gone_said


def test_the_beat_runs_its_steps_as_requests_and_then_the_hooks(machine):
    machine._next_beat = 0.0
    seen: List[str] = []
    machine.beat_hooks.append(lambda: seen.append("hook"))
    log: List[Any] = []

    def answer(r: Any) -> Any:
        if isinstance(r, Hook):
            return r.fn()
        n = name_of(r)
        return {"reap": [[], [0, 0]], "due": [NOW, 0], "sweep": None}.get(n, [])

    with contextlib.suppress(Exception):  # the scripted replies are minimal
        drive(machine._beat_if_due(), answer, log)
    names = [name_of(r) for r in log]
    assert names[0] in ("due", "reap") or any("reap" in n for n in names)
    assert not any(isinstance(r, (WaitForRoom, WaitDrained)) for r in log)


def test_a_stop_cuts_the_beat_short_and_the_turn_claims_nothing(machine):
    """On a silent server each step of the beat would wait out a read deadline: a stop
    that comes during one (SIGTERM in a partition) ends the beat and the turn there."""
    machine._next_beat = 0.0
    machine.beat_hooks.append(lambda: None)
    log: List[Any] = []

    def answer(r: Any) -> Any:
        if isinstance(r, WaitForRoom):
            return (2, 2)
        machine.stopping = True  # the stop arrives while the reap's read waits on the server
        return {"due": [NOW, 0]}[name_of(r)]

    assert drive(machine._turn(until_idle=False, wait_scheduled=False), answer, log) is False
    names = [name_of(r) for r in log]
    assert names == ["due", "WaitForRoom"], names  # no promote, heartbeat, hooks or claim


def test_a_paused_claim_hands_back_what_it_holds(machine):
    machine.prefetch = 5
    answers = {"WaitForRoom": (0, 2), "claim": claim_reply(("JOBa", "w1:1"), status=0),
               "start": start_reply(start_row())}
    log: List[Any] = []

    def answer(r: Any) -> Any:
        n = name_of(r)
        if n.startswith("batch:"):
            return [1] * len(r.items)
        return answers[n]

    drive(machine._turn(until_idle=False, wait_scheduled=False), answer, log)
    names = [name_of(r) for r in log]
    assert "batch:release" in names  # handed back, never handed to a handler
    assert machine.handed == [] and machine.stats.released == 1


def test_extend_lease_of_a_lost_lease_raises_lease_lost(machine):
    _running(machine, ("JOBa", "w1:1"))
    with pytest.raises(LeaseLost):
        drive(machine._extend_one("JOBa", "w1:1", 10_000), lambda r: [0], [])


def test_a_stopping_worker_settles_a_cut_short_claim_by_re_sending_it(machine):
    machine._claim_seq += 1
    from emqfast.worker import calls
    machine._claiming = calls.claim_call(machine.queue.keys, 2, 30_000, "w1", [], "r:1")
    answers = {"claim": claim_reply(("JOBa", "w1:1")), "start": start_reply(start_row())}
    log: List[Any] = []

    def answer(r: Any) -> Any:
        n = name_of(r)
        return [1] * len(r.items) if n.startswith("batch:") else answers[n]

    drive(machine._settle(time.monotonic() + 5), answer, log)
    assert [name_of(r) for r in log] == ["claim", "start", "batch:release"]
    assert machine.stats.released == 1 and machine._claiming is None


# --- stops: cancels, timeouts, abandonment -----------------------------------------------

def test_a_heard_cancel_stops_the_run_and_its_outcome_becomes_cancel_active(machine):
    _running(machine, ("JOBa", "w1:1"))
    job, token = machine.handed[0]
    machine._on_cancel("JOBa")
    assert job.cancelled and job.cancel_reason == "cancelled"
    # the handler returned normally anyway: the run ends by its stop
    settled = machine._settle_run(Done(job, token, b"1"))
    assert isinstance(settled, CancelledRun) and not settled.may_retry
    log: List[Any] = []
    drive(machine._write_batch([settled]), lambda r: [1] * len(r.items), log)
    assert [c.script.name for c in log[0].items] == ["cancel_active"]
    assert machine.stats.cancelled == 1 and not machine._running


def test_a_timed_out_run_fails_with_job_timeout_and_may_retry(machine):
    _running(machine, ("JOBa", "w1:1"))
    job, token = machine.handed[0]
    assert machine._stop_run("JOBa", "timeout", token) is not None
    assert job.cancel_reason == "timeout"
    settled = machine._settle_run(Failed(job, token, RuntimeError("ignored"), "tb", True))
    assert isinstance(settled, Failed) and not isinstance(settled, CancelledRun)
    assert type(settled.exc).__name__ == "JobTimeout" and settled.may_retry


def test_an_abandoned_run_is_written_once_and_its_late_return_ignored(machine):
    _running(machine, ("JOBa", "w1:1"))
    job, token = machine.handed[0]
    machine._stop_run("JOBa", "timeout", token)
    abandoned = machine._abandon_run("JOBa", token)
    assert abandoned is not None and machine._abandon_run("JOBa", token) is None
    assert machine._settle_run(Done(job, token, b"late")) is None  # written already


def test_a_stop_belongs_to_its_run_not_to_the_job_id(machine):
    """A retry on the same Worker beside its abandoned first run is stopped by its own
    timeout: the first run's stop (kept until its handler returns) is not the retry's."""
    _running(machine, ("JOBa", "w1:1"))
    first, first_token = machine.handed[0]
    machine._stop_run("JOBa", "timeout", first_token)
    machine._abandon_run("JOBa", first_token)
    machine._forget([Failed(first, first_token, RuntimeError("t"), "", True)])
    _running(machine, ("JOBa", "w1:2"))  # the retry, claimed by the same Worker
    retry, retry_token = machine.handed[-1]
    assert machine._stop_run("JOBa", "timeout", retry_token) is not None
    assert retry.cancel_reason == "timeout"
    assert machine._settle_run(Done(first, first_token, b"late")) is None
    settled = machine._settle_run(Done(retry, retry_token, b"x"))
    assert settled is not None and type(settled.exc).__name__ == "JobTimeout"


def test_the_beat_reads_cancel_marks_of_unstopped_runs_and_stops_the_marked(machine):
    _running(machine, ("JOBa", "w1:1"), ("JOBb", "w1:2"))
    log: List[Any] = []
    drive(machine._recheck_cancels(), lambda r: [None, b"1"], log)
    [marks] = log
    assert [c.args[0] for c in marks.items] == ["HGET", "HGET"]
    a, b = (job for job, _ in machine.handed)
    assert not a.cancelled and b.cancelled


def test_a_held_job_cancelled_before_it_starts_is_stopped_as_it_starts(machine):
    machine.prefetch = 5
    machine._hold([("JOBa", "w1:1")], [])
    machine._on_cancel("JOBa")  # heard while held: no run to stop yet
    answers = {"batch:start": [start_reply(start_row())]}
    drive(machine._start_held(1), lambda r: answers[name_of(r)], [])
    [(job, _)] = machine.handed
    assert job.cancelled and job.cancel_reason == "cancelled"


def test_held_jobs_start_in_chunks_sent_together_and_a_busy_chunk_alone_is_re_sent(machine):
    from emqfast.worker import calls
    machine.prefetch = 1000
    pairs = [(f"JOB{i}", f"w1:{i}") for i in range(calls.START_CHUNK + 2)]
    machine._hold(pairs, [])
    sent: List[Any] = []

    def answer(r: Any) -> Any:
        if isinstance(r, Sleep):
            return None
        sent.append([len(c.args) - 1 for c in r.items])  # pairs' values per start call
        if len(sent) == 1:  # the first chunk lands, the second meets BUSY
            return [start_reply(*(start_row() for _ in range(calls.START_CHUNK))),
                    ServerBusy("BUSY")]
        return [start_reply(start_row(), start_row())]

    drive(machine._start_held(len(pairs)), answer, [])
    # one round trip for both chunks, then the busy one alone: each job started once
    assert sent == [[2 * calls.START_CHUNK, 4], [4]]
    assert [job.id for job, _ in machine.handed] == [i for i, _ in pairs]
    assert not machine._held


# --- a many-queue Worker's members: machines sharing one crew, still without Redis --------

class WakeCountingMachine(Machine):
    def __init__(self, queue: Queue, **options: Any):
        super().__init__(queue, **options)
        self.woken = 0

    def _wake(self) -> None:
        self.woken += 1


@pytest.fixture
def crew() -> Any:
    from emqfast.worker.crew import Crew
    client = redis.Redis(host="127.0.0.1", port=1)
    made = Crew(lambda q, c: WakeCountingMachine(q, crew=c, name=None),
                [Queue("high", client), Queue("low", client)], name="w1")
    for m in made.members:
        m._next_beat = float("inf")
        made.joined(m)
    return made


def test_the_queues_of_a_crew_share_one_budget_of_handler_slots(crew):
    high, low = crew.members
    assert crew.room(high) == (2, 2)  # concurrency 2, nothing held anywhere
    answers = {"WaitForRoom": crew.room(high),
               "claim": claim_reply(("JOBa", "t1"), ("JOBb", "t2")),
               "batch:start": [start_reply(start_row(), start_row())]}
    drive(high._turn(until_idle=True, wait_scheduled=False), lambda r: answers[name_of(r)], [])
    assert len(high._running) == 2
    crew.may_block(high)  # its next claim came back empty: the low queue's turn
    assert crew.room(low) == (0, 0)  # ...but the high queue's two running jobs fill the worker
    high._running.clear()
    high._in_hand = 0
    assert crew.room(low) == (2, 2)


def test_strict_order_keeps_a_lower_queue_from_claiming_while_a_higher_one_is_ready(crew):
    high, low = crew.members
    crew.claimed(high, claim_reply(("JOBa", "t1")))  # work on the high queue: ready
    high._held["JOBa"] = object()  # claimed, not started yet
    assert crew.room(low)[1] == 0
    high._held.clear()
    crew.may_block(high)  # its claim came back empty: it waits on its marker, not ready
    assert crew.room(low)[1] > 0


def test_an_empty_claim_while_holding_jobs_waits_for_a_slot_not_the_marker(crew):
    high, _ = crew.members
    high._held["JOBa"] = object()
    assert crew.may_block(high) is False  # a slot freed by any queue ends that wait
    assert crew.waits_for_room(high, 0, 5)


def test_a_job_ending_on_one_queue_wakes_every_queue_of_the_crew(crew):
    high, low = crew.members
    high._notify()
    assert (high.woken, low.woken) == (1, 1)
    assert high.name == low.name == "w1"
    assert crew.presence(low) == ("high,low", 2, 0)


def test_a_held_job_start_reserves_its_slot_from_the_other_queues(crew):
    high, low = crew.members
    low._held["JOBa"] = object()
    assert crew.reserve(low, 2) == 1  # only as many as it holds
    assert crew.room(high)[0] == 1  # the reserved slot is not offered twice
    crew.unreserve(low, 1)
    assert crew.room(high)[0] == 2
