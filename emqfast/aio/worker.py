"""The asyncio Worker: coroutine handlers under leases, on one event loop.

Same rules as :class:`emqfast.Worker` (the calls and reply handling come from
:mod:`emqfast.worker_core`), different machinery:

- the claim loop is the task that awaits :meth:`Worker.run`; it claims at most
  ``concurrency - running`` jobs (no prefetch: a claimed job starts at once);
- each job runs in its own task, bounded by a semaphore of ``concurrency``;
  coroutine handlers are awaited, plain functions run in the default executor;
- outcomes are written in pipelined batches by one acker task;
- leases are extended by a background task (every ``beat_s``), so a handler that
  runs longer than ``lease_ms`` keeps its job;
- reaping, retention and the schedule pump run on the claim loop's beat;
- an idle worker blocks on the queue's wake marker (``BZPOPMIN``) until work is
  ready, the next delayed job is due or the next schedule runs, the end kept to
  the millisecond by :class:`emqfast.aio.wake.MarkerWaiter` (as in the sync Worker);
- :meth:`stop` (before or during :meth:`run`), SIGTERM or SIGINT stop claiming (one
  signal stops every Worker running in the process); in-flight handlers get
  ``shutdown_timeout_s`` to finish. Then coroutine handlers are cancelled, and a job is
  released only once its handler has really ended by that cancellation (it can no longer
  finish, so it never runs twice). A plain function running in the executor cannot be
  interrupted: its job is NOT released; its lease is kept (extended) until it returns and
  its outcome is written. Likewise a coroutine that swallows the cancellation and returns.
- every way out of :meth:`run` ends the same way: :meth:`stop`, a signal, cancelling the
  task that awaits it (once or again and again), or ``asyncio.run``'s teardown when
  ``main()`` returns (which cancels every task: run, handlers, acker). Written outcomes
  are flushed, handlers ended by cancellation have their jobs released, and no task,
  lease or connection of the worker is left running. A further cancellation during that
  shutdown only hurries it (handlers are cancelled at once instead of after the timeout).
- a handler that raises ``CancelledError`` on its own (or awaits something that was
  cancelled) has failed, like any other exception; only a cancellation of the job's own
  task (our shutdown, or the loop's teardown) releases the job.
- a coroutine handler must not block the loop: a step that holds it longer than 40 % of
  ``lease_ms`` delays every lease renewal (other jobs may lose their leases and run
  twice), and is logged as a warning naming the job. Run CPU-bound or blocking work in a
  thread (``await asyncio.to_thread(f)``) or a process, or use a plain handler.
- faults: every call is safe to re-send (see :class:`emqfast.Worker`): lost connections
  and replies, LOADING/BUSY/failover/OOM are waited out with backoff; PermissionDenied
  stops the worker (:meth:`run` raises it); an evicting server is refused
  (:class:`~emqfast.errors.EvictionRisk`) unless ``allow_eviction=True``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from emqfast.server import eviction
from emqfast.worker import core
from emqfast.worker.rows import JobRows
from emqfast.core.errors import EvictionRisk, PermissionDenied, VersionMismatch
from emqfast.facade.job import Job
from emqfast.core.validation import check_int
from emqfast.backends.scripts import run_pipeline_async
from emqfast.worker.threaded import WorkerStats
from emqfast.aio.queue import Queue
from emqfast.aio.wake import MarkerWaiter

log = logging.getLogger("emqfast.worker")


@dataclass
class _Running:
    job: Job
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    task: Optional["asyncio.Task[None]"] = None
    lost: bool = False
    acking: bool = False  # its outcome (or release) is being written: renew no more


class _SignalFanout:
    """One SIGTERM/SIGINT handler for every aio Worker running in the process.

    ``loop.add_signal_handler`` keeps one callback per signal: each Worker installing its
    own replaced the previous one's, and the first to finish removed it for all. Here the
    first Worker installs the handler (remembering what the loop had before), every
    signal stops all registered Workers, and the last one to leave restores the previous
    handler. Signals reach only the main thread's loop: Workers on other loops or threads
    are not registered (stop them with :meth:`Worker.stop`).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: List["Worker"] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._previous: Dict[int, Any] = {}

    def add(self, worker: "Worker", loop: asyncio.AbstractEventLoop) -> bool:
        """Register ``worker`` (running on ``loop``); False when signals cannot reach it."""
        with self._lock:
            if not self._workers:
                if not self._install(loop):
                    return False
            elif loop is not self._loop:
                return False  # the handler lives on another loop
            self._workers.append(worker)
            return True

    def remove(self, worker: "Worker") -> None:
        """Unregister ``worker``; the last one out restores the loop's previous handlers."""
        with self._lock:
            if worker not in self._workers:
                return
            self._workers.remove(worker)
            if not self._workers:
                self._restore()

    def _install(self, loop: asyncio.AbstractEventLoop) -> bool:
        # the loop's own handlers (a private map of the Unix loops): put back when we leave
        handlers = getattr(loop, "_signal_handlers", {})
        previous = {sig: handlers.get(sig) for sig in self.SIGNALS}
        try:
            for sig in self.SIGNALS:
                loop.add_signal_handler(sig, self._fire, sig)
        except (NotImplementedError, RuntimeError, ValueError):
            for sig in self.SIGNALS:  # not the main thread, or no signals on this platform
                self._put_back(loop, sig, previous[sig])
            return False
        self._loop, self._previous = loop, previous
        return True

    def _restore(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for sig in self.SIGNALS:
            self._put_back(loop, sig, self._previous.get(sig))
        self._previous = {}

    @staticmethod
    def _put_back(loop: asyncio.AbstractEventLoop, sig: int, handle: Any) -> None:
        try:
            if handle is not None and not handle.cancelled():
                loop.add_signal_handler(sig, handle._callback, *handle._args)
            else:
                loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def _fire(self, signum: int) -> None:
        for worker in list(self._workers):
            worker._on_signal(signum)


_SIGNALS = _SignalFanout()


class _Timed:
    """Awaits a handler's coroutine step by step, timing each step: how long the handler
    held the event loop before its next ``await`` (see :meth:`Worker._on_step`)."""

    __slots__ = ("_coro", "_on_step")

    def __init__(self, coro: Any, on_step: Callable[[float], None]):
        self._coro, self._on_step = coro, on_step

    def __await__(self) -> Any:
        coro, value, error = self._coro, None, None
        while True:
            began = time.monotonic()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                self._on_step(time.monotonic() - began)
                return done.value
            except BaseException:
                self._on_step(time.monotonic() - began)
                raise
            self._on_step(time.monotonic() - began)
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the handler
                error = exc


def _call_plain(handler: Callable[[Job], Any], job: Job) -> Tuple[bool, Any]:
    """Run a plain handler (in the executor thread): ``(True, result)`` or ``(False, exc)``.
    Its exception travels as a value: run_in_executor would turn a
    ``concurrent.futures.CancelledError`` into a cancellation of the awaiting task."""
    try:
        return True, handler(job)
    except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
        return False, exc


class Worker:
    """Runs ``await handler(job)`` for jobs of an :class:`emqfast.aio.Queue`.

    Arguments mean what they mean for :class:`emqfast.Worker`. Inside a
    coroutine handler use ``await job.extend_lease_async(ms)``; a plain
    (executor) handler may call ``job.extend_lease(ms)`` as in sync code.
    """

    def __init__(self, queue: Queue, handler: Callable[[Job], Any], *, concurrency: int = 8,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False):
        if not isinstance(queue, Queue):
            raise TypeError("emqfast.aio.Worker needs an emqfast.aio.Queue")
        if not callable(handler):
            raise TypeError("handler must be callable")
        self.queue = queue
        self.handler = handler
        self.concurrency = check_int(concurrency, "concurrency", 1, 10_000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 50, 1 << 40)
        self.max_stalled = check_int(max_stalled, "max_stalled", 0, 1_000_000)
        self.batch_size = check_int(batch_size or self.concurrency, "batch_size", 1, 10_000)
        self.keep_completed, self.keep_failed, self.max_age_ms = keep_completed, keep_failed, max_age_ms
        self.shutdown_timeout_s = shutdown_timeout_s
        self.allow_eviction = allow_eviction
        self._claim_prefix = uuid.uuid4().hex[:8]  # claim request ids, unique per object
        self._claim_seq = 0
        self._fatal: Optional[BaseException] = None  # a permanent error met by the acker
        self._stopped_at = 0.0  # monotonic s of the last stop()
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = WorkerStats()
        self.beat_s = min(1.0, self.lease_ms / 4000.0)
        self._keys = queue.keys
        self._redis = queue.redis
        self._is_coro = core.is_async_handler(handler)
        self._rows = JobRows(queue.name)
        self._running: Dict[str, _Running] = {}
        self._outcomes: List[tuple] = []
        self._pending_acks = 0
        self._stopping = False
        self._serving = False  # between _serve's start and the end of its shutdown
        self._closing = False  # shutdown's end: the acker and the lease loop return
        self._run_task: Optional["asyncio.Task[Any]"] = None
        self._cancels_before = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._sem: Optional[asyncio.Semaphore] = None
        self._changed: Optional[asyncio.Event] = None   # a job finished / an outcome written
        self._ack_ready: Optional[asyncio.Event] = None
        self._next_beat = 0.0
        self._next_trim = 0.0
        self._groups: List[str] = []  # ready groups named by the last claim
        self._due_hint: Optional[int] = None
        self._server_offset_ms = 0.0
        self._next_schedule_ms: Optional[float] = None
        self._waiter: Optional[MarkerWaiter] = None
        self._releases: List[Tuple[str, str, Optional[str]]] = []  # ended by cancellation
        self._hurry: Optional[asyncio.Event] = None  # set: cancel handlers now, no grace
        self._wakers: "set[asyncio.Future[Any]]" = set()
        self._ack_until: Optional[float] = None  # shutdown's flush: give up re-sending then
        # a handler step holding the loop longer than this delays every lease renewal
        # enough for leases to lapse (renewed a third used, checked every quarter)
        self.stall_warn_s = self.lease_ms * 0.4 / 1000.0
        self._last_stall = 0.0  # monotonic s a handler step's stall was last reported
        # coroutines (or functions) run on every beat, as the sync Worker's beat_hooks
        self.beat_hooks: List[Callable[[], Any]] = []

    # --- public control ----------------------------------------------------------------
    async def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful shutdown; one signal
        stops every Worker of the process). Cancelling the task that awaits this, or the
        loop's teardown, shuts down the same way (see the module docstring)."""
        signals = _SIGNALS.add(self, asyncio.get_running_loop())
        try:
            await self._serve(until_idle=False, deadline=None, wait_scheduled=False)
        finally:
            if signals:
                _SIGNALS.remove(self)
            self._stopping = False  # this stop was honoured: the Worker may run again
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                             wait_scheduled: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due (see the sync Worker);
        ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            await self._serve(until_idle=True, deadline=deadline, wait_scheduled=wait_scheduled)
        finally:
            self._stopping = False  # a stop requested meanwhile was honoured
        return self.stats

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once in-flight jobs are finished, or released
        once their (cancelled) handlers have ended (see the module docstring).
        A stop requested before :meth:`run` starts is honoured by it (run returns at once).
        Safe to call from any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed() and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:  # another thread: act on the worker's own loop
                loop.call_soon_threadsafe(self.stop)
                return
        self._stopping = True
        self._stopped_at = time.monotonic()
        if self._changed is not None:
            self._changed.set()
        if loop is not None and loop.is_running() and self._serving:
            # wake the claim loop if it is blocked on the marker
            waker = loop.create_task(self._wake(), name="emq-wake")
            self._wakers.add(waker)
            waker.add_done_callback(self._wakers.discard)

    async def _wake(self) -> None:
        try:
            await self._redis.zadd(self._keys.marker, {"0": 0})
        except Exception:  # noqa: BLE001 - best effort: the loop wakes on its beat anyway
            pass

    def _on_signal(self, signum: int) -> None:
        log.info("emqfast aio worker %s: signal %d, shutting down gracefully", self.name, signum)
        self.stop()

    # --- the claim loop ----------------------------------------------------------------
    async def _serve(self, until_idle: bool, deadline: Optional[float],
                     wait_scheduled: bool) -> None:
        # this loop's client (an aio Queue keeps one per event loop)
        self._redis = self.queue.redis
        if not self.allow_eviction:
            warning = await eviction.check_async(self._redis)
            if warning:
                raise EvictionRisk(warning)
        self._loop = asyncio.get_running_loop()
        # _stopping is NOT reset here: a stop() requested before run() is honoured
        self._fatal = None
        self._sem = asyncio.Semaphore(self.concurrency)
        self._changed = asyncio.Event()
        self._ack_ready = asyncio.Event()
        self._hurry = asyncio.Event()
        self._ack_until = None
        self._closing = False
        self._serving = True
        task = asyncio.current_task()
        self._run_task, self._cancels_before = task, (task.cancelling() if task else 0)
        acker = asyncio.create_task(self._ack_loop(), name="emq-acker")
        leases = asyncio.create_task(self._lease_loop(), name="emq-leases")
        backoff = core.Backoff()
        try:
            while not self._stopping and not self._run_cancelled():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"worker on {self.queue.name!r} not idle in time")
                try:
                    if await self._step(until_idle, wait_scheduled):
                        return
                    backoff.reset()
                except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                    if not core.transient(exc):
                        typed = core.typed(exc)
                        if typed is exc:
                            raise
                        raise typed from exc
                    wait = backoff()
                    log.warning("emqfast aio worker %s: redis unavailable (%s); retrying in "
                                "%.2fs", self.name, type(core.typed(exc)).__name__, wait)
                    await asyncio.sleep(wait)
        finally:
            await self._finish(acker, leases)
        if self._fatal is not None:
            raise self._fatal

    def _stop_overdue(self) -> bool:
        """Stopping for longer than ``shutdown_timeout_s``: stop re-sending."""
        return self._stopping and time.monotonic() - self._stopped_at > self.shutdown_timeout_s

    async def _call(self, call: Any) -> Any:
        """Run one script call; errors come up typed."""
        try:
            return await call.script.call_async(self._redis, call.keys, call.args)
        except Exception as exc:  # noqa: BLE001 - typed, then re-raised
            typed = core.typed(exc)
            if typed is exc:
                raise
            raise typed from exc

    async def _call_until_done(self, call: Any, what: str,
                               give_up: Callable[[], bool] = lambda: False) -> Any:
        """Run a call that is safe to re-send, re-sending it after transient faults (a lost
        reply included) until it gets a reply or ``give_up()`` (None then)."""
        backoff = core.Backoff()
        while True:
            try:
                return await self._call(call)
            except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                if not core.transient(exc):
                    raise
                if give_up():
                    return None
                wait = backoff()
                log.warning("emqfast aio worker %s: %s failed (%s); re-sending in %.2fs",
                            self.name, what, type(core.typed(exc)).__name__, wait)
                await asyncio.sleep(wait)

    def _idle(self) -> bool:
        return not self._running and self._pending_acks == 0

    def _server_now_ms(self) -> float:
        return time.monotonic() * 1000 + self._server_offset_ms

    async def _step(self, until_idle: bool, wait_scheduled: bool) -> bool:
        await self._beat_if_due()
        if self._next_schedule_ms is not None and self._server_now_ms() >= self._next_schedule_ms:
            await self._pump_schedules()
        if self._due_hint is not None and self._server_now_ms() >= self._due_hint:
            self._due_hint = None  # woken at a delayed job's run-at: promote before claiming
            await self.queue.promote(limit=core.PROMOTE_BATCH)
        free = self.concurrency - len(self._running)
        if free <= 0:
            await self._wait_changed(self.beat_s)
            return False
        idle_before_claim = self._idle()  # an outcome written after the claim is not in it
        self._claim_seq += 1
        claim = core.claim_call(self._keys, min(free, self.batch_size), self.lease_ms, self.name,
                                 self._groups, f"{self._claim_prefix}:{self._claim_seq}")
        # a lost reply is re-sent with the same request id: the same leases come back
        reply = await self._call_until_done(claim, "claim", self._stop_overdue)
        if reply is None:
            return False
        now, status, next_due, pairs = core.parse_claim(reply)
        served, self._groups = self._groups, core.claim_groups(reply)  # lanes for next turn
        self._server_offset_ms = now - time.monotonic() * 1000
        # a due delayed job (or retry) is promoted now, backlog or not: it must not wait
        # for an empty claim (one bounded promote; the next claim can take it)
        promoted = core.due_now(status, next_due, now) and \
            await self.queue.promote(limit=core.PROMOTE_BATCH) > 0
        if pairs:
            await self._start(pairs, served)
            return False
        if promoted:
            return False
        if idle_before_claim and core.idle(until_idle, wait_scheduled, status, next_due, now):
            return True
        wait_ms, hint = core.wait_plan(self.beat_s, now, status, next_due, self._next_schedule_ms)
        if hint is not None:
            self._due_hint = hint
        if until_idle and status == 1 and not self._idle():
            # draining: our own outcomes being written end this wait, not the marker
            await self._wait_changed(wait_ms / 1000)
            return False
        await self._block_on_marker(wait_ms)
        return False

    async def _wait_changed(self, timeout_s: float) -> None:
        assert self._changed is not None
        try:
            await asyncio.wait_for(self._changed.wait(), max(timeout_s, 0.001))
        except asyncio.TimeoutError:
            pass
        self._changed.clear()

    async def _block_on_marker(self, wait_ms: float) -> None:
        """BZPOPMIN the wake marker until work is ready or ``wait_ms`` passes; a marker
        scored in the future (a delayed job's or schedule's run-at) shortens the wait."""
        end = time.monotonic() + wait_ms / 1000
        if self._waiter is None:
            self._waiter = MarkerWaiter(self._redis)
        while not self._stopping:
            remaining = end - time.monotonic()
            if remaining <= 0.0005:
                return
            popped = await self._waiter.wait(self._keys.marker, remaining)
            if popped is None:
                return
            score = popped[1]
            ahead_ms = score - self._server_now_ms()
            if ahead_ms <= 0:
                return
            if self._next_schedule_ms is None or score < self._next_schedule_ms:
                self._next_schedule_ms = score
            end = min(end, time.monotonic() + ahead_ms / 1000)

    # --- running jobs ------------------------------------------------------------------
    async def _start(self, pairs: List[Tuple[str, str]], groups: List[str]) -> None:
        """Start claimed jobs in calls of at most ``START_CHUNK`` (bounded work per call)."""
        for at in range(0, len(pairs), core.START_CHUNK):
            await self._start_chunk(pairs[at:at + core.START_CHUNK], groups)

    async def _start_chunk(self, pairs: List[Tuple[str, str]], groups: List[str]) -> None:
        start = core.start_call(self._keys, pairs, groups)
        # re-sent after a lost reply: a job already started by its token is not counted twice
        rows = await self._call_until_done(start, "start", self._stop_overdue)
        if rows is None:  # stopping and Redis still unreachable: the leases will expire
            log.warning("emqfast aio worker %s: could not start %d claimed jobs before "
                        "stopping; the reaper will hand them back", self.name, len(pairs))
            return
        started = core.started_jobs(self._rows, pairs, rows)
        now = time.monotonic()
        for job, token in started:
            job._extend_async = self._extender(job.id, token)
            job._extend = self._threadsafe_extender(job._extend_async)
            job._progress_async = self._progresser(job.id, token)
            job._progress = self._threadsafe_extender(job._progress_async,
                                                      "await job.progress_async(value)")
            running = _Running(job, token, now)
            self._running[job.id] = running
            running.task = asyncio.create_task(self._run_job(job, token), name=f"emq-job-{job.id}")
        self.stats.claimed += len(started)

    async def _run_job(self, job: Job, token: str) -> None:
        """One job's task: its handler's outcome is queued for the acker; a job whose task
        was cancelled (shutdown, loop teardown) is queued for release instead: its handler
        has ended, so it can no longer finish and may run again elsewhere."""
        try:
            outcome = await self._outcome_of(job, token)
        except BaseException:
            self._queue_ack(job.id, token, release=(job.id, token, core.job_group(job)))
            raise
        self._queue_ack(job.id, token, outcome=outcome)

    async def _outcome_of(self, job: Job, token: str) -> tuple:
        """Run the handler; its result or exception as an outcome. Raises CancelledError
        only when this job's task itself was cancelled."""
        assert self._sem is not None
        async with self._sem:
            try:
                if self._is_coro:
                    result = self.handler(job)
                    if inspect.iscoroutine(result):
                        result = _Timed(result, lambda s: self._on_step(job.id, s))
                    result = await result
                else:
                    result = await self._in_executor(job)
                    if inspect.isawaitable(result):  # a plain function returning a coroutine
                        result = await result
                return core.success(job, token, result)
            except (asyncio.CancelledError, concurrent.futures.CancelledError) as exc:
                if self._task_cancelled():
                    raise  # our shutdown or the loop's teardown: released by _run_job
                # the handler raised it itself (or awaited something cancelled): a failure
                return core.failure(job, token, exc, traceback.format_exc())
            except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
                return core.failure(job, token, exc, traceback.format_exc())

    def _run_cancelled(self) -> bool:
        """True once the task running :meth:`run` was asked to cancel (checked as well as
        caught: redis.asyncio can swallow a cancellation that lands mid-command)."""
        task = self._run_task
        return task is not None and task.cancelling() > self._cancels_before

    @staticmethod
    def _task_cancelled() -> bool:
        """True when the current task was asked to cancel (not a CancelledError a handler
        raised or caught from something else)."""
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    def _queue_ack(self, job_id: str, token: str, outcome: Optional[tuple] = None,
                   release: Optional[Tuple[str, str, Optional[str]]] = None) -> None:
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
        log.warning("emqfast aio worker %s: job %s blocked the event loop for %.2fs (over 40%% "
                    "of lease_ms=%d): lease renewals of the other running jobs were late and "
                    "may lapse (the job then runs twice). Run CPU-bound or blocking work in a "
                    "thread (await asyncio.to_thread(...)) or a process.", self.name, job_id,
                    seconds, self.lease_ms)

    async def _in_executor(self, job: Job) -> Any:
        """A plain handler in the default executor. Its thread cannot be stopped: cancelled
        (shutdown ran out of time, loop teardown, again and again), this still waits for
        it, so the job is not released while its handler may finish (it would run twice).
        The handler's exception is raised here as it raised it."""
        future = asyncio.get_running_loop().run_in_executor(None, _call_plain, self.handler, job)
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
                    log.warning("emqfast aio worker %s: job %s runs in a thread that cannot "
                                "be cancelled; keeping its lease until it returns", self.name,
                                job.id)
        if ok:
            return value
        raise value

    def _extender(self, job_id: str, token: str) -> Callable[[int], Any]:
        async def extend(ms: int) -> None:
            check_int(ms, "ms", 1, 1 << 40)
            call = core.extend_call(self._keys, ms, [(job_id, token)])
            core.check_extended(job_id, await self._call_until_done(call, "extend"))
            running = self._running.get(job_id)
            if running is not None:
                running.extended_at = time.monotonic()
        return extend

    def _progresser(self, job_id: str, token: str) -> Callable[[Any], Any]:
        async def progress(value: Any) -> None:
            call = core.progress_call(self._keys, job_id, token, value)
            await call.script.call_async(self._redis, call.keys, call.args)
        return progress

    def _threadsafe_extender(self, extend: Callable[[Any], Any],
                             instead: str = "await job.extend_lease_async(ms)"
                             ) -> Callable[[Any], None]:
        loop = self._loop

        def blocking(ms: int) -> None:  # for plain handlers running in the executor
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                assert loop is not None
                asyncio.run_coroutine_threadsafe(extend(ms), loop).result()
                return
            raise RuntimeError(f"in a coroutine handler use `{instead}`")
        return blocking

    # --- acknowledging outcomes ------------------------------------------------------------
    async def _ack_loop(self) -> None:
        assert self._ack_ready is not None
        while True:
            await self._ack_ready.wait()
            self._ack_ready.clear()
            await self._ack_queued()
            if self._closing:  # shutdown's last flush is done
                return

    async def _ack_queued(self) -> None:
        """Write every queued outcome and release every queued job. Cancelled mid-batch,
        the batch goes back to the queue (re-sending it is harmless: fenced by the token)
        for the shutdown to flush."""
        while self._outcomes or self._releases:
            if self._releases:
                held, self._releases = self._releases, []
                try:
                    await self._release(held)
                except BaseException:
                    self._releases[:0] = held
                    raise
                self._pending_acks -= len(held)
                assert self._changed is not None
                self._changed.set()
            while self._outcomes:
                batch, self._outcomes = self._outcomes[:1000], self._outcomes[1000:]
                try:
                    replies = await self._write_outcomes(batch)
                except asyncio.CancelledError:
                    self._outcomes[:0] = batch
                    raise
                except Exception as exc:  # noqa: BLE001 - the acker must outlive any one batch
                    typed = core.typed(exc)
                    log.error("emqfast aio worker %s: could not write %d outcomes (%s: %s); the "
                              "reaper will re-run them", self.name, len(batch),
                              type(typed).__name__, typed)
                    self._forget(batch)
                    if isinstance(typed, (PermissionDenied, VersionMismatch)) \
                            and self._fatal is None:  # permanent: stop, run() raises it
                        self._fatal = typed
                        self.stop()
                else:  # written and forgotten: a cancellation from here re-sends nothing
                    await self._write_run_times(batch, replies)

    async def _write_outcomes(self, batch: List[tuple]) -> List[Any]:
        """Write a batch of outcomes (then forgotten); the replies, for the run times."""
        plan = core.AckPlan(self._keys, batch)
        replies = plan.replies(await self._run_until_landed(plan.calls))
        core.tally(self.stats, batch, replies, plan.retrying)
        self._forget(batch)
        return replies

    async def _run_until_landed(self, calls: List[Any]) -> List[Any]:
        """Every call's reply, re-sending the calls a transient fault kept from landing with
        backoff until Redis takes them (see :meth:`emqfast.Worker._run_until_landed`)."""
        replies: List[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        backoff = core.Backoff()
        while True:
            try:
                got = await run_pipeline_async(self._redis, [calls[i] for i in todo])
                for i, reply in zip(todo, got):
                    replies[i] = reply
                todo = [todo[j] for j in core.transient_slots(got)]
                fault: Any = replies[todo[0]] if todo else None
            except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                if not core.transient(exc):
                    raise
                fault = exc
            if not todo:
                return replies
            if self._ack_until is not None and time.monotonic() + backoff.next_s > self._ack_until:
                raise fault  # stopping, Redis still unreachable: the reaper will re-run them
            wait = backoff()
            log.warning("emqfast aio worker %s: cannot write %d outcome calls (%s); re-sending "
                        "in %.2fs", self.name, len(todo), type(core.typed(fault)).__name__, wait)
            await asyncio.sleep(wait)

    async def _write_run_times(self, batch: List[tuple], replies: List[Any]) -> None:
        """Add the batch's wait/run times to the histograms in one call. Best effort: the
        outcomes (and the exact counters) are already written, so a failure is logged,
        not retried."""
        obs = core.run_times(batch, replies)
        if not obs:
            return
        try:
            [reply] = await run_pipeline_async(self._redis, [core.metrics_call(self._keys, obs)])
            if isinstance(reply, Exception):
                raise reply
        except Exception as exc:  # noqa: BLE001 - never lose the acks over metrics
            log.warning("emqfast aio worker %s: could not record run times of %d jobs (%s)",
                        self.name, len(batch), exc)

    def _finished(self, outcome: tuple) -> None:
        core.forget_run(self._running, outcome)

    def _forget(self, batch: List[tuple]) -> None:
        for outcome in batch:
            self._finished(outcome)
        self._pending_acks -= len(batch)
        assert self._changed is not None
        self._changed.set()

    # --- leases and the beat ---------------------------------------------------------------
    async def _lease_loop(self) -> None:
        """Renew leases a third used, in the background (handlers may hog no thread, but
        a claim loop blocked on the marker must not let a long job's lease lapse)."""
        # ends on _closing, not only by cancel: redis.asyncio can swallow a cancellation
        # that lands mid-command, and this loop would then renew leases forever
        while not self._closing:
            slept_at = time.monotonic()
            await asyncio.sleep(self.beat_s)
            self._check_stall(time.monotonic() - slept_at - self.beat_s)
            try:
                await self._extend_leases()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("emqfast aio worker %s: cannot extend leases (%s)", self.name,
                            core.typed(exc))

    def _check_stall(self, late_s: float) -> None:
        """The lease loop woke ``late_s`` late: the event loop was blocked. Warn when that
        may cost leases, unless a handler step already reported it by its job's name."""
        if late_s < self.stall_warn_s or time.monotonic() - self._last_stall < late_s + 1.0:
            return
        log.warning("emqfast aio worker %s: lease renewal ran %.2fs late: something blocked "
                    "the event loop (running jobs: %s); leases may lapse and jobs run twice. "
                    "Run CPU-bound or blocking work in a thread or a process.", self.name,
                    late_s, ", ".join(sorted(self._running)[:10]) or "none")

    async def _extend_leases(self) -> None:
        now = time.monotonic()
        # a job whose outcome is being written is not renewed: the write ends its lease,
        # and a renewal racing it would read as a lost lease
        due = [r for r in self._running.values()
               if not r.lost and not r.acking and now - r.extended_at > self.lease_ms / 3000.0]
        if not due:
            return
        for chunk in core.chunked(due):  # bounded server work per call
            call = core.extend_call(self._keys, self.lease_ms,
                                    [(r.job.id, r.token) for r in chunk])
            replies = await self._call(call)
            for r, ok in zip(chunk, replies):
                if ok:
                    r.extended_at = now
                elif self._running.get(r.job.id) is r and not r.acking:
                    r.lost = True
                    log.warning("emqfast: lease on running job %s was lost", r.job.id)

    async def _beat_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + self.beat_s
        await self.queue.reap(max_stalled=self.max_stalled)
        # due jobs are promoted on the beat too (a worker with every slot busy does not claim)
        await self.queue.promote(limit=core.PROMOTE_BATCH)
        if now >= self._next_trim:
            self._next_trim = now + 5.0
            await self.queue.trim(keep_completed=self.keep_completed,
                                  keep_failed=self.keep_failed, max_age_ms=self.max_age_ms)
        await self._pump_schedules()
        for hook in self.beat_hooks:
            out = hook()
            if inspect.isawaitable(out):
                await out

    async def _pump_schedules(self) -> None:
        self._next_schedule_ms = core.next_schedule_ms(await self.queue.schedules.sweep())

    # --- shutdown ---------------------------------------------------------------------------
    async def _finish(self, acker: "asyncio.Task[None]", leases: "asyncio.Task[None]") -> None:
        """Run the shutdown to its end, however :meth:`run` is left: a cancellation of the
        task awaiting run() (again and again, or the loop's teardown) only hurries it
        (handlers are cancelled at once), then is re-raised once everything is done."""
        assert self._hurry is not None
        shutdown = asyncio.ensure_future(self._shutdown(acker, leases))
        cancelled = False
        try:
            while not shutdown.done():
                try:
                    await asyncio.shield(shutdown)
                except asyncio.CancelledError:
                    if not shutdown.done():
                        cancelled = True
                        self._hurry.set()
        finally:
            self._serving = False
        if cancelled or self._run_cancelled():  # (redis.asyncio may have swallowed it)
            raise asyncio.CancelledError()
        shutdown.result()

    async def _shutdown(self, acker: "asyncio.Task[None]", leases: "asyncio.Task[None]") -> None:
        """Stop; see the module docstring for which late jobs are released (only those whose
        handler has ended by cancellation) and which are waited for (lease kept)."""
        assert self._hurry is not None
        self._stopping = True
        # the loop's teardown cancels every task at once: the acker and the lease loop too,
        # but outcomes must still be written and a slow handler's lease kept
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        leases = await self._alive(leases, self._lease_loop, "emq-leases")
        await self._grace_period()
        late = self._job_tasks()
        for task in late:
            task.cancel()  # its job is released once its handler has ended
        while late:
            # no timeout: a cancelled coroutine ends at once; a thread that cannot be
            # cancelled is waited for (the lease loop keeps its lease), its outcome written
            await asyncio.wait(late, timeout=self.beat_s)
            acker = await self._alive(acker, self._ack_loop, "emq-acker")
            leases = await self._alive(leases, self._lease_loop, "emq-leases")
            late = self._job_tasks()
        await self._flush(acker)
        leases.cancel()  # and _closing: see _lease_loop
        await asyncio.wait([leases], timeout=self.beat_s + 1.0)
        await self._close_connections()

    def _job_tasks(self) -> List["asyncio.Task[None]"]:
        """The tasks of jobs whose handlers have not ended yet."""
        return [r.task for r in self._running.values() if r.task is not None and not r.task.done()]

    async def _alive(self, task: "asyncio.Task[None]", loop_fn: Callable[[], Any],
                     name: str) -> "asyncio.Task[None]":
        """``task``, or a new one running ``loop_fn`` when it was cancelled (teardown).
        A cancelled task that has not ended soon swallowed its cancellation (redis.asyncio
        can, mid-command) and still runs: it is kept."""
        if not task.done() and task.cancelling():
            await asyncio.wait([task], timeout=0.1)  # an acker puts its batch back first
        if not task.done() or not task.cancelled():
            return task  # running, or ended on its own (_closing)
        return asyncio.create_task(loop_fn(), name=name)

    async def _grace_period(self) -> None:
        """Wait up to ``shutdown_timeout_s`` for running handlers to finish (less when a
        further cancellation hurries the shutdown)."""
        assert self._hurry is not None
        end = time.monotonic() + self.shutdown_timeout_s
        while not self._hurry.is_set():
            tasks = self._job_tasks()
            left = end - time.monotonic()
            if not tasks or left <= 0:
                return
            await asyncio.wait(tasks, timeout=min(left, 0.05))

    async def _flush(self, acker: "asyncio.Task[None]") -> None:
        """Let the acker write the outcomes and releases still queued, re-sending for a
        bounded time only (after that the reaper re-runs what could not be written)."""
        assert self._ack_ready is not None
        self._ack_until = time.monotonic() + max(self.shutdown_timeout_s, 5.0)
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        self._closing = True  # the acker returns once it has written what is queued
        self._ack_ready.set()
        await asyncio.wait([acker], timeout=self._ack_until + 5.0 - time.monotonic())
        if not acker.done():
            acker.cancel()
            await asyncio.wait([acker], timeout=1.0)
        elif self._outcomes or self._releases:  # it ended by cancellation: write them here
            try:
                await self._ack_queued()
            except Exception:  # noqa: BLE001 - logged below; the reaper re-runs them
                pass
        if self._outcomes or self._releases:
            log.warning("emqfast aio worker %s: could not write %d outcomes / release %d jobs "
                        "before stopping; the reaper will hand them back", self.name,
                        len(self._outcomes), len(self._releases))
        self._outcomes, self._releases, self._pending_acks = [], [], 0
        self._running.clear()  # every handler has ended: nothing of ours is running

    async def _close_connections(self) -> None:
        """End the wake-up calls stop() started and close the marker connection."""
        if self._wakers:
            await asyncio.wait(list(self._wakers), timeout=1.0)
            for waker in list(self._wakers):
                waker.cancel()
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            try:
                await waiter.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass

    async def _release(self, pairs: List[Tuple[str, str, Optional[str]]]) -> None:
        """Give jobs back to pending (grouped ones to their lanes), at most ``LEASE_CHUNK``
        per round trip; transient faults are retried for a few seconds, then left to the
        reaper (their leases expire)."""
        until = time.monotonic() + max(self.shutdown_timeout_s, 5.0)
        for chunk in core.chunked(pairs):
            calls, skip = core.release_calls(self._keys, chunk)
            backoff = core.Backoff()
            while True:
                try:
                    replies = (await run_pipeline_async(self._redis, calls))[skip:]
                    break
                except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                    if not core.transient(exc) or time.monotonic() + backoff.next_s > until:
                        log.warning("emqfast: could not release %d jobs (%s); the reaper will",
                                    len(chunk), exc)
                        replies = [exc] * len(chunk)
                        break
                    await asyncio.sleep(backoff())
            for (job_id, token, _), reply in zip(chunk, replies):
                if reply == 1:
                    self.stats.released += 1
                elif isinstance(reply, Exception):
                    log.warning("emqfast: could not release %s (%s); the reaper will", job_id,
                                reply)
                running = self._running.get(job_id)
                if running is not None and running.token == token:
                    del self._running[job_id]
