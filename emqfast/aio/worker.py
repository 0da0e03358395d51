"""The asyncio Worker: coroutine handlers under leases, on one event loop.

Same rules as :class:`emqfast.Worker` (the logic is :class:`emqfast.worker.machine.WorkerMachine`,
shared with it; this driver awaits its requests), different machinery:

- the claim loop is the task that awaits :meth:`Worker.run`; it claims up to
  ``batch_size`` jobs per round trip, holding those beyond the running ones claimed but
  unstarted (``prefetch``, sized as for the sync Worker) and starting them as slots free;
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
import contextlib
import inspect
import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from emqfast.aio import cancels
from emqfast.aio.cancel_listener import AioStops
from emqfast.aio.handlers import AioRunHooks, JobTasks
from emqfast.aio.lifecycle import Lifecycle
from emqfast.aio.queue import Queue
from emqfast.aio.signals import SIGNALS
from emqfast.aio.wake import MarkerWaiter
from emqfast.backends.drive import run_async
from emqfast.core.ops import Hook, Logic, PopMarker, Sleep, Wait, WaitDrained, WaitForRoom
from emqfast.facade.job import Job
from emqfast.server import eviction
from emqfast.worker.machine import ACK_BATCH
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.cancels import DEFAULT_GRACE_MS
from emqfast.worker.machine import WorkerMachine
from emqfast.worker.many_runs import serve_many
from emqfast.worker.outcomes import Outcome, check_worker_args, is_async_handler
from emqfast.worker.outcomes import WorkerStats
from emqfast.worker.threads import DEFAULT_BATCH

log = logging.getLogger("emqfast.worker")

Held = Tuple[str, str, Optional[str]]  # a job to release: (id, lease token, group or None)


class Worker(JobTasks, Lifecycle, AioStops, WorkerMachine):
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
    """

    _label = "aio worker"
    renew_on_beat = False  # the lease task renews them (see _lease_loop)

    def __new__(cls, queue: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Worker([q_high, q_low], handler, order="strict"|"weighted", weights=[...])``: a
        worker serving several queues (:mod:`emqfast.worker.many`); one queue: this class."""
        if isinstance(queue, (list, tuple)):
            return serve_many(cls, queue, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, queue: Union[Queue, Sequence[Queue]], handler: Callable[[Job], Any], *,
                 concurrency: int = 8,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 prefetch: Optional[int] = None, keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False,
                 job_timeout_ms: Optional[int] = None,
                 cancel_grace_ms: int = DEFAULT_GRACE_MS,
                 order: str = "strict", weights: Optional[Sequence[int]] = None):
        # a list of queues never gets here: __new__ makes the many-queue
        # worker (emqfast.worker.many, order/weights: emqfast.worker.queue_order) instead
        check_worker_args(queue, Queue, handler)  # typed: InputTypeError, a TypeError too
        self._setup_stops(job_timeout_ms, cancel_grace_ms)
        self._setup(queue, handler, concurrency=concurrency, lease_ms=lease_ms,
                    max_stalled=max_stalled, batch_size=batch_size, batch_floor=DEFAULT_BATCH,
                    keep_completed=keep_completed, keep_failed=keep_failed,
                    max_age_ms=max_age_ms, shutdown_timeout_s=shutdown_timeout_s, name=name,
                    allow_eviction=allow_eviction, prefetch=prefetch)
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
        self._changed: Optional[asyncio.Event] = None   # a job finished / an outcome written
        self._ack_ready: Optional[asyncio.Event] = None
        self._hurry: Optional[asyncio.Event] = None  # set: cancel handlers now, no grace
        self._wakers: "set[asyncio.Future[Any]]" = set()
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
        signals = SIGNALS.add(self, asyncio.get_running_loop())
        try:
            await cancels.counted(self._serve(until_idle=False, deadline=None,
                                              wait_scheduled=False))
        finally:
            if signals:
                SIGNALS.remove(self)
            self._stopping = False  # this stop was honoured: the Worker may run again
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                             wait_scheduled: bool = False,
                             wait_active: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due (``wait_active``: nor
        active under other workers' leases; see the sync Worker); ``TimeoutError`` after
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wait_active = wait_active
        try:
            await cancels.counted(self._serve(until_idle=True, deadline=deadline,
                                              wait_scheduled=wait_scheduled))
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
        self._notify()
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
        log.info("aio worker %s: signal %d, shutting down gracefully", self.name, signum)
        self.stop()

    async def _serve(self, until_idle: bool, deadline: Optional[float],
                     wait_scheduled: bool) -> None:
        # this loop's client (an aio Queue keeps one per event loop)
        self._redis = self.queue.redis
        if not self.allow_eviction:
            self._refuse_eviction(await eviction.check_async(self._redis))
        self._begin()
        acker = cancels.spawn(self._ack_loop(), name="emq-acker")
        leases = cancels.spawn(self._lease_loop(), name="emq-leases")
        self._start_listening()
        try:
            try:
                await self._drive(self._serve_loop(until_idle, deadline, wait_scheduled))
            finally:
                await self._finish(acker, leases)
        finally:  # after the shutdown: a cancel still stops a handler it waits for
            await self._stop_listening()
        self._raise_fatal()

    def _begin(self) -> None:
        """This run's loop, events and flags (_stopping is NOT reset: a stop() requested
        before run() is honoured)."""
        self._loop = asyncio.get_running_loop()
        self._fatal = None
        self._sem = AsyncSlots(self.concurrency)
        self._changed = asyncio.Event()
        self._ack_ready = asyncio.Event()
        self._hurry = asyncio.Event()
        self._ack_until = None
        self._closing = False
        self._serving = True
        task = asyncio.current_task()
        self._run_task, self._cancels_before = task, (cancels.requests(task) if task else 0)

    # --- performing the machine's requests---------------------------------------------
    def _drive(self, logic: Logic) -> Any:
        """Run a piece of the machine's logic (a coroutine): Redis requests over this
        loop's client, waits by :meth:`perform`."""
        return run_async(self._redis, logic, waits=self)

    def _stop_requested(self) -> bool:
        return self._stopping

    def _should_stop(self) -> bool:
        return self._stopping or self._run_cancelled()

    def _notify(self) -> None:
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
        up (plus the few the slots take up within the prefetch budget)."""
        slots, room = self._room()
        if self._waits_for_room(slots, room):
            await self._wait_changed(effect.seconds)
            slots, room = self._room()
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
