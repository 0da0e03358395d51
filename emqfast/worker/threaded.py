"""The Worker: claims jobs in batches under leases, runs the handler in a thread
pool, acknowledges outcomes in pipelined batches, and keeps the queue healthy on
its beat (lease extension, reaping, retention, schedule pumping).

Threads: the caller's thread runs the claim loop; ``concurrency`` handler
threads; one acker thread that writes outcomes. Only the lease holder can
finish a job: every outcome carries the lease token the claim returned.

The logic is :class:`~emqfast.worker.machine.WorkerMachine`'s (shared with
:class:`emqfast.aio.Worker`); this driver performs its requests with blocking calls and
owns the handler pool, the acker thread, the wait for handler threads, and signals.
"""
from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from emqfast.backends.drive import run
from emqfast.core.ops import Hook, Logic, PopMarker, Sleep, Wait, WaitDrained, WaitForRoom
from emqfast.facade.job import Job
from emqfast.facade.queue import Queue
from emqfast.server import eviction
from emqfast.worker import signals
from emqfast.worker.cancels import DEFAULT_GRACE_MS
from emqfast.worker.thread_stops import ThreadStops
from emqfast.worker.machine import WorkerMachine
from emqfast.worker.outcomes import Outcome, check_worker_args, refuse_async_handler
from emqfast.worker.stats import WorkerStats
from emqfast.worker.thread_acker import ThreadAcker
from emqfast.worker.thread_slots import HandlerSlots
from emqfast.worker.wake import MarkerWaiter

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("emqfast.worker")

Handler = Callable[[Job], Any]

DEFAULT_BATCH = 256    # most jobs claimed per round trip, unless batch_size says otherwise


class Worker(ThreadAcker, ThreadStops, HandlerSlots, WorkerMachine):
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

    Cancels and timeouts (issue 15): ``q.cancel(id)`` on a job this Worker runs reaches it
    at once (a pub/sub listener thread; the beat re-reads the cancel marks in case a
    message was lost): ``job.cancelled`` turns True and ``job.raise_if_cancelled()``
    raises :class:`emqfast.Cancelled`; the job ends ``cancelled`` (never retried) however
    the handler ends. A job enqueued with ``timeout_ms`` (else ``job_timeout_ms``; None:
    no limit) is signalled the same way when its run passes it, and fails with
    :class:`emqfast.JobTimeout` (retried per its attempts/backoff). A handler still running
    ``cancel_grace_ms`` after either is abandoned: its outcome is written then (the lease
    ends), its late return is ignored, and its thread keeps its handler slot until it
    returns (a thread cannot be killed; see :mod:`emqfast.worker.cancels`).
    """

    def __init__(self, queue: Union[Queue, Sequence[Queue]], handler: Handler, *,
                 concurrency: int = 8,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 prefetch: Optional[int] = None,
                 keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False,
                 job_timeout_ms: Optional[int] = None,
                 cancel_grace_ms: int = DEFAULT_GRACE_MS,
                 order: str = "strict", weights: Optional[Sequence[int]] = None):
        # a list of queues never gets here: WorkerMachine.__new__ makes the many-queue
        # worker (emqfast.worker.many, order/weights: emqfast.worker.queue_order) instead
        check_worker_args(queue, Queue, handler)  # typed: InputTypeError, a TypeError too
        refuse_async_handler(handler)
        self._setup_stops(job_timeout_ms, cancel_grace_ms)
        self._ended: List[int] = []  # per handler slot: runs ended (see _in_hand)
        self._setup(queue, handler, concurrency=concurrency, lease_ms=lease_ms,
                    max_stalled=max_stalled, batch_size=batch_size, batch_floor=DEFAULT_BATCH,
                    keep_completed=keep_completed, keep_failed=keep_failed,
                    max_age_ms=max_age_ms, shutdown_timeout_s=shutdown_timeout_s, name=name,
                    allow_eviction=allow_eviction, prefetch=prefetch)
        self._setup_slots()
        self._lock = threading.Condition()
        self._guard = self._lock
        self._acks: "queue_mod.SimpleQueue[Optional[Outcome]]" = queue_mod.SimpleQueue()
        self._ack_batcher: Any = None  # the acker thread's Batcher (hiredis under C)
        self._stop = threading.Event()
        self._pool: Optional[ThreadPoolExecutor] = None
        self._acker: Optional[threading.Thread] = None
        self._setup_listening()

    # --- public control -------------------------------------------------------
    def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful: jobs not begun are
        released, running handlers finish and their outcomes are written; see the class
        docstring for handlers still running after ``shutdown_timeout_s``). Raises
        :class:`~emqfast.errors.PermissionDenied` when Redis refuses the worker's commands
        for good, :class:`~emqfast.errors.EvictionRisk` on an evicting server."""
        restore = signals.install(self.stop, self.name, worker=self)  # 2nd: force quit
        try:
            self._serve(until_idle=False, deadline=None, wait_scheduled=False)
        finally:
            restore()
            self._stop.clear()  # this stop was honoured: the Worker may run again
        return self.stats

    def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                       wait_scheduled: bool = False, wait_active: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due (with
        ``wait_scheduled``, until no delayed job is left either). Jobs still active under
        other workers' leases are left to them (logged at INFO with when the earliest
        lease ends); with ``wait_active`` it waits for them too, and runs those whose
        worker died once their lease lapses (the beat reaps them). Raises
        ``TimeoutError`` if that takes longer than ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wait_active = wait_active
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

    def _serve(self, until_idle: bool, deadline: Optional[float], wait_scheduled: bool) -> None:
        if not self.allow_eviction:
            self._refuse_eviction(eviction.check(self._redis))
        # _stop is NOT cleared here: a stop() requested before run() is honoured
        self._fatal = None
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="emq-handler")
        self._acker = threading.Thread(target=self._ack_loop, name="emq-acker", daemon=True)
        self._acker.start()
        self._start_listening()
        try:
            self._drive(self._serve_loop(until_idle, deadline, wait_scheduled))
        finally:
            self._shutdown()
        self._raise_fatal()

    # --- performing the machine's requests -------------------------------------------
    def _drive(self, logic: Logic) -> Any:
        """Run a piece of the machine's logic: Redis requests over the Worker's client (bulk
        ones through the live backend's Batcher), waits by :meth:`perform`."""
        return run(self._redis, logic, batcher=self._batcher, waits=self)

    def _batcher(self) -> Any:
        return self._ack_batcher if self._ack_batcher is not None else \
            self.queue._live_batcher()

    def perform(self, request: Wait) -> Any:
        """Perform one of the machine's waits, blocking."""
        return self._waits[type(request)](self, request)

    def _stop_requested(self) -> bool:
        return self._stop.is_set()

    def _notify(self) -> None:
        self._lock.notify_all()

    def _do_sleep(self, effect: Sleep) -> None:
        (self._stop.wait if effect.wake_on_stop else time.sleep)(effect.seconds)

    def _do_hook(self, effect: Hook) -> Any:
        return effect.fn()

    def _do_wait_for_room(self, effect: WaitForRoom) -> Tuple[int, int]:
        """``(free handler slots, jobs this worker may claim)``: the claim room is its
        capacity minus the jobs it holds (started or not). With neither a slot for a held
        job nor room to claim, wait for a handler to return or an outcome to be written."""
        with self._lock:
            # set before the slots are read: a handler ending after that read sees it and
            # notifies (under the lock, so only once this waits)
            self._awaiting_slot = True
            try:
                slots, room = self._room()
                if self._waits_for_room(slots, room):
                    self._lock.wait(effect.seconds)
                    slots, room = self._room()
            finally:
                self._awaiting_slot = False
            return slots, room

    def _do_wait_drained(self, effect: WaitDrained) -> bool:
        with self._lock:  # checked and waited under one lock: no notify is missed
            if not self._running and not self._pending_acks:
                return False
            self._lock.wait(effect.seconds)
            return True

    def _do_pop_marker(self, effect: PopMarker) -> Any:
        if self._waiter is None:
            self._waiter = MarkerWaiter(self._redis)
        return self._waiter.wait(effect.key, effect.seconds)

    _waits: Dict[type, Callable[[Any, Any], Any]] = {
        Sleep: _do_sleep, WaitForRoom: _do_wait_for_room, WaitDrained: _do_wait_drained,
        PopMarker: _do_pop_marker, Hook: _do_hook}

    # --- shutdown ------------------------------------------------------------------
    def _shutdown(self) -> None:
        """Stop: release what has not begun, let running handlers finish; see the class
        docstring for why a handler still running after ``shutdown_timeout_s`` is waited
        for (its lease kept) rather than released."""
        pool, self._pool = self._pool, None
        end = time.monotonic() + self.shutdown_timeout_s
        # claimed but not started yet: hand back now instead of running
        self._drive(self._settle(end))
        self._drive(self._releasing(self._take_held(), end))
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None
        self._wait_for_handlers(end)
        self._stop_listening()  # before the acker's sentinel: an abandoned run's outcome
        self._acks.put(None)
        if self._acker is not None:
            self._acker.join(timeout=max(end - time.monotonic(), 1.0))
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        self._heartbeat.sign_off()  # gone from the Workers page now, not when it expires

    def _wait_for_handlers(self, end: float) -> None:
        """Until every running handler has returned and its outcome is written, renewing
        their leases (the claim loop's beat has stopped); warn once ``end`` has passed."""
        warned = False
        next_beat = time.monotonic() + self.beat_s
        while not signals.abandon_if_forced(self):  # a 2nd signal: hand back, stop waiting
            with self._lock:
                if not self._running and self._pending_acks == 0:
                    break
                if self._pending_acks == 0 and all(r.lost for r in self._running.values()):
                    break  # only jobs whose lease is gone: nothing of ours to write
                if not warned and time.monotonic() >= end and self._running:
                    warned = True
                    log.warning("worker %s: %d handler(s) still running after "
                                "shutdown_timeout_s=%s (jobs %s); not releasing them (they may "
                                "still finish): keeping their leases until they return",
                                self.name, len(self._running), self.shutdown_timeout_s,
                                ", ".join(sorted(self._running)[:10]))
                self._lock.wait(0.05)
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + self.beat_s
                try:  # transient faults: logged, the next beat tries again
                    self._drive(self._renew_on_beat(time.monotonic()))
                except Exception as exc:  # noqa: BLE001 - permanent: the lease will lapse
                    log.error("worker %s: cannot extend leases while stopping (%s)",
                              self.name, exc)
