"""The asyncio Worker: coroutine handlers under leases, on one event loop.

Same rules as :class:`emqfast.Worker` (the logic is :class:`emqfast.worker.machine.WorkerMachine`,
shared with it; this driver awaits its requests), different machinery:

- the claim loop is the task that awaits :meth:`Worker.run`; it claims up to
  ``batch_size`` jobs per round trip, holding those beyond the running ones claimed but
  unstarted (``prefetch``, sized as for the sync Worker) and starting them as slots free;
- each job runs in its own task, bounded by a semaphore of ``concurrency``;
  coroutine handlers are awaited, plain functions run in the Worker's own executor of
  ``concurrency`` threads (a many-queue Worker's one, shared as its slots are), so a plain
  handler given a slot starts at once; made when a run starts, shut down at its end;
- outcomes are written in pipelined batches by one acker task;
- leases are extended by a background task (every ``beat_s``), so a handler that
  runs longer than ``lease_ms`` keeps its job;
- reaping, retention and the schedule pump run on the claim loop's beat;
- an idle worker blocks on the queue's wake marker (``BZPOPMIN``) until work is
  ready, the next delayed job is due or the next schedule runs, the end kept to
  the millisecond by :class:`emqfast.aio.wake.MarkerWaiter` (as in the sync Worker);
- :meth:`Worker.stop` (before or during :meth:`Worker.run`), SIGTERM or SIGINT stop
  claiming (one signal stops every Worker running in the process); in-flight handlers get
  ``shutdown_timeout_s`` to finish. Then coroutine handlers are cancelled, and a job is
  released only once its handler has really ended by that cancellation (it can no longer
  finish, so it never runs twice). A plain function running in its thread cannot be
  interrupted: its job is NOT released; its lease is kept (extended) until it returns and
  its outcome is written. Likewise a coroutine that swallows the cancellation and returns.
- every way out of :meth:`Worker.run` ends the same way: :meth:`Worker.stop`, a signal,
  cancelling the task that awaits it (once or again and again), or ``asyncio.run``'s
  teardown when ``main()`` returns (which cancels every task: run, handlers, acker).
  Written outcomes are flushed, handlers ended by cancellation have their jobs released,
  and no task, lease or connection of the worker is left running. A further cancellation
  during that shutdown only hurries it (handlers are cancelled at once instead of after
  the timeout).
- a handler that raises ``CancelledError`` on its own (or awaits something that was
  cancelled) has failed, like any other exception; only a cancellation of the job's own
  task (our shutdown, or the loop's teardown) releases the job.
- a coroutine handler must not block the loop: a step that holds it longer than 40 % of
  ``lease_ms`` delays every lease renewal (other jobs may lose their leases and run
  twice), and is logged as a warning naming the job. Run CPU-bound or blocking work in a
  thread (``await asyncio.to_thread(f)``) or a process, or use a plain handler.
- faults: every call is safe to re-send (see :class:`emqfast.Worker`): lost connections
  and replies, LOADING/BUSY/failover/OOM are waited out with backoff; PermissionDenied
  stops the worker (:meth:`Worker.run` raises it); an evicting server is refused
  (:class:`~emqfast.errors.EvictionRisk`) unless ``allow_eviction=True``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import time
import traceback
from typing import (Any, Awaitable, Callable, Coroutine, Dict, List, Optional, Sequence, Set,
                    Tuple, Union, cast)

from emqfast.aio import tasks
from emqfast.aio.cancel_listener import AioCancelListener
from emqfast.aio.handlers import AioRunHooks, HandlerPool, call_plain, first_step
from emqfast.aio.crew import AioCrew
from emqfast.worker.crew import expand_partitioned
from emqfast.aio.many_shared import AioMemberMarkers
from emqfast.aio.queue import Queue
from emqfast.aio.signals import SIGNALS
from emqfast.aio.wake import MarkerWaiter
from emqfast.backends.drive import run_async
from emqfast.core.ops import Hook, Logic, PopMarker, Sleep, Wait, WaitDrained, WaitForRoom
from emqfast.facade.job import Job
from emqfast.server import eviction
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.cancels import (ABANDON, DEFAULT_GRACE_MS, TIMEOUT,
                                    timeout_ms_of)
from emqfast.worker.leases import SOLO, RunningJob, Solo
from emqfast.worker.machine import ACK_BATCH, WorkerMachine
from emqfast.worker.outcomes import (Outcome, WorkerStats, check_decodable, check_worker_args,
                                     failure, is_async_handler, job_group, success)
from emqfast.worker.resend import typed
from emqfast.worker.threads import DEFAULT_BATCH

log = logging.getLogger("emqfast.worker")

FLUSH_MIN_S = 1.0  # a shutdown step's least time, when the stop's bound has passed already

Held = Tuple[str, str, Optional[str]]  # a job to release: (id, lease token, group or None)


class Worker(WorkerMachine):
    """Runs ``await handler(job)`` for jobs of an :class:`emqfast.aio.Queue`.

    Arguments mean what they mean for :class:`emqfast.Worker`. Inside a
    coroutine handler use ``await job.extend_lease_async(ms)``; a plain
    (executor) handler may call ``job.extend_lease(ms)`` as in sync code.

    Cancels and timeouts (``job_timeout_ms``, ``cancel_grace_ms`` as for
    :class:`emqfast.Worker`): ``q.cancel(id)`` on a job this Worker runs cancels a
    coroutine handler's task at once (a plain handler sees ``job.cancelled``); the job ends
    ``cancelled``, never retried, however the handler ends. Past its ``timeout_ms`` the
    same happens and the job fails with :class:`emqfast.JobTimeout` (retried per its
    attempts). A handler that has not ended ``cancel_grace_ms`` later (it swallowed the
    cancellation, or runs in a thread) is abandoned: its outcome is written, its task keeps
    its slot until it ends (see :mod:`emqfast.aio.cancel_listener`).

    A run's timeout counts from the moment its handler starts (a plain handler's: when its
    thread calls it), never while the job waits for a slot. Plain handlers run on the
    Worker's own executor of ``concurrency`` threads, one per slot; an abandoned plain
    handler keeps its thread and its slot until it returns, so no more than
    ``concurrency`` plain handlers ever run at once. Jobs started behind abandoned handlers
    wait for a slot, under their leases, their timeouts not yet counting; a cancel ends
    such a job at once, its handler never called. The executor is shut down at the end
    of a run without waiting for abandoned threads (the process still waits for them at
    exit, as for the thread Worker).
    """

    _label = "aio worker"
    renew_on_beat = False  # the lease task renews them (see _lease_loop)

    _led: Optional[AioCrew] = None  # a many-queue Worker's crew (see __init__)
    _timers: Dict[Tuple[str, str], asyncio.TimerHandle]
    _listener: Optional[AioCancelListener]
    cancel_listening: Optional[asyncio.Event]  # set while subscribed (tests wait on it)
    _run_hooks: AioRunHooks  # each running job's Job._run (made by the Worker's setup)

    def __init__(self, queue: Union[Queue, Sequence[Queue]], handler: Callable[[Job], Any], *,
                 concurrency: int = 8,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 prefetch: Optional[int] = None, keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False,
                 job_timeout_ms: Optional[int] = None,
                 cancel_grace_ms: int = DEFAULT_GRACE_MS,
                 order: Optional[str] = None, weights: Optional[Sequence[int]] = None,
                 partitions: Optional[Sequence[int]] = None):
        # a partitioned queue's layout is checked as a run starts (PartitionMismatch)
        self._layout: Any = queue if getattr(queue, "is_partitioned", False) else None
        queue, order = expand_partitioned(queue, partitions, order)
        options: Dict[str, Any] = dict(concurrency=concurrency, lease_ms=lease_ms, max_stalled=max_stalled,
                       batch_size=batch_size, prefetch=prefetch, keep_completed=keep_completed,
                       keep_failed=keep_failed, max_age_ms=max_age_ms,
                       shutdown_timeout_s=shutdown_timeout_s, name=name,
                       allow_eviction=allow_eviction, job_timeout_ms=job_timeout_ms,
                       cancel_grace_ms=cancel_grace_ms)
        if isinstance(queue, (list, tuple)):  # a Worker of this class per queue, one crew
            cls = type(self)
            self._led = AioCrew(lambda q, crew: cls._member(q, handler, crew, options),
                               queue, order=order, weights=weights, name=name)
            self._lead(self._led)
            return
        self._init_queue(cast(Queue, queue), handler, SOLO, **options)

    @classmethod
    def _member(cls, queue: Queue, handler: Callable[[Job], Any], crew: Solo,
                options: Dict[str, Any]) -> "Worker":
        """The Worker of one queue of a many-queue Worker (``crew``: what they share)."""
        member = cls.__new__(cls)
        member._init_queue(queue, handler, crew, **options)
        return member

    def _init_queue(self, queue: Queue, handler: Callable[[Job], Any], crew: Solo, *,
                    job_timeout_ms: Optional[int], cancel_grace_ms: int,
                    **options: Any) -> None:
        check_worker_args(queue, Queue, handler)  # typed: InputTypeError, a TypeError too
        self._setup_stops(job_timeout_ms, cancel_grace_ms)
        self._setup(queue, handler, batch_floor=DEFAULT_BATCH, crew=crew, **options)
        self._is_coro = is_async_handler(handler)
        self._guard = contextlib.nullcontext()  # one event loop: nothing to lock
        self._outcomes: List[Outcome] = []
        self._releases: List[Held] = []  # jobs whose task was cancelled: to release
        self._stopping = False
        self._serving = False  # between _serve's start and the end of its shutdown
        self._closing = False  # shutdown's end: the acker and the lease loop return
        self._run_task: Optional["asyncio.Task[Any]"] = None
        self._cancels_before = 0
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._sem: Optional[AsyncSlots] = None
        self._pool: Optional[HandlerPool] = None  # plain handlers' threads (see _begin)
        self._awaiting_slot: Set[str] = set()  # lease tokens of started jobs with no slot yet
        self._changed: Optional[asyncio.Event] = None   # a job finished / an outcome written
        self._ack_ready: Optional[asyncio.Event] = None
        self._hurry: Optional[asyncio.Event] = None  # set: cancel handlers now, no grace
        # a handler step holding the loop longer than this delays every lease renewal
        # enough for leases to lapse (renewed a third used, checked every quarter)
        self.stall_warn_s = self.lease_ms * 0.4 / 1000.0
        self._last_stall = 0.0  # monotonic s a handler step's stall was last reported
        self._setup_listening()  # cancels heard, timeouts armed
        self._run_hooks = AioRunHooks(self)

    # --- public control ----------------------------------------------------------------
    async def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful shutdown; one signal
        stops every Worker of the process). Cancelling the task that awaits this, or the
        loop's teardown, shuts down the same way (see the module docstring)."""
        if self._led is not None:  # every queue, a task each (see AioCrew)
            if self._layout is not None:
                await self._layout.check_layout()
            return await self._led.run()
        signals = SIGNALS.add(self, asyncio.get_running_loop())
        try:
            await tasks.counted(self._serve(until_idle=False, deadline=None,
                                              wait_scheduled=False))
        finally:
            if signals:
                SIGNALS.remove(self)
            self._stopping = False  # this stop was honoured: the Worker may run again
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                             wait_scheduled: bool = False,
                             wait_active: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due; what it leaves (jobs
        scheduled for later, retries in their backoff included: ``wait_scheduled``; jobs
        active under other workers' leases: ``wait_active``) is logged, as by
        :meth:`emqfast.Worker.run_until_idle`. ``TimeoutError`` after ``timeout_s``."""
        if self._led is not None:  # until every queue is idle at once (see AioCrew)
            if self._layout is not None:
                await self._layout.check_layout()
            return await self._led.run_until_idle(timeout_s, wait_scheduled, wait_active)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wait_active = wait_active
        try:
            await tasks.counted(self._serve(until_idle=True, deadline=deadline,
                                              wait_scheduled=wait_scheduled))
        finally:
            self._stopping = False  # a stop requested meanwhile was honoured
        return self.stats

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once in-flight jobs are finished, or released
        once their (cancelled) handlers have ended (see the module docstring).
        A stop requested before :meth:`run` starts is honoured by it (run returns at once).
        Safe to call from any thread."""
        if self._led is not None:
            self._led.stop()
            return
        loop = self._loop
        if loop is not None and not loop.is_closed() and loop.is_running():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is not loop:  # another thread: act on the worker's own loop
                loop.call_soon_threadsafe(self.stop)
                return
        if not self._stopping:
            self._stopping = True
            self._stopped_at = time.monotonic()
        self._notify()
        if self._waiter is not None:  # wake a claim loop blocked on the marker, without
            self._waiter.interrupt()  # I/O: a silent server would hold a wake-up call

    async def _serve_within_bound(self, serve_loop: Coroutine[Any, Any, None]) -> None:
        """Run the serve loop; once stopping, leave it at the stop's bound. A step stuck on
        a silent server (a read waiting out its deadline) would otherwise hold the whole
        shutdown past ``shutdown_timeout_s``. The loop is cancelled there like a cancelled
        run(): a claim or start it cuts short is handed back by the shutdown's settle."""
        serving: "asyncio.Task[None]" = tasks.spawn(serve_loop, name="emq-serve")
        try:
            while not serving.done():
                # polled: stop() may come from a signal handler, another thread, or a step
                left = self._stop_bound() - time.monotonic() if self._stopping else 0.25
                if left <= 0:
                    serving.cancel()
                    await asyncio.wait([serving], timeout=0.1)
                    return
                await asyncio.wait([serving], timeout=min(left, 0.25))
        except asyncio.CancelledError:
            serving.cancel()  # run() cancelled: cut the loop short, as before
            await asyncio.wait([serving], timeout=0.1)
            raise
        if not serving.cancelled():
            serving.result()  # a permanent error ends run() with it
        elif self._run_cancelled():
            raise asyncio.CancelledError()

    def _stop_bound(self) -> float:
        """When a stopping Worker's shutdown must be over (monotonic s): the stop plus
        ``shutdown_timeout_s`` (a run that ends without stop(): from now)."""
        start = self._stopped_at if self._stopping else time.monotonic()
        return start + self.shutdown_timeout_s

    def _on_signal(self, signum: int) -> None:
        log.info("aio worker %s: signal %d, shutting down gracefully", self.name, signum)
        self.stop()

    async def _serve(self, until_idle: bool, deadline: Optional[float],
                     wait_scheduled: bool) -> None:
        # this loop's client (an aio Queue keeps one per event loop)
        self._redis = self.queue.redis
        shared = self._crew.shared()  # a many-queue Worker's one marker wait, if any
        if shared is not None:
            shared.markers.open()
            self._waiter = AioMemberMarkers(shared.markers, self._keys.marker)
        try:
            await self._check_server()
            self._begin()
            acker = tasks.spawn(self._ack_loop(), name="emq-acker")
            leases = tasks.spawn(self._lease_loop(), name="emq-leases")
            self._start_listening()
            try:
                try:
                    await self._serve_within_bound(
                        self._drive(self._serve_loop(until_idle, deadline, wait_scheduled)))
                finally:
                    await self._finish(acker, leases)
            finally:  # after the shutdown: a cancel still stops a handler it waits for
                await self._stop_listening()
        finally:
            self._close_pool()
            if shared is not None:
                await shared.markers.close()
        self._raise_fatal()

    def _close_pool(self) -> None:
        """The run is over: its handler threads exit. Not waited for: an abandoned handler
        (its outcome written) keeps its thread until it returns, and must not hold the
        loop."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _connections_suspect(self) -> None:
        """A call met a lost connection: the client's idle pooled connections are dropped
        (a half-open blip silenced them with it; each would wait out its own deadline)."""
        pool = getattr(self._redis, "connection_pool", None)
        if pool is not None and hasattr(pool, "disconnect"):
            tasks.spawn(self._drop_idle(pool), name="emq-drop-idle")

    @staticmethod
    async def _drop_idle(pool: Any) -> None:
        try:
            await pool.disconnect(inuse_connections=False)
        except Exception:  # noqa: BLE001 - best effort: a dead one still has a deadline
            pass

    async def _check_server(self) -> None:
        """Refuse a server that may evict jobs (unless ``allow_eviction``); a many-queue
        Worker's queues on one client check it once for all."""
        if not self.allow_eviction:
            shared = self._crew.shared()
            self._refuse_eviction(await eviction.check_async(self._redis) if shared is None
                                  else await shared.eviction(self._redis))

    def _begin(self) -> None:
        """This run's loop, events and flags (_stopping is NOT reset: a stop() requested
        before run() is honoured)."""
        self._loop = asyncio.get_running_loop()
        self._fatal = None
        self._sem = self._crew.handler_slots(self)  # a many-queue Worker's: shared
        # a thread per slot: every plain handler given a slot starts at once
        self._pool = None if self._is_coro else self._crew.handler_pool(self)
        self._changed = asyncio.Event()
        self._ack_ready = asyncio.Event()
        self._hurry = asyncio.Event()
        self._ack_until = None
        self._closing = False
        self._serving = True
        task = asyncio.current_task()
        self._run_task, self._cancels_before = task, (tasks.requests(task) if task else 0)

    # --- performing the machine's requests---------------------------------------------
    def _drive(self, logic: Logic) -> Any:
        """Run a piece of the machine's logic (a coroutine): Redis requests over this
        loop's client, waits by :meth:`perform`; a many-queue Worker's queues on one client
        pass their requests through its gate."""
        shared = self._crew.shared()
        return run_async(self._redis, logic, waits=self,
                         gate=None if shared is None else shared.gate)

    def _stop_requested(self) -> bool:
        return self._stopping

    def _should_stop(self) -> bool:
        return self._stopping or self._run_cancelled()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def perform(self, request: Wait) -> Any:
        """Perform one of the machine's waits: the coroutine doing it."""
        return self._waits[type(request)](self, request)

    async def _do_sleep(self, effect: Sleep) -> None:
        await asyncio.sleep(effect.seconds)

    async def _do_hook(self, effect: Hook) -> Any:
        out = effect.fn()
        return (await out) if inspect.isawaitable(out) else out

    async def _do_wait_for_room(self, effect: WaitForRoom) -> Tuple[int, int]:
        """``(free handler slots, jobs this worker may claim)``, as for the thread Worker:
        claimed jobs beyond the running ones are held unstarted, and started as slots free
        up (plus the few the slots take up within the prefetch budget). The crew answers
        for a many-queue Worker: its queues share the slots."""
        crew = self._crew
        slots, room = crew.room(self)
        if crew.waits_for_room(self, slots, room):
            await self._wait_changed(effect.seconds)
            slots, room = crew.room(self)
        return slots, room

    async def _do_wait_drained(self, effect: WaitDrained) -> bool:
        if self._idle():
            return False
        await self._wait_changed(effect.seconds)
        return True

    async def _do_pop_marker(self, effect: PopMarker) -> Any:
        if self._waiter is None:
            self._waiter = MarkerWaiter(self._redis)
        return await self._waiter.wait(effect.key, effect.seconds)

    _waits: Dict[type, Callable[[Any, Any], Any]] = {
        Sleep: _do_sleep, WaitForRoom: _do_wait_for_room, WaitDrained: _do_wait_drained,
        PopMarker: _do_pop_marker, Hook: _do_hook}

    async def _wait_changed(self, timeout_s: float) -> None:
        assert self._changed is not None
        try:
            await asyncio.wait_for(self._changed.wait(), max(timeout_s, 0.001))
        except asyncio.TimeoutError:
            pass
        self._changed.clear()

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
                await self._release_queued()
            while self._outcomes:
                batch = self._outcomes[:ACK_BATCH]
                del self._outcomes[:ACK_BATCH]
                try:
                    replies = await self._drive(self._write_batch(batch))
                except asyncio.CancelledError:
                    self._outcomes[:0] = batch
                    raise
                except Exception as exc:  # noqa: BLE001 - the acker must outlive any one batch
                    self._ack_failed(batch, exc)
                else:  # written and forgotten: a cancellation from here re-sends nothing
                    await self._drive(self._write_run_times(batch, replies))

    async def _release_queued(self) -> None:
        """Release the jobs whose tasks were cancelled (retried for a few seconds, then left
        to the reaper: their leases expire)."""
        held, self._releases = self._releases, []
        until = time.monotonic() + max(self.shutdown_timeout_s, 5.0)
        try:
            await self._drive(self._releasing(held, until))
        except BaseException:
            self._releases[:0] = held
            raise
        self._pending_acks -= len(held)
        self._notify()

    # --- running handlers: a task per job ----------------------------------------------

    def _hand_out(self, started: List[Tuple[Job, str]]) -> None:
        """A task per started job (bounded by the semaphore)."""
        now = time.monotonic()
        hooks = self._run_hooks
        for job, token in started:  # no per-job callables: cheaper per job
            job._run, job._run_token = hooks, token
            running = self._started_lease(job, token, now)
            self._running[job.id] = running
            self._in_hand += 1
            running.task = tasks.spawn(self._run_job(job, token), name=f"emq-job-{job.id}")
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
            await self._take_slot(slots, token)
        try:
            began = time.perf_counter()
            try:
                if self._is_coro:  # inline (no coroutine of ours per job); plain: _handle_plain
                    if self.job_timeout_ms is not None or job.extra:  # its clock starts now
                        self._arm_timeout(job, token)
                    check_decodable(job)
                    result = self.handler(job)
                    if inspect.iscoroutine(result):
                        done, result = first_step(result, self._on_step, job.id)
                        if not done:
                            result = await result
                    else:
                        result = await result
                else:
                    result = await self._handle_plain(job, token)
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

    async def _take_slot(self, slots: AsyncSlots, token: str) -> None:
        """Wait for a handler slot (all held, some perhaps by abandoned handlers). A cancel
        meanwhile cancels this wait: the job ends cancelled, its handler never called."""
        self._awaiting_slot.add(token)
        try:
            await slots.take()
        finally:
            self._awaiting_slot.discard(token)

    async def _handle_plain(self, job: Job, token: str) -> Any:
        """A plain handler's result: run in the Worker's executor (and what it returns
        awaited when awaitable). Coroutine handlers run inline in :meth:`_outcome_of`."""
        check_decodable(job)
        result = await self._in_executor(job, token)
        if inspect.isawaitable(result):  # a plain function returning a coroutine
            result = await result
        return result

    def _run_cancelled(self) -> bool:
        """True once the task running :meth:`run` was asked to cancel (checked as well as
        caught: redis.asyncio can swallow a cancellation that lands mid-command)."""
        task = self._run_task
        return task is not None and tasks.requests(task) > self._cancels_before

    @staticmethod
    def _task_cancelled() -> bool:
        """True when the current task was asked to cancel (not a CancelledError a handler
        raised or caught from something else)."""
        task = asyncio.current_task()
        return task is not None and tasks.requests(task) > 0

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
        log.warning("aio worker %s: job %r blocked the event loop for %.2fs (over 40%% "
                    "of lease_ms=%d): lease renewals of the other running jobs were late and "
                    "may lapse (the job then runs twice). Run CPU-bound or blocking work in a "
                    "thread (await asyncio.to_thread(...)) or a process.", self.name, job_id,
                    seconds, self.lease_ms)

    async def _in_executor(self, job: Job, token: str) -> Any:
        """A plain handler in the Worker's executor (a thread per slot, so it starts at
        once; its timeout clock starts with it). Its thread cannot be stopped: cancelled
        (shutdown ran out of time, loop teardown, again and again), this still waits for
        it, so the job is not released while its handler may finish (it would run twice).
        The handler's exception is raised here as it raised it."""
        pool = self._pool
        assert pool is not None
        began = None
        if self.job_timeout_ms is not None or job.extra:
            began = functools.partial(self._began_in_thread, job, token)
        future = asyncio.wrap_future(pool.submit(call_plain, self.handler, job, began))
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
                    log.warning("aio worker %s: job %r runs in a thread that cannot "
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

    # --- the lease task and the shutdown -----------------------------------------------

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
                await self._drive(self._renew_due())
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("aio worker %s: cannot extend leases (%s)", self.name,
                            typed(exc))

    def _check_stall(self, late_s: float) -> None:
        """The lease loop woke ``late_s`` late: the event loop was blocked. Warn when that
        may cost leases, unless a handler step already reported it by its job's name."""
        if late_s < self.stall_warn_s or time.monotonic() - self._last_stall < late_s + 1.0:
            return
        log.warning("aio worker %s: lease renewal ran %.2fs late: something blocked "
                    "the event loop (running jobs: %s); leases may lapse and jobs run twice. "
                    "Run CPU-bound or blocking work in a thread or a process.", self.name,
                    late_s, ", ".join(map(repr, sorted(self._running)[:10])) or "none")

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
        if not self._stopping:  # ended without stop() (idle, or cancelled): bound from now
            self._stopping = True
            self._stopped_at = time.monotonic()
        # the loop's teardown cancels every task at once: the acker and the lease loop too,
        # but outcomes must still be written and a slow handler's lease kept
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        leases = await self._alive(leases, self._lease_loop, "emq-leases")
        # a claim or start that the cancellation of run() cut short: its jobs go back
        settle = tasks.spawn(self._drive(self._settle(self._stop_bound())), name="emq-settle")
        await asyncio.wait([settle], timeout=max(self._stop_bound() - time.monotonic(), 0.0))
        if not settle.done():  # a silent server: their leases lapse, the reaper re-runs them
            settle.cancel()
            log.warning("%s: could not hand back claimed jobs within shutdown_timeout_s=%s "
                        "(Redis unreachable?); the reaper will", self._who,
                        self.shutdown_timeout_s)
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
        await asyncio.wait([leases], timeout=FLUSH_MIN_S)
        try:  # gone from the Workers page now, not when it expires (bounded: see _flush)
            await asyncio.wait_for(self._heartbeat.sign_off(),
                                   max(self._stop_bound() - time.monotonic(), FLUSH_MIN_S))
        except asyncio.TimeoutError:
            log.warning("%s: could not sign off within shutdown_timeout_s=%s (Redis "
                        "unreachable?); its record expires", self._who, self.shutdown_timeout_s)
        await self._close_connections()

    def _job_tasks(self) -> List["asyncio.Task[None]"]:
        """The tasks of jobs whose handlers have not ended yet."""
        return [r.task for r in self._running.values() if r.task is not None and not r.task.done()]

    async def _alive(self, task: "asyncio.Task[None]", loop_fn: Callable[[], Any],
                     name: str) -> "asyncio.Task[None]":
        """``task``, or a new one running ``loop_fn`` when it was cancelled (teardown).
        A cancelled task that has not ended soon swallowed its cancellation (redis.asyncio
        can, mid-command) and still runs: it is kept."""
        if not task.done() and tasks.requests(task):
            await asyncio.wait([task], timeout=0.1)  # an acker puts its batch back first
        if not task.done() or not task.cancelled():
            return task  # running, or ended on its own (_closing)
        return tasks.spawn(loop_fn(), name=name)

    async def _grace_period(self) -> None:
        """Wait up to ``shutdown_timeout_s`` for running handlers to finish (less when a
        further cancellation hurries the shutdown)."""
        assert self._hurry is not None
        end = self._stop_bound()
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
        # within the stop's bound (at least a moment: outcomes of handlers that ended late
        # get one try at least); a silent server cannot hold the exit past it
        self._ack_until = max(self._stop_bound(), time.monotonic() + FLUSH_MIN_S)
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        self._closing = True  # the acker returns once it has written what is queued
        self._ack_ready.set()
        await asyncio.wait([acker], timeout=self._ack_until - time.monotonic())
        if not acker.done():
            acker.cancel()
            await asyncio.wait([acker], timeout=1.0)
        elif self._outcomes or self._releases:  # it ended by cancellation: write them here
            try:
                await self._ack_queued()
            except Exception:  # noqa: BLE001 - logged below; the reaper re-runs them
                pass
        if self._outcomes or self._releases:
            log.warning("aio worker %s: could not write %d outcomes / release %d jobs "
                        "before stopping; the reaper will hand them back", self.name,
                        len(self._outcomes), len(self._releases))
        self._outcomes, self._releases, self._pending_acks = [], [], 0
        self._running.clear()  # every handler has ended: nothing of ours is running

    async def _close_connections(self) -> None:
        """Close the marker connection."""
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            try:
                await waiter.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass

    # --- stopping running jobs ---------------------------------------------------------


    def _setup_listening(self) -> None:
        self._timers = {}
        self._listener = None
        self.cancel_listening = None

    def _start_listening(self) -> None:
        shared = self._crew.shared()
        if shared is not None:  # a many-queue Worker's one listener of every queue
            self._listener = shared.listener_open()
        else:  # (made on the running loop: its Event needs one on Python 3.9)
            self._listener = AioCancelListener(
                self._redis, {c: self._on_cancel for c in self._cancel_channels()},
                self._recheck_after_subscribe, self._who)
            self._listener.start()
        self.cancel_listening = self._listener.subscribed

    async def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        shared = self._crew.shared()
        if shared is not None:
            await shared.listener_close()  # the last queue's closes it
        elif listener is not None:
            await listener.close()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def _cancel_channels(self) -> List[str]:
        return [self._keys.cancel_channel]

    async def _recheck_after_subscribe(self) -> None:
        """The listener (re-)subscribed: a cancel published while nobody listened is caught."""
        await self._drive(self._recheck_cancels())

    def _arm(self, job_id: str, token: str, delay_s: float, kind: str) -> None:
        assert self._loop is not None
        old = self._timers.pop((job_id, token), None)
        if old is not None:
            old.cancel()
        self._timers[(job_id, token)] = self._loop.call_later(delay_s, self._on_due, job_id,
                                                              token, kind)

    def _arm_timeout(self, job: Job, token: str, began: Optional[float] = None) -> None:
        """A job's handler began (now, or at monotonic ``began``): stop it when its timeout
        passes (if it has one)."""
        limit = timeout_ms_of(job, self.job_timeout_ms)
        if not limit:
            return
        run = self._running.get(job.id)
        if run is None or run.token != token:
            return  # the run ended meanwhile (lost, released): nothing to time
        ran = 0.0 if began is None else time.monotonic() - began
        self._arm(job.id, token, max(limit / 1000.0 - ran, 0.0), TIMEOUT)

    def _began_in_thread(self, job: Job, token: str, began: float) -> None:
        """A plain handler is about to be called (in its executor thread, at monotonic
        ``began``): its timeout is armed on the loop, counted from then."""
        loop = self._loop
        assert loop is not None
        loop.call_soon_threadsafe(self._arm_timeout, job, token, began)

    def _disarm(self, job_id: str, token: str) -> None:
        """A run's handler ended: its timers go."""
        handle = self._timers.pop((job_id, token), None)
        if handle is not None:
            handle.cancel()

    def _on_due(self, job_id: str, token: str, kind: str) -> None:
        self._timers.pop((job_id, token), None)
        if kind == TIMEOUT:
            self._stopped(self._stop_run(job_id, TIMEOUT, token))
        elif kind == ABANDON:
            outcome = self._abandon_run(job_id, token)
            if outcome is not None:
                self._queue_ack(job_id, token, outcome=outcome)

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """A run was asked to stop: a coroutine's task is cancelled (so is any task still
        waiting for a slot: its handler never began); abandoned if it has not ended within
        the grace."""
        if run is None:
            return
        if run.task is not None and (self._is_coro or run.token in self._awaiting_slot):
            run.task.cancel()  # (a plain handler that began runs on: its thread cannot stop)
        self._arm(run.job.id, run.token, self.cancel_grace_ms / 1000.0, ABANDON)
