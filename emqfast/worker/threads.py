"""The thread Worker (:class:`emqfast.Worker`): claims jobs in batches under leases, runs
the handler in a thread pool, acknowledges outcomes in pipelined batches, and keeps the
queue healthy on its beat (lease extension, reaping, retention, schedule pumping).

The logic is :class:`~emqfast.worker.machine.WorkerMachine`'s (shared with
:class:`emqfast.aio.Worker`); this driver performs its requests with blocking calls and
owns the threads, read top to bottom:

- the caller's thread runs the claim loop (:meth:`Worker.run`, :meth:`Worker.run_until_idle`);
- handler slots: started jobs queue on ``_ready`` and up to ``concurrency`` handler-pool
  tasks drain it, each handing every outcome to the acker the moment its handler returns.
  Slot accounting takes no lock per job: ``_in_hand`` is the jobs handed out less the runs
  each slot ended (one writer per item of ``_ended``); a slot takes the lock only to wake a
  claim loop that waits for one (``_awaiting``). Handler processes count a child's runs
  under the lock: its reader and its successor's may both add to its item;
- the acker thread writes outcomes in batches through the live backend's Batcher (hiredis
  under C); while more outcomes are coming it lets them gather for up to ``GATHER_S``, so a
  busy drain writes dozens per round trip while a lone job's outcome is written at once;
- stops (the rules: :mod:`emqfast.worker.cancels`): a listener thread hears cancels
  (:class:`CancelListener`), a timer thread fires timeouts and the graces after a stop
  (:class:`TimeoutTimer`), the beat re-reads the cancel marks. A sync handler cannot be
  interrupted: it sees ``job.cancelled``; one that ignores it is abandoned after
  ``cancel_grace_ms`` (its outcome written, its thread keeping its slot until it returns).

Only the lease holder can finish a job: every outcome carries the lease token the claim
returned.
"""
from __future__ import annotations

import inspect
import logging
import queue as queue_mod
import threading
import time
import traceback
from collections import deque
from typing import (Any, Awaitable, Callable, Dict, List, Optional, Sequence, Tuple, Union,
                    cast)

from emqfast.backends import select as backend
from emqfast.backends.drive import run
from emqfast.core.errors import InvalidInput
from emqfast.core.ops import Hook, Logic, PopMarker, Sleep, Wait, WaitDrained, WaitForRoom
from emqfast.facade.job import Job
from emqfast.facade.queue import Queue
from emqfast.server import eviction
from emqfast.worker import signals
from emqfast.worker.machine import ACK_BATCH
from emqfast.worker.cancels import (ABANDON, DEFAULT_GRACE_MS, TIMEOUT,
                                    timeout_ms_of)
from emqfast.worker.crew import expand_partitioned
from emqfast.worker.crew_threads import ThreadCrew
from emqfast.worker.machine import WorkerMachine
from emqfast.worker.many_shared import MemberMarkers, gated
from emqfast.worker.outcomes import (NULL_RESULT, Done, Outcome, awaitable_result,
                                     check_decodable, check_worker_args, failure, job_group,
                                     refuse_async_handler, success)
from emqfast.worker.handler_threads import HandlerThreads
from emqfast.worker.leases import SOLO, RunningJob, Solo
from emqfast.worker.outcomes import WorkerStats
from emqfast.worker.wake import MarkerWaiter
from emqfast.worker.cancel_listener import CancelListener, TimeoutTimer
from emqfast.worker.processes import ProcessPool, check_processes

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("emqfast.worker")

Handler = Callable[[Job], Any]

DEFAULT_BATCH = 256    # most jobs claimed per round trip, unless batch_size says otherwise
GATHER = 64       # outcomes in hand that are worth a write without gathering more...
GATHER_S = 0.001  # ...else gather for this long while more are coming
_tuple_new = tuple.__new__  # builds a NamedTuple in C: once per job on the drain path
SIGN_OFF_S = 1.0  # the heartbeat's sign-off, when the shutdown bound has passed already


class Worker(WorkerMachine):
    """Runs ``handler(job)`` for jobs of ``queue``.

    - ``queue``: a :class:`~emqfast.Queue`, or a list of them: one Worker serving them
      all, claiming by ``order`` (``"strict"``: the first queue with work ready;
      ``"weighted"``: a share per queue by ``weights``, one per queue; ``"rotate"``:
      in turn). A partitioned queue (``Queue(name, conn, partitions=P)``) is served
      over all its partitions in rotation, or over those listed in ``partitions``.
    - ``handler``: a plain function of the :class:`~emqfast.Job`; what it returns is
      the job's result.
    - ``concurrency`` (8): handler threads; with ``processes``, per process (default 1);
      ``lease_ms`` (30 s): each claimed job's lease;
      ``max_stalled`` (1): lease expiries a job survives before it fails as "stalled".
    - ``batch_size`` (``max(concurrency, 256)``): most jobs claimed per round trip;
      ``prefetch`` (None: sized from handler times; 0: off): claimed jobs waiting.
    - ``keep_completed`` (1000), ``keep_failed`` (10,000), ``max_age_ms`` (None):
      retention, applied as :meth:`Queue.trim <emqfast.Queue.trim>` on the Worker's beat.
    - ``shutdown_timeout_s`` (30 s): running handlers' time to finish after a stop.
    - ``name``: the Worker's name in Redis (default ``host:pid:random``).
    - ``allow_eviction`` (False): run on a server that may evict keys.
    - ``job_timeout_ms`` (None: none) and ``cancel_grace_ms`` (5 s): see below.
    - ``processes`` (None: handlers run in this process's threads): run handlers in that
      many supervised child processes instead (:mod:`emqfast.worker.processes`): a run
      past its timeout or cancel grace is killed, a crash fails only its own attempt, and
      the shutdown timeout is kept. The handler is imported in each child by its name (a
      module-level function; ``async def`` works too). ``max_jobs_per_child``,
      ``max_memory_per_child_mb`` (RSS, checked between jobs) recycle children. Each
      child is a fresh interpreter: nothing of the Worker's threads or locks is inherited.

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
    A server that stops answering cannot hold the exit: outcomes and hand-backs are
    tried until ``shutdown_timeout_s`` after the stop (plus at most one read deadline in
    flight), then :meth:`run` says what it could not write and returns; those jobs' leases
    lapse and the reaper re-runs them.

    Cancels and timeouts: ``q.cancel(id)`` on a job this Worker runs reaches it
    at once (a pub/sub listener thread; the beat re-reads the cancel marks in case a
    message was lost): ``job.cancelled`` turns True and ``job.raise_if_cancelled()``
    raises :class:`emqfast.Cancelled`; the job ends ``cancelled`` (never retried) however
    the handler ends. A job enqueued with ``timeout_ms`` (else ``job_timeout_ms``; None:
    no limit) is signalled the same way when its run passes it, and fails with
    :class:`emqfast.JobTimeout` (retried per its attempts/backoff). A handler still running
    ``cancel_grace_ms`` after either is abandoned: its outcome is written then (the lease
    ends), its late return is ignored, and its thread keeps its handler slot until it
    returns (a thread cannot be killed; see :mod:`emqfast.worker.cancels`). With
    ``processes``, its process is killed instead, and the shutdown timeout is a bound:
    handlers still running then are killed and their jobs go back to the queue, no attempt
    counted.
    """

    _led: Optional[ThreadCrew] = None  # a many-queue Worker's crew (see __init__)
    _ready: "deque[Tuple[Job, str]]"  # started, waiting for a handler thread
    _listener: Optional["CancelListener"]
    _timer: Optional["TimeoutTimer"]
    _lock: threading.Condition
    _pool: Optional[HandlerThreads]
    _acks: "queue_mod.SimpleQueue[Optional[Outcome]]"
    _ack_batcher: Any
    _drainers: int
    _awaiting: "set[int]"
    _ended: List[int]
    _free_slots: List[int]
    _handed: int
    _run_hooks: "ThreadRunHooks"

    def __init__(self, queue: Union[Queue, Sequence[Queue]], handler: Handler, *,
                 concurrency: Optional[int] = None,
                 lease_ms: int = 30_000, max_stalled: int = 1, batch_size: Optional[int] = None,
                 prefetch: Optional[int] = None,
                 keep_completed: int = 1000, keep_failed: int = 10_000,
                 max_age_ms: Optional[int] = None, shutdown_timeout_s: float = 30.0,
                 name: Optional[str] = None, allow_eviction: bool = False,
                 job_timeout_ms: Optional[int] = None,
                 cancel_grace_ms: int = DEFAULT_GRACE_MS,
                 order: Optional[str] = None, weights: Optional[Sequence[int]] = None,
                 processes: Optional[int] = None, max_jobs_per_child: Optional[int] = None,
                 max_memory_per_child_mb: Optional[int] = None,
                 partitions: Optional[Sequence[int]] = None):
        if getattr(queue, "is_partitioned", False):
            cast(Any, queue).check_layout()  # PartitionMismatch before serving a wrong layout
        queue, order = expand_partitioned(queue, partitions, order)
        children = check_processes(processes, concurrency, max_jobs_per_child,
                                   max_memory_per_child_mb)
        if processes is not None:
            concurrency = processes * (concurrency or 1)
        options: Dict[str, Any] = dict(
            concurrency=8 if concurrency is None else concurrency, lease_ms=lease_ms,
            max_stalled=max_stalled, batch_size=batch_size, prefetch=prefetch,
            keep_completed=keep_completed, keep_failed=keep_failed, max_age_ms=max_age_ms,
            shutdown_timeout_s=shutdown_timeout_s, name=name, allow_eviction=allow_eviction,
            job_timeout_ms=job_timeout_ms, cancel_grace_ms=cancel_grace_ms)
        if isinstance(queue, (list, tuple)):  # a Worker of this class per queue, one crew
            if children is not None:
                raise InvalidInput("processes= serves one queue: run a Worker per queue (of "
                                   "a partitioned queue: per partition, q.partition(i))")
            cls = type(self)
            self._led = ThreadCrew(lambda q, crew: cls._member(q, handler, crew, options),
                                  queue, order=order, weights=weights, name=name)
            self._lead(self._led)
            return
        self._init_queue(cast(Queue, queue), handler, SOLO, children=children, **options)

    @classmethod
    def _member(cls, queue: Queue, handler: Handler, crew: Solo,
                options: Dict[str, Any]) -> "Worker":
        """The Worker of one queue of a many-queue Worker (``crew``: what they share)."""
        member = cls.__new__(cls)
        member._init_queue(queue, handler, crew, **options)
        return member

    def _init_queue(self, queue: Queue, handler: Handler, crew: Solo, *,
                    job_timeout_ms: Optional[int], cancel_grace_ms: int,
                    children: Optional[Dict[str, Any]] = None, **options: Any) -> None:
        check_worker_args(queue, Queue, handler)  # typed: InputTypeError, a TypeError too
        self._procs: Optional[ProcessPool] = None
        if children is None:
            refuse_async_handler(handler)
        else:  # handlers in child processes; the threads run no handler
            self._procs = ProcessPool(self, handler, **children)
        self._setup_stops(job_timeout_ms, cancel_grace_ms)
        self._ended: List[int] = []  # per handler slot: runs ended (see _in_hand)
        self._setup(queue, handler, batch_floor=DEFAULT_BATCH, crew=crew, **options)
        if self._procs is not None:
            self._holding.floor = self.concurrency
        self._setup_slots()
        self._lock = threading.Condition()
        self._guard = self._lock
        self._acks: "queue_mod.SimpleQueue[Optional[Outcome]]" = queue_mod.SimpleQueue()
        self._ack_batcher: Any = None  # the acker thread's Batcher (hiredis under C)
        self._ack_reconnect = False  # a lost connection was met: make the Batcher anew
        self._stop = threading.Event()
        self._pool: Optional[HandlerThreads] = None
        self._acker: Optional[threading.Thread] = None
        self._setup_listening()

    # --- public control -------------------------------------------------------
    def run(self) -> WorkerStats:
        """Process jobs until :meth:`stop` or SIGTERM/SIGINT (graceful: jobs not begun are
        released, running handlers finish and their outcomes are written; see the class
        docstring for handlers still running after ``shutdown_timeout_s``). Raises
        :class:`~emqfast.errors.PermissionDenied` when Redis refuses the worker's commands
        for good, :class:`~emqfast.errors.EvictionRisk` on an evicting server."""
        if self._led is not None:  # every queue, a thread each (see ThreadCrew)
            return self._led.run()
        restore = signals.install(self.stop, self.name, worker=self)  # 2nd: force quit
        try:
            self._serve(until_idle=False, deadline=None, wait_scheduled=False)
        finally:
            restore()
            self._stop.clear()  # this stop was honoured: the Worker may run again
        return self.stats

    def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                       wait_scheduled: bool = False, wait_active: bool = False) -> WorkerStats:
        """Process jobs until nothing is pending, running or due, and return what this
        Worker did. What it leaves is logged:

        - jobs scheduled for later, **retries waiting out their backoff included** (a
          warning when this Worker retried jobs, else INFO): ``wait_scheduled=True`` waits
          for them too, running each as it comes due (a job due next year then holds it
          until ``timeout_s``);
        - jobs active under other workers' leases (INFO, with when the earliest lease
          ends): ``wait_active=True`` waits for them, and runs those whose worker died
          once their lease lapses (the beat reaps them).

        Raises ``TimeoutError`` if it takes longer than ``timeout_s``."""
        if self._led is not None:  # until every queue is idle at once (see ThreadCrew)
            return self._led.run_until_idle(timeout_s, wait_scheduled, wait_active)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._wait_active = wait_active
        try:
            self._serve(until_idle=True, deadline=deadline, wait_scheduled=wait_scheduled)
        finally:
            self._stop.clear()  # a stop requested meanwhile was honoured
        return self.stats

    def stop(self, timeout: Optional[float] = None) -> None:
        """Stop claiming; :meth:`run` returns once claimed jobs are released or finished
        (a running handler is never released while it may still finish: with
        ``processes``, it is killed after the shutdown timeout and its job released). A
        stop requested before :meth:`run` starts is honoured by it (run returns at once).
        ``timeout``: seconds the running handlers get, instead of ``shutdown_timeout_s``
        (which it replaces from then on)."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                    or not 0 <= timeout < float("inf"):
                raise InvalidInput(f"timeout must be seconds >= 0, not {timeout!r}")
            for member in self.members:
                member.shutdown_timeout_s = float(timeout)
        if self._led is not None:
            self._led.stop()
            return
        self._stopped_at = time.monotonic()
        # outcomes of a stopping worker are re-sent within its bound, then left to the
        # reaper: a partition cannot hold the exit (see _shutdown)
        self._ack_until = self._stopped_at + self.shutdown_timeout_s
        self._stop.set()
        waiter = self._waiter
        if waiter is not None:  # wake a claim loop blocked on the marker: no I/O here,
            waiter.interrupt()  # which a silent server would hold (a signal handler runs it)
        with self._lock:  # ...or one waiting for a handler slot
            self._lock.notify_all()

    def _serve(self, until_idle: bool, deadline: Optional[float], wait_scheduled: bool) -> None:
        shared = self._crew.shared()  # a many-queue Worker's one marker wait, if any
        if shared is not None:
            shared.markers.open()
            self._waiter = MemberMarkers(shared.markers, self._keys.marker)
        try:
            self._check_server()
            # _stop is NOT cleared here: a stop() requested before run() is honoured
            self._fatal = None
            if not self._stop.is_set():
                self._ack_until = None
            if self._procs is not None:
                self._procs.start()  # HandlerNotImportable before anything is claimed
            else:
                self._pool = self._crew.handler_threads(self)
            self._acker = threading.Thread(target=self._ack_loop, name="emq-acker",
                                           daemon=True)
            self._acker.start()
            self._start_listening()
            try:
                self._drive(self._serve_loop(until_idle, deadline, wait_scheduled))
            finally:
                self._shutdown()
        finally:
            if shared is not None:
                shared.markers.close()
        self._raise_fatal()

    def _connections_suspect(self) -> None:
        """The claim loop met a lost connection: the acker makes its Batcher anew before
        its next write, and the client's idle pooled connections are dropped (both went
        silent with it in a half-open blip; each would wait out its own read deadline)."""
        self._ack_reconnect = True
        backend.close_shared()  # the claim loop's own C connections (this thread's)
        pool = getattr(self._redis, "connection_pool", None)
        if pool is not None:
            try:
                pool.disconnect(inuse_connections=False)
            except Exception:  # noqa: BLE001 - best effort: a dead one still has a deadline
                pass

    def _check_server(self) -> None:
        """Refuse a server that may evict jobs (unless ``allow_eviction``); a many-queue
        Worker's queues on one client check it once for all."""
        if not self.allow_eviction:
            shared = self._crew.shared()
            self._refuse_eviction(eviction.check(self._redis) if shared is None
                                  else shared.eviction(self._redis))

    # --- performing the machine's requests -------------------------------------------
    def _drive(self, logic: Logic) -> Any:
        """Run a piece of the machine's logic: Redis requests over the Worker's client (bulk
        ones through the live backend's Batcher), waits by :meth:`perform`. A many-queue
        Worker's queues on one client pass their requests through its gate."""
        shared = self._crew.shared()
        if shared is not None:
            logic = gated(logic, shared.gate)
        return run(self._redis, logic, batcher=self._batcher, waits=self)

    def _batcher(self) -> Any:
        return self._ack_batcher if self._ack_batcher is not None else \
            self.queue._live_batcher()

    def perform(self, request: Wait) -> Any:
        """Perform one of the machine's waits, blocking."""
        return self._waits[type(request)](self, request)

    def _stop_requested(self) -> bool:
        return self._stop.is_set()

    def _wake(self) -> None:
        self._lock.notify_all()

    def _do_sleep(self, effect: Sleep) -> None:
        (self._stop.wait if effect.wake_on_stop else time.sleep)(effect.seconds)

    def _do_hook(self, effect: Hook) -> Any:
        return effect.fn()

    def _do_wait_for_room(self, effect: WaitForRoom) -> Tuple[int, int]:
        """``(free handler slots, jobs this worker may claim)``: the claim room is its
        capacity minus the jobs it holds (started or not). With neither a slot for a held
        job nor room to claim, wait for a handler to return or an outcome to be written.
        The crew answers for a many-queue Worker: its queues share the slots."""
        crew = self._crew
        with self._lock:
            # set before the slots are read: a handler ending after that read sees it and
            # notifies (under the lock, so only once this waits)
            self._awaiting.add(self._index)
            try:
                slots, room = crew.room(self)
                if crew.waits_for_room(self, slots, room):
                    self._lock.wait(effect.seconds)
                    slots, room = crew.room(self)
            finally:
                self._awaiting.discard(self._index)
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
        stopped = self._stop.is_set()
        end = (self._stopped_at if stopped else time.monotonic()) + self.shutdown_timeout_s
        # claimed but not started yet: hand back now instead of running
        self._within(end, "handing back claimed jobs", lambda: (
            self._drive(self._settle(end)),
            self._drive(self._releasing(self._take_held(), end))))
        if self._waiter is not None:
            self._waiter.close()
            self._waiter = None
        self._wait_for_handlers(end)
        self._stop_listening()  # before the acker's sentinel: an abandoned run's outcome
        self._acks.put(None)
        if self._acker is not None:
            self._acker.join(timeout=max(end - time.monotonic(), 1.0))
            if self._acker.is_alive():
                log.warning("%s: outcomes still unwritten at shutdown_timeout_s=%s (Redis "
                            "unreachable?): their leases will lapse and the reaper will "
                            "re-run those jobs", self._who, self.shutdown_timeout_s)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._procs is not None:
            self._procs.close()
        # gone from the Workers page now, not when it expires
        self._within(max(end, time.monotonic() + SIGN_OFF_S), "signing off",
                     self._heartbeat.sign_off)

    def _within(self, end: float, what: str, step: Callable[[], Any]) -> None:
        """Run a shutdown ``step`` that does I/O, returning by ``end`` (monotonic s): a step
        a silent server holds past it is left to end (its reads have deadlines) in a
        daemon thread of its own, and its jobs' leases lapse (the reaper re-runs them).
        An error it raised in time is raised here."""
        raised: List[BaseException] = []

        def run_step() -> None:
            try:
                step()
            except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                raised.append(exc)

        thread = threading.Thread(target=run_step, name="emq-shutdown", daemon=True)
        thread.start()
        thread.join(max(end - time.monotonic(), 0.0))
        if thread.is_alive():
            log.warning("%s: %s did not finish within shutdown_timeout_s=%s (Redis "
                        "unreachable?); exiting without it", self._who, what,
                        self.shutdown_timeout_s)
        elif raised:
            raise raised[0]

    def _wait_for_handlers(self, end: float) -> None:
        """Until every running handler has returned and its outcome is written, renewing
        their leases (the claim loop's beat has stopped); warn once ``end`` has passed."""
        warned = False
        next_beat = time.monotonic() + self.beat_s
        renewing: Optional[threading.Thread] = None
        # a 2nd signal: hand back, stop waiting (handler processes: killed first)
        while not (getattr(self, "_force_quit", False) and self._procs is None
                   and signals.abandon_if_forced(self)):
            if self._procs is not None and self._kill_children_if_due(end):
                end = min(end, time.monotonic())  # (no warning about keeping leases)
                warned = True
            with self._lock:
                if not self._running and self._pending_acks == 0:
                    break
                if self._pending_acks == 0 and all(r.lost for r in self._running.values()):
                    break  # only jobs whose lease is gone: nothing of ours to write
                if time.monotonic() >= end and self._handlers_running() == 0:
                    break  # only outcome writes are left: the acker's own bound ends them
                if not warned and time.monotonic() >= end and self._running:
                    warned = True
                    log.warning("worker %s: %d handler(s) still running after "
                                "shutdown_timeout_s=%s (jobs %s); not releasing them (they may "
                                "still finish): keeping their leases until they return (with processes=N, "
                                "or emqfast worker --processes N, they are killed instead)",
                                self.name, len(self._running), self.shutdown_timeout_s,
                                ", ".join(map(repr, sorted(self._running)[:10])))
                self._lock.wait(0.05)
            if time.monotonic() >= next_beat and (renewing is None or not renewing.is_alive()):
                # in a thread of its own: a silent server must not hold this wait
                next_beat = time.monotonic() + self.beat_s
                renewing = threading.Thread(target=self._renew_while_stopping, daemon=True,
                                            name="emq-renew")
                renewing.start()

    def _kill_children_if_due(self, end: float) -> bool:
        """Handler processes: once ``end`` passed (or at a second signal), kill the
        children still running handlers; their readers hand the jobs back (no attempt
        counted) once each child is gone. True when it killed (once per stop)."""
        assert self._procs is not None
        forced = getattr(self, "_force_quit", False)
        if (time.monotonic() < end and not forced) or self._procs.killing:
            return False
        self._procs.killing = True
        killed = self._procs.kill_running("shutdown")
        if killed:
            log.warning("worker %s: %s; killed %d handler process(es) still running (jobs "
                        "%s): their jobs go back to the queue, no attempt counted", self.name,
                        "second signal" if forced else
                        f"shutdown_timeout_s={self.shutdown_timeout_s} passed", killed,
                        ", ".join(map(repr, sorted(self._running)[:10])))
        return True

    def _handlers_running(self) -> int:
        """Handlers that have not returned, less the abandoned ones (their outcome is
        written; their threads may never return). Under the lock."""
        return self._in_hand - sum(1 for stop in self._stops.values() if stop.settled)

    def _renew_while_stopping(self) -> None:
        """Renew the leases of handlers still running while the Worker stops."""
        try:  # transient faults: logged, the next beat tries again
            self._drive(self._renew_on_beat(time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - permanent: the lease will lapse
            log.error("worker %s: cannot extend leases while stopping (%s)", self.name, exc)

    # --- handler slots ------------------------------------------------------------------


    def _setup_slots(self) -> None:
        """The handler-slot state (after the machine's setup: needs ``concurrency``)."""
        self._ready = deque()  # claimed, waiting for a handler thread
        self._run_hooks = ThreadRunHooks(self)  # each running job's Job._run
        self._drainers = 0  # handler-pool tasks currently taking jobs from _ready
        # whose claim loop waits for a handler to return (a crew's: any of its queues')
        self._awaiting: "set[int]" = set()
        self._ended = [0] * self.concurrency
        self._free_slots = list(range(self.concurrency))  # slot indexes of no drainer

    @property
    def _in_hand(self) -> int:
        """Started jobs whose handler has not returned: handed out, less the runs the
        handler slots ended. Each slot counts its own (one writer per list item), so a
        handler thread ends a run without taking the lock."""
        return self._handed - sum(self._ended)

    @_in_hand.setter
    def _in_hand(self, value: int) -> None:  # the machine's setup: 0
        self._handed = value + sum(self._ended)

    def _hand_out(self, started: List[Tuple[Job, str]]) -> None:
        """Queue started jobs for the handler pool, starting only the missing drainers."""
        now = time.monotonic()
        hooks = self._run_hooks
        for job, token in started:  # no per-job callables: cheaper per job
            job._run, job._run_token = hooks, token
        lease = self._started_lease
        runs = {job.id: lease(job, token, now) for job, token in started}
        with self._lock:
            self._running.update(runs)
            self._stop_early(started)  # cancelled while held: stopped before a handler sees it
            self._handed += len(started)
            self._ready.extend(started)
            if self._procs is not None:
                spawn = 0
            else:                # Handler tasks take jobs from _ready until it is empty; start only the
                # missing ones, so at most `concurrency` handlers ever run at once.
                spawn = min(self.concurrency - self._drainers, len(self._ready))
            self._drainers += spawn
            slots = [self._free_slots.pop() for _ in range(spawn)]
        if self._procs is not None:
            self._procs.dispatch()
            return
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
        timed = self.job_timeout_ms is not None
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
            if timed or job.extra:  # its timeout counts from its handler's start
                self._arm_timeout(job, token, time.monotonic())
            started = clock()
            outcome: Optional[Outcome] = self._run_one(job, token)
            ended = clock()
            if self._stops:  # a stopped run ends by its stop (None: abandoned, written already)
                outcome = self._settle_run(outcome)  # type: ignore[arg-type]
            if outcome is not None:
                ack(outcome)  # at once: the next handler may run for hours
            ends[slot] += 1  # a handler slot is free: the claim loop may start a held job
            if self._awaiting:
                with lock:
                    lock.notify_all()
            observe(ended - started)

    def _run_one(self, job: Job, token: str) -> Outcome:
        """Run the handler; the outcome the acker writes."""
        try:
            if job._stop_reason is not None:  # stopped before it began: never handed to it
                job.raise_if_cancelled()
            if job._undecodable is not None:  # fails for good, its handler never runs
                check_decodable(job)
            result = self.handler(job)
        except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
            return failure(job, token, exc, traceback.format_exc())
        if result is None:  # the common case first: no awaitable, nothing to encode
            return _tuple_new(Done, (job, token, NULL_RESULT))  # Done(...) without its frame
        if inspect.isawaitable(result):  # e.g. a lambda calling an async def: no work done
            return awaitable_result(job, token, result)
        try:
            return success(job, token, result)
        except BaseException as exc:  # noqa: BLE001 - an unserialisable result fails the job
            return failure(job, token, exc, traceback.format_exc())

    # --- handler processes (processes=N): what their readers call --------------------
    def _process_run_ended(self, index: int, outcome: Outcome, seconds: float,
                           free: bool = True) -> None:
        """A run in child ``index`` ended (its handler returned or raised, or its child
        died): its outcome to the acker, and its slot free (``free``; a dead child's
        slots come back when its replacement runs: :meth:`_slots_free`)."""
        if self._stops:  # a stopped run ends by its stop
            settled = self._settle_run(outcome)
            if settled is None:
                settled = outcome  # (abandoning is for threads: a child is killed instead)
            outcome = settled
        self._acks.put(outcome)
        self._holding.observe(seconds)
        if free:
            self._slots_free(index, 1)

    def _slots_free(self, index: int, n: int) -> None:
        """``n`` runs of child ``index`` ended. Under the lock: a replaced child's reader
        counts its last runs while its successor's reader counts new ones (two writers of
        ``_ended[index]``; a lost addition would keep a slot taken for ever)."""
        with self._lock:
            self._ended[index] += n
            if self._awaiting:  # a claim loop waits for a slot (see _drain_ready)
                self._lock.notify_all()

    def _release_runs(self, index: int, held: List[Tuple[str, str, Optional[str]]]) -> None:
        """Jobs of a killed child that must run again (shutdown, or beside a killed run):
        back to the queue, their attempt not counted."""
        try:
            run(self._redis, self._releasing(held, time.monotonic() + self.shutdown_timeout_s))
        finally:
            with self._lock:  # (see _slots_free)
                self._ended[index] += len(held)
                self._lock.notify_all()

    def _fail_fatally(self, error: BaseException) -> None:
        """Stop the Worker; :meth:`run` raises ``error``."""
        if self._fatal is None:
            self._fatal = error
        self.stop()

    def _children_report(self) -> Optional[Dict[str, Any]]:
        """The handler processes, for the heartbeat record (None: handlers in threads)."""
        return None if self._procs is None else self._procs.report()

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

    # --- the acker thread ---------------------------------------------------------------


    def _ack_loop(self) -> None:
        """The acker thread: write batches of queued outcomes until the None sentinel."""
        try:
            while True:
                batch = self._next_ack_batch()
                if batch is None:
                    return
                try:
                    if self._ack_reconnect:
                        self._ack_reconnect = False
                        stale, self._ack_batcher = self._ack_batcher, None
                        if stale is not None:
                            stale.close()
                        backend.close_shared()  # this thread's C connections: dial anew
                    if self._ack_batcher is None:  # the live backend's pipeline
                        self._ack_batcher = backend.batcher_for(self._redis)
                    self._ack_outcomes(batch)
                except Exception as exc:  # noqa: BLE001 - the acker must outlive any one batch
                    self._ack_failed(batch, exc)
        finally:
            batcher, self._ack_batcher = self._ack_batcher, None
            if batcher is not None:
                batcher.close()

    def _next_ack_batch(self) -> Optional[List[Outcome]]:
        """The next batch (up to ``ACK_BATCH`` queued outcomes), counted as pending and
        its leases no longer renewed; None: stop."""
        first = self._acks.get()
        if first is None:
            return None
        batch = [first]
        stop = self._take_queued(batch)
        if not stop and len(batch) < GATHER and self._more_coming(len(batch)):
            time.sleep(GATHER_S)  # not a blocking get: a put wakes no one meanwhile
            stop = self._take_queued(batch)
        if stop:
            self._acks.put(None)  # finish this batch, then exit
        with self._guard:
            self._pending_acks += len(batch)
            self._mark_acking(batch)
        return batch

    def _take_queued(self, batch: List[Outcome]) -> bool:
        """Add the outcomes queued now to ``batch`` (up to ``ACK_BATCH``); True when the
        shutdown's sentinel was met."""
        get = self._acks.get_nowait
        while len(batch) < ACK_BATCH:
            try:
                item = get()
            except queue_mod.Empty:
                return False
            if item is None:
                return True
            batch.append(item)
        return False

    def _more_coming(self, in_batch: int) -> bool:
        """More outcomes are due soon: jobs wait for a handler, or more handlers run than
        outcomes are in this batch (an estimate read without the lock)."""
        return bool(self._ready) or self._in_hand > in_batch

    def _ack_outcomes(self, batch: List[Outcome]) -> None:
        """Write a batch (``batcher``: the acker's), then its run times."""
        replies = self._drive(self._write_batch(batch))
        self._drive(self._write_run_times(batch, replies))

    # --- stopping running jobs ---------------------------------------------------------


    def _setup_listening(self) -> None:
        self._listener = None
        self._timer = None

    def _start_listening(self) -> None:
        """At the start of a run: the timer, and the listener thread subscribing."""
        self._timer = TimeoutTimer(self._on_due)
        shared = self._crew.shared()
        if shared is not None:  # a many-queue Worker's one listener of every queue
            self._listener = shared.listener_open(CancelListener)
            return
        self._listener = CancelListener(self._redis,
                                        {c: self._on_cancel for c in self._cancel_channels()},
                                        lambda: self._drive(self._recheck_cancels()),
                                        self._who)
        self._listener.start()

    def _stop_listening(self) -> None:
        """At the end of a run, once no handler of ours is left to stop."""
        listener, self._listener = self._listener, None
        shared = self._crew.shared()
        if shared is not None:
            shared.listener_close()  # the last queue's closes it
        elif listener is not None:
            listener.close()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.close()

    def _cancel_channels(self) -> List[str]:
        """The pub/sub channels the cancels of this Worker's jobs are published on."""
        return [self._keys.cancel_channel]

    def _arm_timeout(self, job: Job, token: str, now: float) -> None:
        """A job handed to a handler: stop it when its timeout passes (if it has one)."""
        limit = timeout_ms_of(job, self.job_timeout_ms)
        if limit and self._timer is not None:
            self._timer.add(now + limit / 1000.0, job.id, token, TIMEOUT)

    def _on_due(self, job_id: str, token: str, kind: str) -> None:
        """A deadline passed (timer thread): a run's timeout, or a stop's grace."""
        if kind == TIMEOUT:
            self._stopped(self._stop_run(job_id, TIMEOUT, token))
        elif kind == ABANDON and self._procs is not None:
            stop = self._stops.get(token)
            timer = self._timer
            if stop is not None and self._procs.kill_for(job_id, token, stop.reason) is None \
                    and timer is not None:  # not begun: looked at again after a grace (a
                # handler thread may have taken it just before the stop reached the child)
                timer.add(time.monotonic() + self.cancel_grace_ms / 1000.0, job_id, token,
                          ABANDON)
        elif kind == ABANDON:
            outcome = self._abandon_run(job_id, token)
            if outcome is not None:
                self._hand_over([outcome])

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """A run was asked to stop (its handler sees ``job.cancelled``): abandon it if it
        has not ended within the grace."""
        timer = self._timer
        if run is not None and self._procs is not None:
            self._procs.ask_stop(run.job.id, run.token, run.job._stop_reason or "")
        if run is not None and timer is not None:
            timer.add(time.monotonic() + self.cancel_grace_ms / 1000.0, run.job.id,
                      run.token, ABANDON)


class ThreadRunHooks:
    """``Job._run`` of the jobs a thread Worker runs (:class:`emqfast.facade.job.RunHooks`):
    ``job.extend_lease`` and ``job.progress`` reach the Worker with the run's token."""

    __slots__ = ("_worker",)
    is_async = False  # extend_lease_async / progress_async are the aio Worker's

    def __init__(self, worker: Worker):
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
