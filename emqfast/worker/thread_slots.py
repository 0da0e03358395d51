"""The thread Worker's handler slots (mixed into :class:`emqfast.Worker`): started jobs
queue on ``_ready`` and up to ``concurrency`` handler-pool tasks drain it, each running
jobs one after another and handing each outcome to the acker the moment its handler
returns (the acker, on its own thread, gathers them into batches: a slot that kept them
back would hold a finished job's result for as long as its next handler runs).

Slot accounting without a lock per job (issue 12): ``_in_hand`` (started jobs whose
handler has not returned, what the claim loop's room is computed from) is the jobs
handed out less the runs each slot ended; each slot counts its own runs in its item of
``_ended`` (one writer per item), and a slot takes the lock only to wake a claim loop
that waits for a slot (``_awaiting_slot``, set before that loop reads the counts).
"""
from __future__ import annotations

import inspect
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Awaitable, List, Optional, Tuple

from emqfast.facade.job import Job
from emqfast.worker import calls
from emqfast.worker.outcomes import (NULL_RESULT, Done, Outcome, awaitable_result,
                                     check_decodable, failure, job_group, success)
from emqfast.worker.stats import RunningJob

if TYPE_CHECKING:  # a checker sees the machine it is mixed with; at run time: object
    from emqfast.worker.machine import WorkerMachine as _Host
else:
    _Host = object


class ThreadRunHooks:
    """``Job._run`` of the jobs a thread Worker runs (:class:`emqfast.facade.job.RunHooks`):
    ``job.extend_lease`` and ``job.progress`` reach the Worker with the run's token."""

    __slots__ = ("_worker",)
    is_async = False  # extend_lease_async / progress_async are the aio Worker's

    def __init__(self, worker: "HandlerSlots"):
        self._worker = worker

    def extend(self, job_id: str, token: Optional[str], ms: int) -> None:
        assert token is not None
        self._worker._extend_run(job_id, token, ms)

    def progress(self, job_id: str, token: Optional[str], value: Any) -> None:
        assert token is not None
        self._worker._progress_run(job_id, token, value)

    def extend_async(self, job_id: str, token: Optional[str], ms: int) -> Awaitable[None]:
        raise RuntimeError("extend_lease_async() is only available to a running aio handler")

    def progress_async(self, job_id: str, token: Optional[str],
                       value: Any) -> Awaitable[None]:
        raise RuntimeError("progress_async() is only available to a running aio handler")


class HandlerSlots(_Host):
    """Running started jobs on the handler pool (mixed before the machine)."""

    _ready: "deque[Tuple[Job, str]]"
    _lock: threading.Condition
    _pool: Optional[ThreadPoolExecutor]
    _acks: "queue_mod.SimpleQueue[Optional[Outcome]]"
    _drainers: int
    _awaiting_slot: bool
    _ended: List[int]
    _free_slots: List[int]
    _handed: int
    _run_hooks: ThreadRunHooks
    job_timeout_ms: Optional[int]

    if TYPE_CHECKING:
        def _arm_timeout(self, job: Job, token: str, now: float) -> None: ...
        def _stop_early(self, started: Any) -> None: ...
        def _settle_run(self, outcome: Outcome) -> Optional[Outcome]: ...
        def _drive(self, logic: Any) -> Any: ...
        _stops: Any

    def _setup_slots(self) -> None:
        """The handler-slot state (after the machine's setup: needs ``concurrency``)."""
        self._ready = deque()  # claimed, waiting for a handler thread
        self._run_hooks = ThreadRunHooks(self)  # each running job's Job._run
        self._drainers = 0  # handler-pool tasks currently taking jobs from _ready
        self._awaiting_slot = False  # the claim loop waits for a handler to return
        self._ended = [0] * self.concurrency
        self._free_slots = list(range(self.concurrency))  # slot indexes of no drainer

    @property
    def _in_hand(self) -> int:
        """Started jobs whose handler has not returned: handed out, less the runs the
        handler slots ended. Each slot counts its own (one writer per list item), so a
        handler thread ends a run without taking the lock (issue 12)."""
        return self._handed - sum(self._ended)

    @_in_hand.setter
    def _in_hand(self, value: int) -> None:  # the machine's setup: 0
        self._handed = value + sum(self._ended)

    def _hand_out(self, started: List[Tuple[Job, str]]) -> None:
        """Queue started jobs for the handler pool, starting only the missing drainers."""
        now = time.monotonic()
        hooks = self._run_hooks
        for job, token in started:  # no per-job callables: cheaper per job (issue 12)
            job._run, job._run_token = hooks, token
        timed = self.job_timeout_ms is not None
        runs = {job.id: RunningJob(job, token, now) for job, token in started}
        with self._lock:
            self._running.update(runs)
            for job, token in started:
                if timed or job.extra:  # (issue 15; once running: may fire at once)
                    self._arm_timeout(job, token, now)
            self._stop_early(started)  # cancelled while held: stopped before a handler sees it
            self._handed += len(started)
            self._ready.extend(started)
            # Handler tasks take jobs from _ready until it is empty; start only the
            # missing ones, so at most `concurrency` handlers ever run at once.
            spawn = min(self.concurrency - self._drainers, len(self._ready))
            self._drainers += spawn
            slots = [self._free_slots.pop() for _ in range(spawn)]
        assert self._pool is not None
        for slot in slots:
            self._pool.submit(self._drain_ready, slot)

    def _take_held(self, peek: bool = False) -> List[Tuple[str, str, Optional[str]]]:
        """``(id, token, group)`` of jobs waiting for a handler thread, taken from the
        queue (``peek``: left there)."""
        with self._lock:
            held = [(job.id, token, job_group(job)) for job, token in self._ready]
            if not peek:
                self._ready.clear()
                self._handed -= len(held)
            return held

    def _drain_ready(self, slot: int) -> None:
        """One handler slot (``slot``: its index in ``_ended``): run waiting jobs one after
        another until none is left."""
        ready, ends, lock = self._ready, self._ended, self._lock
        clock, observe, ack = time.perf_counter, self._holding.observe, self._acks.put
        while True:
            try:
                job, token = ready.popleft()
            except IndexError:
                with self._lock:  # decided under the lock _hand_out spawns under: no job strands
                    if ready:
                        continue
                    self._drainers -= 1
                    self._free_slots.append(slot)
                    return
            started = clock()
            outcome: Optional[Outcome] = self._run_one(job, token)
            ended = clock()
            if self._stops:  # a stopped run ends by its stop (None: abandoned, written already)
                outcome = self._settle_run(outcome)  # type: ignore[arg-type]
            if outcome is not None:
                ack(outcome)  # at once: the next handler may run for hours
            ends[slot] += 1  # a handler slot is free: the claim loop may start a held job
            if self._awaiting_slot:
                with lock:
                    lock.notify_all()
            observe(ended - started)

    def _run_one(self, job: Job, token: str) -> Outcome:
        """Run the handler; the outcome the acker writes."""
        try:
            if job._undecodable is not None:  # fails for good, its handler never runs
                check_decodable(job)
            result = self.handler(job)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
            return failure(job, token, exc, traceback.format_exc())
        if result is None:  # the common case first: no awaitable, nothing to encode
            return Done(job, token, NULL_RESULT)
        if inspect.isawaitable(result):  # e.g. a lambda calling an async def: no work done
            return awaitable_result(job, token, result)
        try:
            return success(job, token, result)
        except BaseException as exc:  # noqa: BLE001 - an unserialisable result fails the job
            return failure(job, token, exc, traceback.format_exc())

    def _hand_over(self, outcomes: List[Outcome]) -> None:
        """Queue outcomes for the acker (which counts and marks them as it takes them)."""
        for outcome in outcomes:
            self._acks.put(outcome)

    def _extend_run(self, job_id: str, token: str, ms: int) -> None:
        """``job.extend_lease(ms)`` of a running job (through :class:`ThreadRunHooks`)."""
        self._drive(self._extend_one(job_id, token, ms))

    def _progress_run(self, job_id: str, token: str, value: Any) -> None:
        """``job.progress(value)`` of a running job (through :class:`ThreadRunHooks`)."""
        self._drive(self._progress(job_id, token, value))
