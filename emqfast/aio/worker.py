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
- :meth:`stop`, SIGTERM or SIGINT stop claiming; in-flight handlers get
  ``shutdown_timeout_s`` to finish. Then coroutine handlers are cancelled, and a job is
  released only once its handler has really ended by that cancellation (it can no longer
  finish, so it never runs twice). A plain function running in the executor cannot be
  interrupted: its job is NOT released; its lease is kept (extended) until it returns and
  its outcome is written. Likewise a coroutine that swallows the cancellation and returns.
- faults: every call is safe to re-send (see :class:`emqfast.Worker`): lost connections
  and replies, LOADING/BUSY/failover/OOM are waited out with backoff; PermissionDenied
  stops the worker (:meth:`run` raises it); an evicting server is refused
  (:class:`~emqfast.errors.EvictionRisk`) unless ``allow_eviction=True``.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import time
import traceback
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import eviction
from .. import worker_core as core
from ..dispatch import JobRows
from ..errors import EvictionRisk, PermissionDenied, VersionMismatch
from ..job import Job
from ..queue import check_int
from ..scripts import run_pipeline_async
from ..worker import WorkerStats
from .queue import Queue
from .wake import MarkerWaiter

log = logging.getLogger("emqfast.worker")


@dataclass
class _Running:
    job: Job
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    task: Optional["asyncio.Task[None]"] = None
    lost: bool = False


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
        # coroutines (or functions) run on every beat, as the sync Worker's beat_hooks
        self.beat_hooks: List[Callable[[], Any]] = []

    # --- public control ----------------------------------------------------------------
    async def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful shutdown)."""
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signals on this platform
        try:
            await self._serve(until_idle=False, deadline=None, wait_scheduled=False)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                             wait_scheduled: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due (see the sync Worker);
        ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        await self._serve(until_idle=True, deadline=deadline, wait_scheduled=wait_scheduled)
        return self.stats

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once in-flight jobs are finished, or released
        once their (cancelled) handlers have ended (see the module docstring).
        Call it from the worker's event loop (signal handlers do)."""
        self._stopping = True
        self._stopped_at = time.monotonic()
        if self._changed is not None:
            self._changed.set()
        if self._loop is not None and not self._loop.is_closed():
            # wake the claim loop if it is blocked on the marker
            self._loop.create_task(self._wake())

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
        if not self.allow_eviction:
            warning = await eviction.check_async(self._redis)
            if warning:
                raise EvictionRisk(warning)
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._fatal = None
        self._sem = asyncio.Semaphore(self.concurrency)
        self._changed = asyncio.Event()
        self._ack_ready = asyncio.Event()
        acker = asyncio.create_task(self._ack_loop(), name="emq-acker")
        leases = asyncio.create_task(self._lease_loop(), name="emq-leases")
        backoff = core.Backoff()
        try:
            while not self._stopping:
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
            await self._shutdown(acker, leases)
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
        assert self._sem is not None
        async with self._sem:
            try:
                if self._is_coro:
                    result = await self.handler(job)
                else:
                    result = await self._in_executor(job)
                    if inspect.isawaitable(result):  # a plain function returning a coroutine
                        result = await result
                outcome = core.success(job, token, result)
            except asyncio.CancelledError:
                raise  # shutdown ran out of time, handler ended: the job is released
            except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
                outcome = core.failure(job, token, exc, traceback.format_exc())
        self._pending_acks += 1
        self._outcomes.append(outcome)
        assert self._ack_ready is not None
        self._ack_ready.set()

    async def _in_executor(self, job: Job) -> Any:
        """A plain handler in the default executor. Its thread cannot be stopped: cancelled
        (shutdown ran out of time), this still waits for it and returns its result, so
        the job is not released while its handler may finish (it would run twice)."""
        future = asyncio.get_running_loop().run_in_executor(None, self.handler, job)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.cancelled():
                raise  # never began: nothing can finish
            log.warning("emqfast aio worker %s: job %s runs in a thread that cannot be "
                        "cancelled; keeping its lease until it returns", self.name, job.id)
            return await future

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
            while self._outcomes:
                batch, self._outcomes = self._outcomes[:1000], self._outcomes[1000:]
                try:
                    await self._write_outcomes(batch)
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

    async def _write_outcomes(self, batch: List[tuple]) -> None:
        plan = core.AckPlan(self._keys, batch)
        replies = plan.replies(await self._run_until_landed(plan.calls))
        core.tally(self.stats, batch, replies, plan.retrying)
        await self._write_run_times(batch, replies)
        self._forget(batch)

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
        while True:
            await asyncio.sleep(self.beat_s)
            try:
                await self._extend_leases()
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("emqfast aio worker %s: cannot extend leases (%s)", self.name,
                            core.typed(exc))

    async def _extend_leases(self) -> None:
        now = time.monotonic()
        due = [r for r in self._running.values()
               if not r.lost and now - r.extended_at > self.lease_ms / 3000.0]
        if not due:
            return
        for chunk in core.chunked(due):  # bounded server work per call
            call = core.extend_call(self._keys, self.lease_ms,
                                    [(r.job.id, r.token) for r in chunk])
            replies = await self._call(call)
            for r, ok in zip(chunk, replies):
                if ok:
                    r.extended_at = now
                else:
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
    async def _shutdown(self, acker: "asyncio.Task[None]", leases: "asyncio.Task[None]") -> None:
        """Stop; see the module docstring for which late jobs are released (only those whose
        handler has ended by cancellation) and which are waited for (lease kept)."""
        self._stopping = True
        tasks = [r.task for r in self._running.values() if r.task is not None and not r.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.shutdown_timeout_s)
        late = [(job_id, r) for job_id, r in self._running.items()
                if r.task is not None and not r.task.done()]
        for _, r in late:
            assert r.task is not None
            r.task.cancel()
        if late:
            # no timeout: a cancelled coroutine ends at once; a thread that cannot be
            # cancelled is waited for (the lease loop keeps its lease) and its outcome written
            await asyncio.wait([r.task for _, r in late if r.task is not None])
        # let the acker write what finished before giving the rest back
        end = time.monotonic() + max(self.shutdown_timeout_s, 1.0)
        while self._pending_acks and time.monotonic() < end and not acker.done():
            await self._wait_changed(0.05)
        acker.cancel()
        leases.cancel()
        for task in (acker, leases):
            try:
                await task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - already logged
                pass
        ended = [(job_id, r.token, core.job_group(r.job)) for job_id, r in late
                 if r.task is not None and r.task.cancelled()]
        await self._release(ended)
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
            for (job_id, _, _), reply in zip(chunk, replies):
                if reply == 1:
                    self.stats.released += 1
                elif isinstance(reply, Exception):
                    log.warning("emqfast: could not release %s (%s); the reaper will", job_id,
                                reply)
                self._running.pop(job_id, None)
