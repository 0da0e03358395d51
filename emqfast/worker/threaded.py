"""The Worker: claims jobs in batches under leases, runs the handler in a thread
pool, acknowledges outcomes in pipelined batches, and keeps the queue healthy on
its beat (lease extension, reaping, retention, schedule pumping).

Threads: the caller's thread runs the claim loop; ``concurrency`` handler
threads; one acker thread that writes outcomes. Only the lease holder can
finish a job: every outcome carries the lease token the claim returned.
"""
from __future__ import annotations

import inspect
import logging
import os
import queue as queue_mod
import signal
import socket
import threading
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from emqfast.backends import select as backend
from emqfast.server import eviction
from emqfast.worker import core
from emqfast.worker.rows import JobRows
from emqfast.worker.prefetch import Prefetch
from emqfast.core.errors import EvictionRisk, PermissionDenied, VersionMismatch
from emqfast.facade.job import Job
from emqfast.core.keys import QueueKeys
from emqfast.facade.queue import Queue
from emqfast.core.validation import check_int
from emqfast.backends.scripts import run_pipeline
from emqfast.worker.wake import MarkerWaiter
from emqfast.backends.batcher import run_calls

log = logging.getLogger("emqfast.worker")

Handler = Callable[[Job], Any]

DEFAULT_BATCH = 256    # most jobs claimed per round trip, unless batch_size says otherwise
_ACK_FLUSH = 64        # a handler thread hands outcomes to the acker this many at a time...
_ACK_FLUSH_S = 0.001   # ...or after this long, whichever comes first


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    lease_lost: int = 0
    released: int = 0


@dataclass
class _Running:
    job: Job
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    lost: bool = False


class Worker:
    """Runs ``handler(job)`` for jobs of ``queue``.

    ``concurrency`` handlers run at once; each claimed job holds its own lease of
    ``lease_ms`` (extended while it runs); a job whose lease expires (worker
    died or froze) goes back to pending and, after ``max_stalled`` such stalls,
    fails as "stalled". Handler exceptions fail the attempt and retry with the
    job's backoff; raise :class:`emqfast.Unrecoverable` to skip retries.
    Return values are stored as the job's result (JSON).

    Jobs are claimed up to ``batch_size`` per round trip. ``prefetch`` jobs may
    wait (claimed, each with its own lease) beyond the ``concurrency`` running
    ones: ``None`` sizes it from measured handler times so a waiting job starts
    within ~2 ms (none for slow handlers, whole batches for fast ones); ``0``
    turns it off.

    Faults: every call the worker makes is safe to re-send, so a lost connection or reply
    and a server that is loading, busy, failing over or full (OOM) are waited out with
    backoff, and outcomes are written, not left to the lease. A permanent error (an ACL
    lacking a command, a wrong password: :class:`~emqfast.errors.PermissionDenied`) stops
    the worker: :meth:`run` raises it. A server whose ``maxmemory-policy`` may evict keys
    is refused (:class:`~emqfast.errors.EvictionRisk`) unless ``allow_eviction=True``.

    Shutdown (:meth:`stop`, SIGTERM/SIGINT): claiming stops, claimed jobs whose handler has
    not begun are released at once, running handlers get ``shutdown_timeout_s`` to finish.
    A job whose handler is still running after that is NOT released (its handler may still
    finish, and a released job would run a second time): its lease is kept and extended
    until the handler returns, its outcome is written, then :meth:`run` returns (a warning
    names such jobs when the timeout passes). Handler threads cannot be interrupted; a
    process killed meanwhile leaves the lease to expire and the reaper to re-run the job.
    """

    def __init__(self, queue: Queue, handler: Handler, *, concurrency: int = 8,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 prefetch: Optional[int] = None,
                 keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False):
        if not isinstance(queue, Queue) or getattr(queue, "is_async", False):
            raise TypeError("Worker needs an emqfast.Queue (emqfast.aio.Worker takes an aio.Queue)")
        if not callable(handler):
            raise TypeError("handler must be callable")
        core.refuse_async_handler(handler)
        self.queue = queue
        self.handler = handler
        self.concurrency = check_int(concurrency, "concurrency", 1, 10_000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 50, 1 << 40)
        self.max_stalled = check_int(max_stalled, "max_stalled", 0, 1_000_000)
        self.batch_size = check_int(batch_size or max(self.concurrency, DEFAULT_BATCH),
                                    "batch_size", 1, 10_000)
        self.prefetch = None if prefetch is None else check_int(prefetch, "prefetch", 0, 100_000)
        self._holding = Prefetch(self.concurrency, self.prefetch)
        self._rows = JobRows(queue.name)
        self._ready: "deque[Tuple[Job, str]]" = deque()  # claimed, waiting for a handler thread
        self._drainers = 0  # handler-pool tasks currently taking jobs from _ready
        self._waiter: Optional[MarkerWaiter] = None
        self._groups: List[str] = []  # ready groups named by the last claim
        self._due_hint: Optional[float] = None  # server ms the current wait's run-at is due
        self.keep_completed, self.keep_failed, self.max_age_ms = keep_completed, keep_failed, max_age_ms
        self.shutdown_timeout_s = shutdown_timeout_s
        self.allow_eviction = allow_eviction
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.stats = WorkerStats()
        self.beat_s = min(1.0, self.lease_ms / 4000.0)
        # claim request ids: unique per Worker object (two workers may share a name)
        self._claim_prefix = uuid.uuid4().hex[:8]
        self._claim_seq = 0
        self._fatal: Optional[BaseException] = None  # a permanent error met by the acker
        self._stopped_at = 0.0  # monotonic s of the last stop()
        self._keys: QueueKeys = queue.keys
        self._redis = queue.redis
        self._running: Dict[str, _Running] = {}
        self._lock = threading.Condition()
        self._acks: "queue_mod.SimpleQueue[Optional[tuple]]" = queue_mod.SimpleQueue()
        self._pending_acks = 0
        self._stop = threading.Event()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._acker: Optional[threading.Thread] = None
        self._next_beat = 0.0
        self._next_trim = 0.0
        self._server_offset_ms = 0.0  # server clock - local monotonic, from claim replies
        # server ms of the earliest schedule run (from the last pump, or a marker
        # popped since); None = nothing known, pump on the beat only
        self._next_schedule_ms: Optional[float] = None
        self.beat_hooks: List[Callable[[], Any]] = []

    # --- public control -------------------------------------------------------
    def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful: jobs not begun are
        released, running handlers finish and their outcomes are written; see the class
        docstring for handlers still running after ``shutdown_timeout_s``). Raises
        :class:`~emqfast.errors.PermissionDenied` when Redis refuses the worker's commands
        for good, :class:`~emqfast.errors.EvictionRisk` on an evicting server."""
        restore = self._install_signals()
        try:
            self._serve(until_idle=False, deadline=None, wait_scheduled=False)
        finally:
            restore()
            self._stop.clear()  # this stop was honoured: the Worker may run again
        return self.stats

    def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                       wait_scheduled: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due (with
        ``wait_scheduled``, until no delayed job is left either). Raises
        ``TimeoutError`` if that takes longer than ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self._serve(until_idle=True, deadline=deadline, wait_scheduled=wait_scheduled)
        finally:
            self._stop.clear()  # a stop requested meanwhile was honoured
        return self.stats

    def stop(self) -> None:
        """Stop claiming; :meth:`run` returns once claimed jobs are released or finished
        (a running handler is never released: it may still finish). A stop requested
        before :meth:`run` starts is honoured by it (run returns at once)."""
        self._stopped_at = time.monotonic()
        self._stop.set()
        try:  # wake the claim loop if it is blocked on the marker
            self._redis.zadd(self._keys.marker, {"0": 0})
        except Exception:  # noqa: BLE001 - best effort: the loop wakes on its beat anyway
            pass

    # --- the claim loop ---------------------------------------------------------
    def _serve(self, until_idle: bool, deadline: Optional[float], wait_scheduled: bool) -> None:
        self._check_eviction()
        # _stop is NOT cleared here: a stop() requested before run() is honoured
        self._fatal = None
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="emq-handler")
        self._acker = threading.Thread(target=self._ack_loop, name="emq-acker", daemon=True)
        self._acker.start()
        backoff = core.Backoff()
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"worker on {self.queue.name!r} not idle in time")
                try:
                    if self._step(until_idle, wait_scheduled):
                        return
                    backoff.reset()
                except Exception as exc:  # noqa: BLE001 - sorted below
                    self._wait_out(exc, backoff)
        finally:
            self._shutdown()
        if self._fatal is not None:
            raise self._fatal

    def _check_eviction(self) -> None:
        """Refuse a server that may evict jobs, unless ``allow_eviction``."""
        if self.allow_eviction:
            return
        warning = eviction.check(self._redis)
        if warning:
            raise EvictionRisk(warning)

    def _wait_out(self, exc: BaseException, backoff: "core.Backoff") -> None:
        """After a failed turn: wait a transient fault out, re-raise anything else typed
        (PermissionDenied stops the worker: retrying cannot help)."""
        if not core.transient(exc):
            typed = core.typed(exc)
            if typed is exc:
                raise exc
            raise typed from exc
        wait = backoff()
        log.warning("emqfast worker %s: redis unavailable (%s); retrying in %.2fs",
                    self.name, type(core.typed(exc)).__name__, wait)
        self._stop.wait(wait)

    def _stop_overdue(self) -> bool:
        """Stopping for longer than ``shutdown_timeout_s``: stop re-sending."""
        return self._stop.is_set() and \
            time.monotonic() - self._stopped_at > self.shutdown_timeout_s

    def _call(self, call: Any) -> Any:
        """Run one script call; errors come up typed."""
        try:
            return call.script(self._redis, call.keys, call.args)
        except Exception as exc:  # noqa: BLE001 - typed, then re-raised
            typed = core.typed(exc)
            if typed is exc:
                raise
            raise typed from exc

    def _call_until_done(self, call: Any, what: str, give_up: Callable[[], bool]) -> Any:
        """Run a call that is safe to re-send, re-sending it after transient faults (a lost
        reply included: the same call again returns what the first send did) until it gets
        a reply or ``give_up()``; None then. Permanent errors are raised."""
        backoff = core.Backoff()
        while True:
            try:
                return self._call(call)
            except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                if not core.transient(exc):
                    raise
                if give_up():
                    return None
                wait = backoff()
                log.warning("emqfast worker %s: %s failed (%s); re-sending in %.2fs",
                            self.name, what, type(core.typed(exc)).__name__, wait)
                time.sleep(wait)

    def _step(self, until_idle: bool, wait_scheduled: bool) -> bool:
        """One turn of the loop; True when ``until_idle`` is satisfied."""
        self._beat_if_due()
        if self._next_schedule_ms is not None and self._server_now_ms() >= self._next_schedule_ms:
            self._pump_schedules()
        if self._due_hint is not None and self._server_now_ms() >= self._due_hint:
            # woken at a delayed job's run-at: promote before claiming (saves a round trip)
            self._due_hint = None
            self.queue.promote(limit=core.PROMOTE_BATCH)
        free = self._wait_for_slot()
        if free == 0:
            return False
        # Idleness must be judged from before the claim: an outcome written after
        # it (a retry re-parked on the delayed set) is not in this claim's reply.
        idle_before_claim = self._idle()
        self._claim_seq += 1
        claim = core.claim_call(self._keys, min(free, self.batch_size), self.lease_ms, self.name,
                                 self._groups, f"{self._claim_prefix}:{self._claim_seq}")
        # a lost reply is re-sent with the same request id: the leases come back, no more
        # jobs are popped (even when stopping, for up to shutdown_timeout_s, so they are
        # released rather than left to expire as stalls)
        reply = self._call_until_done(claim, "claim", self._stop_overdue)
        if reply is None:
            return False
        now, status, next_due, pairs = core.parse_claim(reply)
        served, self._groups = self._groups, core.claim_groups(reply)  # lanes for next turn
        self._server_offset_ms = now - time.monotonic() * 1000
        # a due delayed job (or retry) is promoted now, backlog or not: it must not wait
        # for an empty claim (one bounded promote; the next claim can take it)
        promoted = core.due_now(status, next_due, now) and \
            self.queue.promote(limit=core.PROMOTE_BATCH) > 0
        if pairs:
            self._start(pairs, served)
            return False
        if promoted:
            return False
        if idle_before_claim and core.idle(until_idle, wait_scheduled, status, next_due, now):
            return True
        wait_ms, hint = core.wait_plan(self.beat_s, now, status, next_due, self._next_schedule_ms)
        if hint is not None:
            self._due_hint = hint
        if until_idle and status == 1:
            with self._lock:
                if self._running or self._pending_acks:
                    # draining: what ends this wait is our own outcomes being written
                    # (the acker notifies), not the marker, which would hold us a beat
                    self._lock.wait(wait_ms / 1000)
                    return False
        self._block_on_marker(wait_ms)
        return False

    def _idle(self) -> bool:
        with self._lock:
            return not self._running and self._pending_acks == 0

    def _wait_for_slot(self) -> int:
        """Jobs this worker may claim now: its capacity minus the jobs it holds."""
        with self._lock:
            free = self._holding.capacity() - len(self._running)
            if free <= 0:
                self._lock.wait(self.beat_s)
                free = self._holding.capacity() - len(self._running)
            return max(free, 0)

    def _server_now_ms(self) -> float:
        return time.monotonic() * 1000 + self._server_offset_ms

    def _block_on_marker(self, wait_ms: float) -> None:
        """Sleep on the wake marker until work is ready or ``wait_ms`` passes.

        A popped marker scored in the future (a delayed job's run-at) only
        shortens the wait; one scored now or earlier ends it. The end is kept
        to the millisecond by :class:`MarkerWaiter` (Redis fires blocking
        timeouts on its hz tick, up to 100 ms late) while new work still wakes
        the worker at once: no polling, no deaf last tick.
        """
        end = time.monotonic() + wait_ms / 1000
        if self._waiter is None:
            self._waiter = MarkerWaiter(self._redis)
        while not self._stop.is_set():
            remaining = end - time.monotonic()
            if remaining <= 0.0005:
                return
            popped = self._waiter.wait(self._keys.marker, remaining)
            if popped is None:
                return
            score = popped[1]
            ahead_ms = score - self._server_now_ms()
            if ahead_ms <= 0:
                return
            # it may be a schedule's next run (upserted or minted elsewhere): pump then
            if self._next_schedule_ms is None or score < self._next_schedule_ms:
                self._next_schedule_ms = score
            end = min(end, time.monotonic() + ahead_ms / 1000)

    # --- starting and running jobs ----------------------------------------------
    def _start(self, pairs: List[Tuple[str, str]], groups: List[str]) -> None:
        """Start claimed jobs in calls of at most ``START_CHUNK`` (bounded work per call)."""
        for at in range(0, len(pairs), core.START_CHUNK):
            self._start_chunk(pairs[at:at + core.START_CHUNK], groups)

    def _start_chunk(self, pairs: List[Tuple[str, str]], groups: List[str]) -> None:
        start = core.start_call(self._keys, pairs, groups)
        # re-sent after a lost reply: a job already started by its token is not counted twice
        rows = self._call_until_done(start, "start", self._stop_overdue)
        if rows is None:  # stopping and Redis still unreachable: the leases will expire
            log.warning("emqfast worker %s: could not start %d claimed jobs before stopping; "
                        "the reaper will hand them back", self.name, len(pairs))
            return
        started = core.started_jobs(self._rows, pairs, rows)
        now = time.monotonic()
        for job, token in started:
            job._extend = self._extender(job.id, token)
            job._progress = self._progresser(job.id, token)
        if not started:
            return
        with self._lock:
            for job, token in started:
                self._running[job.id] = _Running(job, token, now)
            self._ready.extend(started)
            # Handler tasks take jobs from _ready until it is empty; start only the
            # missing ones, so at most `concurrency` handlers ever run at once.
            spawn = min(self.concurrency - self._drainers, len(self._ready))
            self._drainers += spawn
        self.stats.claimed += len(started)
        assert self._pool is not None
        for _ in range(spawn):
            self._pool.submit(self._drain_ready)

    def _drain_ready(self) -> None:
        """One handler slot: run waiting jobs one after another until none is left."""
        done: List[tuple] = []
        flush_at = 0.0
        ready, clock = self._ready, time.perf_counter
        while True:
            try:
                job, token = ready.popleft()
            except IndexError:
                self._hand_over(done)
                done = []
                with self._lock:  # decided under the lock _start spawns under: no job strands
                    if ready:
                        continue
                    self._drainers -= 1
                    return
            started = clock()
            done.append(self._run_one(job, token))
            ended = clock()
            self._holding.observe(ended - started)
            if len(done) == 1:
                flush_at = ended + _ACK_FLUSH_S
            if len(done) >= _ACK_FLUSH or ended >= flush_at:
                self._hand_over(done)
                done = []

    def _run_one(self, job: Job, token: str) -> tuple:
        """Run the handler; the outcome the acker writes."""
        try:
            result = self.handler(job)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
            return core.failure(job, token, exc, traceback.format_exc())
        if inspect.isawaitable(result):  # e.g. a lambda calling an async def: no work done
            return core.awaitable_result(job, token, result)
        try:
            return core.success(job, token, result)
        except BaseException as exc:  # noqa: BLE001 - an unserialisable result fails the job
            return core.failure(job, token, exc, traceback.format_exc())

    def _hand_over(self, outcomes: List[tuple]) -> None:
        """Queue outcomes for the acker, a handful per queue item."""
        if not outcomes:
            return
        with self._lock:
            self._pending_acks += len(outcomes)
        self._acks.put(outcomes)

    def _extender(self, job_id: str, token: str) -> Callable[[int], None]:
        def extend(ms: int) -> None:
            check_int(ms, "ms", 1, 1 << 40)
            call = core.extend_call(self._keys, ms, [(job_id, token)])
            core.check_extended(job_id, self._call_until_done(call, "extend", lambda: False))
        return extend

    def _progresser(self, job_id: str, token: str) -> Callable[[Any], None]:
        def progress(value: Any) -> None:
            call = core.progress_call(self._keys, job_id, token, value)
            call.script(self._redis, call.keys, call.args)
        return progress

    # --- acknowledging outcomes ----------------------------------------------------
    def _ack_loop(self) -> None:
        batcher = None
        try:
            while True:
                first = self._acks.get()
                if first is None:
                    return
                batch = list(first)
                while len(batch) < 1000:
                    try:
                        item = self._acks.get_nowait()
                    except queue_mod.Empty:
                        break
                    if item is None:
                        self._acks.put(None)  # finish this batch, then exit
                        break
                    batch += item
                try:
                    if batcher is None:  # the live backend's pipeline: hiredis under C
                        batcher = backend.batcher_for(self._redis)
                    self._write_outcomes(batch, batcher)
                except Exception as exc:  # noqa: BLE001 - the acker must outlive any one batch
                    typed = core.typed(exc)
                    log.error("emqfast worker %s: could not write %d outcomes (%s: %s); their "
                              "leases will expire and the reaper will re-run them", self.name,
                              len(batch), type(typed).__name__, typed)
                    self._abandon(batch)
                    if isinstance(typed, (PermissionDenied, VersionMismatch)) \
                            and self._fatal is None:  # permanent: stop, run() raises it
                        self._fatal = typed
                        self._stop.set()
        finally:
            if batcher is not None:
                batcher.close()

    def _write_outcomes(self, batch: List[tuple], batcher: Any) -> None:
        plan = core.AckPlan(self._keys, batch)
        replies = plan.replies(self._run_until_landed(plan.calls, batcher))
        core.tally(self.stats, batch, replies, plan.retrying)
        self._write_run_times(batch, replies, batcher)
        with self._lock:
            for outcome in batch:
                self._finished(outcome)
            self._pending_acks -= len(batch)
            self._lock.notify_all()

    def _run_until_landed(self, calls: List[Any], batcher: Any) -> List[Any]:
        """Every call's reply, re-sending the calls a transient fault kept from landing (a
        lost connection or reply, LOADING after a restart, BUSY, a failover, OOM) with
        backoff until Redis takes them: an outcome is never dropped while it can still be
        written. complete.lua and fail.lua are idempotent by token, so a re-sent call whose
        first send ran reports success. Permanent errors are raised."""
        replies: List[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        backoff = core.Backoff()
        while True:
            try:
                got = run_calls(batcher, [calls[i] for i in todo])
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
            log.warning("emqfast worker %s: cannot write %d outcome calls (%s); re-sending in "
                        "%.2fs", self.name, len(todo), type(core.typed(fault)).__name__, wait)
            time.sleep(wait)

    def _write_run_times(self, batch: List[tuple], replies: List[Any], batcher: Any) -> None:
        """Add the batch's wait/run times to the histograms in one call. Best effort: the
        outcomes (and the exact counters) are already written, so a failure is logged,
        not retried."""
        obs = core.run_times(batch, replies)
        if not obs:
            return
        try:
            [reply] = run_calls(batcher, [core.metrics_call(self._keys, obs)])
            if isinstance(reply, Exception):
                raise reply
        except Exception as exc:  # noqa: BLE001 - never lose the acks over metrics
            log.warning("emqfast worker %s: could not record run times of %d jobs (%s)",
                        self.name, len(batch), exc)

    def _finished(self, outcome: tuple) -> None:
        core.forget_run(self._running, outcome)

    def _abandon(self, batch: List[tuple]) -> None:
        """Forget jobs whose outcome could not be written: no longer extending their
        leases hands them back to the reaper (re-run, never lost) instead of hanging."""
        with self._lock:
            for outcome in batch:
                self._finished(outcome)
            self._pending_acks -= len(batch)
            self._lock.notify_all()

    # --- the beat -------------------------------------------------------------------
    def _beat_if_due(self) -> None:
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + self.beat_s
        self._extend_leases(now)
        self.queue.reap(max_stalled=self.max_stalled)
        # due jobs are promoted on the beat too: a worker whose slots are all busy
        # does not claim, and the claim reply is where promotion is usually noticed
        self.queue.promote(limit=core.PROMOTE_BATCH)
        if now >= self._next_trim:
            self._next_trim = now + 5.0
            self.queue.trim(keep_completed=self.keep_completed, keep_failed=self.keep_failed,
                            max_age_ms=self.max_age_ms)
        self._pump_schedules()
        for hook in self.beat_hooks:
            hook()

    def _pump_schedules(self) -> None:
        """Mint due schedule occurrences; remember when the next one is due."""
        self._next_schedule_ms = core.next_schedule_ms(self.queue.schedules.sweep())

    def _extend_leases(self, now: float) -> None:
        """Renew leases that are a third used, so a long handler keeps its job. A transient
        fault leaves them due: the next beat (a third of the lease later at most) tries
        again, long before they expire."""
        with self._lock:
            due = [r for r in self._running.values()
                   if not r.lost and now - r.extended_at > self.lease_ms / 3000.0]
        for chunk in core.chunked(due):
            call = core.extend_call(self._keys, self.lease_ms,
                                    [(r.job.id, r.token) for r in chunk])
            try:
                replies = self._call(call)
            except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                if not core.transient(exc):
                    raise
                log.warning("emqfast worker %s: cannot extend %d leases (%s); next beat",
                            self.name, len(due), type(core.typed(exc)).__name__)
                return
            for r, ok in zip(chunk, replies):
                if ok:
                    r.extended_at = now
                else:
                    r.lost = True
                    log.warning("emqfast: lease on running job %s was lost", r.job.id)

    # --- shutdown ------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop: release what has not begun, let running handlers finish; see the class
        docstring for why a handler still running after ``shutdown_timeout_s`` is waited
        for (its lease kept) rather than released."""
        pool, self._pool = self._pool, None
        end = time.monotonic() + self.shutdown_timeout_s
        with self._lock:  # claimed but not started yet: hand back now instead of running
            waiting = [(job.id, token, core.job_group(job)) for job, token in self._ready]
            self._ready.clear()
        self._release(waiting, end)
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None
        warned = False
        next_beat = time.monotonic() + self.beat_s
        while True:
            with self._lock:
                if not self._running and self._pending_acks == 0:
                    break
                if self._pending_acks == 0 and all(r.lost for r in self._running.values()):
                    break  # only jobs whose lease is gone: nothing of ours to write
                if not warned and time.monotonic() >= end and self._running:
                    warned = True
                    log.warning("emqfast worker %s: %d handler(s) still running after "
                                "shutdown_timeout_s=%s (jobs %s); not releasing them (they may "
                                "still finish): keeping their leases until they return",
                                self.name, len(self._running), self.shutdown_timeout_s,
                                ", ".join(sorted(self._running)[:10]))
                self._lock.wait(0.05)
            if time.monotonic() >= next_beat:  # the claim loop's beat has stopped
                next_beat = time.monotonic() + self.beat_s
                try:
                    self._extend_leases(time.monotonic())
                except Exception as exc:  # noqa: BLE001 - permanent: the lease will lapse
                    log.error("emqfast worker %s: cannot extend leases while stopping (%s)",
                              self.name, exc)
        self._acks.put(None)
        if self._acker is not None:
            self._acker.join(timeout=max(end - time.monotonic(), 1.0))
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _release(self, pairs: List[Tuple[str, str, Optional[str]]], until: float = 0.0) -> None:
        """Give claimed jobs back to pending (grouped ones to their lanes), at most
        ``LEASE_CHUNK`` per round trip; transient faults are retried until ``until``
        (monotonic s), then left to the reaper (their leases expire)."""
        for chunk in core.chunked(pairs):
            calls, skip = core.release_calls(self._keys, chunk)
            backoff = core.Backoff()
            while True:
                try:
                    replies = run_pipeline(self._redis, calls)[skip:]
                    break
                except Exception as exc:  # noqa: BLE001 - sorted by core.transient
                    if not core.transient(exc) or time.monotonic() + backoff.next_s > until:
                        log.warning("emqfast: could not release %d jobs (%s); the reaper will",
                                    len(chunk), exc)
                        replies = [exc] * len(chunk)
                        break
                    time.sleep(backoff())
            with self._lock:
                for (job_id, _, _), reply in zip(chunk, replies):
                    if reply == 1:
                        self.stats.released += 1
                    elif isinstance(reply, Exception):
                        log.warning("emqfast: could not release %s (%s); the reaper will",
                                    job_id, reply)
                    self._running.pop(job_id, None)
                self._lock.notify_all()

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def on_signal(signum: int, frame: Any) -> None:
            log.info("emqfast worker %s: signal %d, shutting down gracefully", self.name, signum)
            self.stop()

        for s in previous:
            signal.signal(s, on_signal)

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)
        return restore
