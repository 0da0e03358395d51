"""Running an asyncio Worker's handlers: a task per job under the semaphore, coroutine
steps timed (a step that blocks the loop is named in a warning), plain functions in the
executor (their exceptions carried as values), the job's lease/progress hooks."""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import time
import traceback
from typing import TYPE_CHECKING, Any, Awaitable, Callable, List, Optional, Sequence, Tuple

from emqfast.aio import cancels
from emqfast.facade.job import Job
from emqfast.worker.outcomes import Outcome, check_decodable, failure, job_group, success
from emqfast.worker.leases import RunningJob

if TYPE_CHECKING:  # a checker sees what the Worker holds; at run time the base is object
    from emqfast.aio.host import AioHost as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")

Held = Tuple[str, str, Optional[str]]  # a job to release: (id, lease token, group or None)


class Timed:
    """Awaits the rest of a handler's coroutine step by step, timing each step: how long
    the handler held the event loop before its next ``await`` (``on_step(job_id,
    seconds)``, see :meth:`JobTasks._on_step`). ``first``: what the coroutine's first step
    (run and timed by :func:`first_step`) yielded to the task."""

    __slots__ = ("_coro", "_on_step", "_job_id", "_first")

    def __init__(self, coro: Any, on_step: Callable[[str, float], None], job_id: str,
                 first: Any):
        self._coro, self._on_step, self._job_id = coro, on_step, job_id
        self._first = first

    def __await__(self) -> Any:
        coro, on_step, job_id = self._coro, self._on_step, self._job_id
        yielded = self._first
        while True:
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the handler
                error = exc
            began = time.monotonic()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                on_step(job_id, time.monotonic() - began)
                return done.value
            except BaseException:
                on_step(job_id, time.monotonic() - began)
                raise
            on_step(job_id, time.monotonic() - began)


def first_step(coro: Any, on_step: Callable[[str, float], None], job_id: str) -> Any:
    """Run a handler coroutine's first step here, timed: ``(True, its result)`` when it
    returned without suspending (most short handlers: no Timed, no generator per job),
    else ``(False, a Timed that awaits the rest)``. Its exception propagates, as ``await``
    would raise it."""
    began = time.monotonic()
    try:
        yielded = coro.send(None)
    except StopIteration as done:
        on_step(job_id, time.monotonic() - began)
        return True, done.value
    except BaseException:
        on_step(job_id, time.monotonic() - began)
        raise
    on_step(job_id, time.monotonic() - began)
    return False, Timed(coro, on_step, job_id, yielded)


def call_plain(handler: Callable[[Job], Any], job: Job) -> Tuple[bool, Any]:
    """Run a plain handler (in the executor thread): ``(True, result)`` or ``(False, exc)``.
    Its exception travels as a value: run_in_executor would turn a
    ``concurrent.futures.CancelledError`` into a cancellation of the awaiting task."""
    try:
        return True, handler(job)
    except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
        return False, exc


class JobTasks(_Host):
    """How :class:`emqfast.aio.Worker` runs its handlers (mixed into it)."""

    _run_hooks: "AioRunHooks"  # each running job's Job._run (made by the Worker's setup)

    if TYPE_CHECKING:  # AioStops' (emqfast.aio.cancel_listener)
        def _arm_timeout(self, job: Job, token: str) -> None: ...
        def _disarm(self, job_id: str, token: str) -> None: ...
        def _settle_run(self, outcome: Outcome) -> Optional[Outcome]: ...
        def _stop_early(self, started: Sequence[Tuple[Job, str]]) -> None: ...
        job_timeout_ms: Optional[int]

    def _hand_out(self, started: List[Tuple[Job, str]]) -> None:
        """A task per started job (bounded by the semaphore)."""
        now = time.monotonic()
        hooks = self._run_hooks
        timed = self.job_timeout_ms is not None
        for job, token in started:  # no per-job callables: cheaper per job
            job._run, job._run_token = hooks, token
            running = RunningJob(job, token, now)
            self._running[job.id] = running
            self._in_hand += 1
            running.task = cancels.spawn(self._run_job(job, token), name=f"emq-job-{job.id}")
            if timed or job.extra:  # stopped when it passes its timeout
                self._arm_timeout(job, token)
        self._stop_early(started)  # cancelled while held

    def _take_held(self, peek: bool = False) -> List[Held]:
        """Started jobs waiting for a handler: none to take. Jobs are started only into
        free slots (plus the few the slots take up within the prefetch budget, whose tasks
        wait on the semaphore for well under a few ms); held jobs stay unstarted."""
        return []

    async def _run_job(self, job: Job, token: str) -> None:
        """One job's task: its handler's outcome is queued for the acker; a job whose task
        was cancelled (shutdown, loop teardown) is queued for release instead: its handler
        has ended, so it can no longer finish and may run again elsewhere."""
        try:
            outcome = await self._outcome_of(job, token)
        except BaseException as exc:
            self._disarm(job.id, token)
            self._slot_freed()
            if job._stop_reason is None:
                self._queue_ack(job.id, token, release=(job.id, token, job_group(job)))
            else:  # stopped (cancel, timeout) before its handler began: ends by its stop
                settled = self._settle_run(failure(job, token, exc, ""))
                if settled is not None:
                    self._queue_ack(job.id, token, outcome=settled)
            raise
        self._disarm(job.id, token)
        self._slot_freed()
        settled = self._settle_run(outcome)  # a stopped run ends by its stop
        if settled is not None:  # (None: abandoned, its outcome queued already)
            self._queue_ack(job.id, token, outcome=settled)

    def _slot_freed(self) -> None:
        """A handler returned: the claim loop may start a held job."""
        self._in_hand -= 1
        self._notify()

    async def _outcome_of(self, job: Job, token: str) -> Outcome:
        """Run the handler; its result or exception as an outcome. Raises CancelledError
        only when this job's task itself was cancelled."""
        slots = self._sem
        assert slots is not None
        if not slots.take_now():  # nearly always free: the Worker starts jobs into free slots
            await slots.take()
        try:
            began = time.perf_counter()
            try:
                if self._is_coro:  # inline (no coroutine of ours per job); plain: _handle_plain
                    check_decodable(job)
                    result = self.handler(job)
                    if inspect.iscoroutine(result):
                        done, result = first_step(result, self._on_step, job.id)
                        if not done:
                            result = await result
                    else:
                        result = await result
                else:
                    result = await self._handle_plain(job)
                self._holding.observe(time.perf_counter() - began)
                return success(job, token, result)
            except (asyncio.CancelledError, concurrent.futures.CancelledError) as exc:
                if self._task_cancelled() and job._stop_reason is None:
                    raise  # our shutdown or the loop's teardown: released by _run_job
                # (stopped by a cancel or a timeout: _run_job ends it by its stop)
                # the handler raised it itself (or awaited something cancelled): a failure
                return failure(job, token, exc, traceback.format_exc())
            except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
                return failure(job, token, exc, traceback.format_exc())
        finally:
            slots.give()

    async def _handle_plain(self, job: Job) -> Any:
        """A plain handler's result: run in the executor (and what it returns awaited
        when awaitable). Coroutine handlers run inline in :meth:`_outcome_of`."""
        check_decodable(job)
        result = await self._in_executor(job)
        if inspect.isawaitable(result):  # a plain function returning a coroutine
            result = await result
        return result

    def _run_cancelled(self) -> bool:
        """True once the task running :meth:`run` was asked to cancel (checked as well as
        caught: redis.asyncio can swallow a cancellation that lands mid-command)."""
        task = self._run_task
        return task is not None and cancels.requests(task) > self._cancels_before

    @staticmethod
    def _task_cancelled() -> bool:
        """True when the current task was asked to cancel (not a CancelledError a handler
        raised or caught from something else)."""
        task = asyncio.current_task()
        return task is not None and cancels.requests(task) > 0

    def _queue_ack(self, job_id: str, token: str, outcome: Optional[Outcome] = None,
                   release: Optional[Held] = None) -> None:
        """Hand a finished job to the acker: its outcome to write, or its release."""
        running = self._running.get(job_id)
        if running is not None and running.token == token:
            running.acking = True  # the lease loop leaves it alone from now on
        self._pending_acks += 1
        if outcome is not None:
            self._outcomes.append(outcome)
        else:
            assert release is not None
            self._releases.append(release)
        if self._ack_ready is not None:
            self._ack_ready.set()

    def _on_step(self, job_id: str, seconds: float) -> None:
        """A coroutine handler's step held the loop ``seconds``: warn when that is long
        enough to make other jobs' lease renewals late."""
        if seconds < self.stall_warn_s:
            return
        self._last_stall = time.monotonic()
        log.warning("aio worker %s: job %s blocked the event loop for %.2fs (over 40%% "
                    "of lease_ms=%d): lease renewals of the other running jobs were late and "
                    "may lapse (the job then runs twice). Run CPU-bound or blocking work in a "
                    "thread (await asyncio.to_thread(...)) or a process.", self.name, job_id,
                    seconds, self.lease_ms)

    async def _in_executor(self, job: Job) -> Any:
        """A plain handler in the default executor. Its thread cannot be stopped: cancelled
        (shutdown ran out of time, loop teardown, again and again), this still waits for
        it, so the job is not released while its handler may finish (it would run twice).
        The handler's exception is raised here as it raised it."""
        future = asyncio.get_running_loop().run_in_executor(None, call_plain, self.handler, job)
        warned = False
        while True:
            try:
                ok, value = await asyncio.shield(future)
                break
            except asyncio.CancelledError:
                if future.cancelled():
                    raise  # never began: nothing can finish
                if not warned and not future.done():
                    warned = True
                    log.warning("aio worker %s: job %s runs in a thread that cannot "
                                "be cancelled; keeping its lease until it returns", self.name,
                                job.id)
        if ok:
            return value
        raise value

    async def _extend_run(self, job_id: str, token: str, ms: int) -> None:
        """``await job.extend_lease_async(ms)`` of a running job (through :class:`AioRunHooks`)."""
        await self._drive(self._extend_one(job_id, token, ms))

    async def _progress_run(self, job_id: str, token: str, value: Any) -> None:
        """``await job.progress_async(value)`` of a running job (through :class:`AioRunHooks`)."""
        await self._drive(self._progress(job_id, token, value))

    def _blocking(self, call: Awaitable[None], instead: str) -> None:
        """``job.extend_lease`` / ``job.progress`` for plain handlers running in the
        executor: ``call`` run on the Worker's loop; a coroutine handler is told ``instead``."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
            assert loop is not None
            asyncio.run_coroutine_threadsafe(call, loop).result()  # type: ignore[arg-type]
            return
        if inspect.iscoroutine(call):
            call.close()  # never awaited: no "was never awaited" warning
        raise RuntimeError(f"in a coroutine handler use `{instead}`")


class AioRunHooks:
    """``Job._run`` of the jobs an asyncio Worker runs (:class:`emqfast.facade.job.RunHooks`):
    the awaitable writes for coroutine handlers, and the blocking ones for plain handlers
    in the executor (run on the Worker's loop)."""

    __slots__ = ("_worker",)
    is_async = True

    def __init__(self, worker: JobTasks):
        self._worker = worker

    def extend_async(self, job_id: str, token: Optional[str], ms: int) -> Awaitable[None]:
        assert token is not None
        return self._worker._extend_run(job_id, token, ms)

    def progress_async(self, job_id: str, token: Optional[str],
                       value: Any) -> Awaitable[None]:
        assert token is not None
        return self._worker._progress_run(job_id, token, value)

    def extend(self, job_id: str, token: Optional[str], ms: int) -> None:
        self._worker._blocking(self.extend_async(job_id, token, ms),
                               "await job.extend_lease_async(ms)")

    def progress(self, job_id: str, token: Optional[str], value: Any) -> None:
        self._worker._blocking(self.progress_async(job_id, token, value),
                               "await job.progress_async(value)")
