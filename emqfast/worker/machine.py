"""The worker state machine: one claim loop for both Workers, without I/O.

:class:`WorkerMachine` holds a Worker's state and its logic as sans-IO generators that
yield :mod:`emqfast.core.ops` requests (script calls, commands, pipelines) and waits
(``Sleep``, ``WaitForRoom``, ``WaitDrained``, ``PopMarker``, ``Hook``): claim under leases
(re-sent with the same request id after a lost reply), start the claimed jobs, promote due
delayed jobs, block on the wake marker until work is ready, the beat
(:mod:`emqfast.worker.leases`), and writing outcomes (:mod:`emqfast.worker.acking`). The
facade's own operations (promote, reap, trim, the schedule sweep, the dependency settle)
are composed with ``yield from``, so a test can script every I/O the machine does. A
driver subclasses it and supplies only what differs between threads and asyncio:

- ``_drive(logic)``: run a generator with :func:`emqfast.backends.drive.run` (threads) or
  ``run_async`` (asyncio), its waits performed by the driver's ``perform``;
- ``_hand_out(started)``: run the started ``(job, token)`` pairs' handlers, and
  ``_take_held(peek)``: take back those whose handler has not begun (a paused queue);
- ``_guard`` (a context manager around shared state) and ``_notify()`` (a job ended or
  an outcome was written: wake the claim loop);
- ``_stop_requested()`` and ``stop()``.
"""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from itertools import islice
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from emqfast.core.errors import EvictionRisk
from emqfast.core.validation import check_int
from emqfast.facade import tracing
from emqfast.core.ops import Cmd, Logic, PopMarker, WaitDrained, WaitForRoom
from emqfast.facade.queue import Queue
from emqfast.worker import calls as core
from emqfast.worker.acking import Acking
from emqfast.worker.heartbeat import Heartbeat
from emqfast.worker.leases import LeaseKeeping
from emqfast.worker.outbox import DependencyStep
from emqfast.worker.outcomes import job_group
from emqfast.worker.prefetch import Prefetch
from emqfast.worker.resend import Backoff, typed, until_done, wait_out
from emqfast.worker.calls import JobRows
from emqfast.worker.stats import HeldLease, RunningJob, WorkerStats

log = logging.getLogger("emqfast.worker")


class WorkerMachine(LeaseKeeping, Acking):
    """State and logic shared by :class:`emqfast.Worker` and :class:`emqfast.aio.Worker`."""

    _label = "worker"  # how log lines name this kind of worker (the logger says "emqfast")

    def __new__(cls, queue: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``Worker([q_high, q_low], handler, order="strict"|"weighted", weights=[...])``: a
        worker serving several queues (:mod:`emqfast.worker.many`); one queue: this class."""
        if isinstance(queue, (list, tuple)):
            from emqfast.worker.many_runs import serve_many
            return serve_many(cls, queue, *args, **kwargs)
        return super().__new__(cls)

    def _setup(self, queue: Any, handler: Callable[..., Any], *, concurrency: int,
               lease_ms: int, max_stalled: int, batch_size: Optional[int], batch_floor: int,
               keep_completed: int, keep_failed: int, max_age_ms: Optional[int],
               shutdown_timeout_s: float, name: Optional[str], allow_eviction: bool,
               prefetch: Optional[int] = None) -> None:
        """Check the settings and set up the state (the drivers' constructors call this).
        ``batch_size`` defaults to ``max(concurrency, batch_floor)``."""
        self.queue = queue
        self.handler = tracing.traced(handler, queue.name)  # itself unless otel is installed
        self.concurrency = check_int(concurrency, "concurrency", 1, 10_000)
        self.lease_ms = check_int(lease_ms, "lease_ms", 50, 1 << 40)
        self.max_stalled = check_int(max_stalled, "max_stalled", 0, 1_000_000)
        self.prefetch = None if prefetch is None else check_int(prefetch, "prefetch", 0, 100_000)
        self._holding = Prefetch(self.concurrency, self.prefetch)
        self._in_hand = 0  # started jobs whose handler has not returned (slots in use)
        self.batch_size = check_int(batch_size or max(self.concurrency, batch_floor),
                                    "batch_size", 1, 10_000)
        self.keep_completed, self.keep_failed, self.max_age_ms = keep_completed, keep_failed, max_age_ms
        self.shutdown_timeout_s = shutdown_timeout_s
        self.allow_eviction = allow_eviction
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._who = f"{self._label} {self.name}"
        self.stats = WorkerStats()
        self.beat_s = min(1.0, self.lease_ms / 4000.0)
        # claim request ids: unique per Worker object (two workers may share a name)
        self._claim_prefix = uuid.uuid4().hex[:8]
        self._claim_seq = 0
        self._fatal: Optional[BaseException] = None  # a permanent error met by the acker
        self._stopped_at = 0.0  # monotonic s of the last stop()
        self._ack_until: Optional[float] = None  # stopping: re-send outcomes until then
        self._keys = queue.keys
        self._redis = queue.redis
        self._rows = JobRows(queue.name)
        self._running: Dict[str, RunningJob] = {}
        self._pending_acks = 0  # outcomes (or releases) handed to the acker, not written yet
        self._groups: List[str] = []  # ready groups named by the last claim
        self._due_hint: Optional[float] = None  # server ms the current wait's run-at is due
        self._next_beat = 0.0
        self._next_trim = 0.0
        self._server_offset_ms = 0.0  # server clock - local monotonic, from claim replies
        # server ms of the earliest schedule run (from the last pump, or a marker
        # popped since); None = nothing known, pump on the beat only
        self._next_schedule_ms: Optional[float] = None
        self._waiter: Any = None  # the driver's MarkerWaiter, made on the first wait
        # a claim sent whose reply was not read yet, and jobs claimed but not started
        # (prefetched: start.lua runs only when a handler slot is free, so a paused queue
        # starts none of them): what a pause or the shutdown hands back (see _settle)
        self._claiming: Any = None
        self._held: Dict[str, HeldLease] = {}  # job id -> lease, in claim order
        self._held_groups: Set[str] = set()  # the groups the claims of held jobs served
        self._heartbeat = Heartbeat(self)  # the Workers page; signed off at the shutdown
        self._deps = DependencyStep(self)  # settles dependencies on the beat and after acks
        # callables run on every beat after the Worker's own steps (an awaitable one is
        # awaited under asyncio): extensions and tests hook in here
        self.beat_hooks: List[Callable[[], Any]] = []
        self._wait_active = False  # run_until_idle(wait_active=True)

    # --- state ----------------------------------------------------------------------------
    def _should_stop(self) -> bool:
        """The claim loop ends (the asyncio driver adds a cancelled run())."""
        return self._stop_requested()

    def _stop_overdue(self) -> bool:
        """Stopping for longer than ``shutdown_timeout_s``: stop re-sending."""
        return self._stop_requested() and \
            time.monotonic() - self._stopped_at > self.shutdown_timeout_s

    def _room(self) -> Tuple[int, int]:
        """``(free handler slots, jobs this worker may claim now)``. Started jobs may queue
        for a slot only as long as the prefetch budget (~2 ms): held jobs beyond that stay
        unstarted. The claim room is the capacity minus every job held, started or not."""
        slots = max(self.concurrency + self._holding.ahead() - self._in_hand, 0)
        room = self._holding.capacity() - len(self._running) - len(self._held)
        return slots, max(room, 0)

    def _waits_for_room(self, slots: int, room: int) -> bool:
        """Neither a slot for a held job nor room to claim: wait for a change."""
        return room <= 0 and not (slots and self._held)

    def _idle(self) -> bool:
        with self._guard:
            return not self._running and self._pending_acks == 0 and not self._held

    def _server_now_ms(self) -> float:
        return time.monotonic() * 1000 + self._server_offset_ms

    def _refuse_eviction(self, warning: Optional[str]) -> None:
        """Refuse a server that may evict jobs (its check's ``warning``)."""
        if warning:
            raise EvictionRisk(warning)

    def _raise_fatal(self) -> None:
        """After the shutdown: raise the permanent error the acker met, if any."""
        if self._fatal is not None:
            raise self._fatal

    def _write_batch(self, batch: List[Any]) -> Logic:
        """Acking's, then release the jobs that waited on these (issue 15); not idle until
        then, so run_until_idle sees the jobs it releases."""
        with self._guard:
            self._pending_acks += 1
        try:
            replies = yield from super()._write_batch(batch)
            yield from self._deps.after_acks()
        finally:
            with self._guard:
                self._pending_acks -= 1
                self._notify()
        return replies

    # --- the claim loop -----------------------------------------------------------------
    def _serve_loop(self, until_idle: bool, deadline: Optional[float],
                    wait_scheduled: bool) -> Logic:
        """Turn until stopped, or (``until_idle``) until nothing is left; transient faults
        are waited out with backoff, permanent ones raised typed."""
        backoff = Backoff()
        while not self._should_stop():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"worker on {self.queue.name!r} not idle in time")
            try:
                if (yield from self._turn(until_idle, wait_scheduled)):
                    return
                backoff.reset()
            except Exception as exc:  # noqa: BLE001 - sorted by wait_out
                yield from wait_out(exc, backoff, self._who)

    def _turn(self, until_idle: bool, wait_scheduled: bool) -> Logic:
        """One turn of the loop; True when ``until_idle`` is satisfied."""
        yield from self._beat_if_due()
        if self._next_schedule_ms is not None and self._server_now_ms() >= self._next_schedule_ms:
            yield from self._pump_schedules()
        if self._due_hint is not None and self._server_now_ms() >= self._due_hint:
            # woken at a delayed job's run-at: promote before claiming (saves a round trip)
            self._due_hint = None
            yield from Queue.promote.op(self.queue, limit=core.PROMOTE_BATCH)
        slots, room = yield WaitForRoom(self.beat_s)
        if slots and self._held:  # a handler slot is free: start a job we hold
            yield from self._start_held(slots)
            return False
        if room <= 0:
            return False
        # Idleness must be judged from before the claim: an outcome written after
        # it (a retry re-parked on the delayed set) is not in this claim's reply.
        idle_before_claim = self._idle()
        reply = yield from self._claim(min(room, self.batch_size))
        if reply is None:
            return False
        now, status, next_due, pairs = core.parse_claim(reply)
        served, self._groups = self._groups, core.claim_groups(reply)  # lanes for next turn
        self._hold(pairs, served)
        if status == core.CLAIM_PAUSED:
            yield from self._release_held()
        self._server_offset_ms = now - time.monotonic() * 1000
        # a due delayed job (or retry) is promoted now, backlog or not: it must not wait
        # for an empty claim (one bounded promote; the next claim can take it)
        promoted = core.due_now(status, next_due, now) and \
            (yield from Queue.promote.op(self.queue, limit=core.PROMOTE_BATCH)) > 0
        if pairs:
            yield from self._start_held(slots)
            return False
        if promoted:
            return False
        if idle_before_claim and core.idle(until_idle, wait_scheduled, status, next_due, now):
            if not (yield from self._wait_for_others(now)):
                return True
        yield from self._wait_for_work(until_idle, now, status, next_due)
        return False

    def _wait_for_others(self, now: int) -> Logic:
        """Idle here, but jobs may be active under other workers' leases (a worker that
        died leaves its jobs there until their leases lapse and the reaper, on the beat,
        hands them back). True: wait for them (``wait_active``); else log what is left."""
        active = yield Cmd.of("ZCARD", self._keys.active)
        if not active:
            return False
        if self._wait_active:
            return True
        head = yield Cmd.of("ZRANGE", self._keys.active, 0, 0, "WITHSCORES", withscores=True)
        ends_in = max((head[0][1] - now) / 1000, 0.0) if head else 0.0
        log.info("%s: queue %s is idle here; leaving %d job(s) active under other workers' "
                 "leases (the earliest lease ends in %.1f s; a job whose worker died is "
                 "reaped and re-run then: wait_active=True / --wait-active waits for it)",
                 self._who, self.queue.name, active, ends_in)
        return False

    def _claim(self, n: int) -> Logic:
        """claim.lua for up to ``n`` jobs; None when stopping outran the re-sends. A lost
        reply is re-sent with the same request id: the leases come back, no more jobs are
        popped (even when stopping, for up to shutdown_timeout_s, so they are released
        rather than left to expire as stalls)."""
        self._claim_seq += 1
        claim = core.claim_call(self._keys, n, self.lease_ms, self.name, self._groups,
                                f"{self._claim_prefix}:{self._claim_seq}")
        self._claiming = claim
        return (yield from until_done(claim, "claim", self._who, self._stop_overdue))

    def _wait_for_work(self, until_idle: bool, now: int, status: int, next_due: int) -> Logic:
        """After an empty claim: wait until the beat, a run-at, a rate window's opening or
        the next schedule run, or until new work wakes the marker."""
        wait_ms, hint = core.wait_plan(self.beat_s, now, status, next_due, self._next_schedule_ms)
        if hint is not None:
            self._due_hint = hint
        # draining: what ends this wait is our own outcomes being written, not the marker,
        # which would hold us a beat
        if until_idle and status == 1 and (yield WaitDrained(wait_ms / 1000)):
            return
        yield from self._block_on_marker(wait_ms)

    def _block_on_marker(self, wait_ms: float) -> Logic:
        """Sleep on the wake marker until work is ready or ``wait_ms`` passes.

        A popped marker scored in the future (a delayed job's or schedule's run-at) only
        shortens the wait; one scored now or earlier ends it. The end is kept to the
        millisecond by the driver's MarkerWaiter (Redis fires blocking timeouts on its hz
        tick, up to 100 ms late) while new work still wakes the worker at once.
        """
        end = time.monotonic() + wait_ms / 1000
        while not self._stop_requested():
            remaining = end - time.monotonic()
            if remaining <= 0.0005:
                return
            popped = yield PopMarker(self._keys.marker, remaining)
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

    # --- pause --------------------------------------------------------------------------
    def _check_paused(self) -> Logic:
        """On the beat, while jobs wait for a handler slot: a claim loop whose slots are all
        busy does not claim, so it asks whether the queue was paused meanwhile."""
        if (self._held or self._take_held(peek=True)) and (yield from Queue.is_paused.op(self.queue)):
            yield from self._release_held()

    def _release_held(self) -> Logic:
        """The queue is paused: the jobs we hold go back instead of waiting for a slot.
        Held jobs were never started (start.lua, which a pause fences, runs only into a
        free slot), so none begins after pause() returned; the few started in the instant
        before it and not yet picked up by a handler are released too. Running handlers
        finish."""
        if not self._held and not self._take_held(peek=True):
            return
        log.info("%s: queue %s paused; handing back %d held jobs", self._who,
                 self.queue.name, len(self._held))
        until = time.monotonic() + max(self.shutdown_timeout_s, 5.0)
        yield from self._settle(until)
        yield from self._releasing(self._take_held(), until)

    # --- shutdown -----------------------------------------------------------------------
    def _settle(self, until: float) -> Logic:
        """Hand back jobs leased to this worker that no handler got: a claim or start cut
        short (the asyncio run() task cancelled mid-call, a permanent error). Both are safe
        to re-send with the same arguments (the claim by its request id, start by the
        token: each returns what its first send did); the jobs are then released instead
        of waiting out their leases. Tried until ``until`` (monotonic s), then logged."""
        try:
            held = yield from self._unclaimed(lambda: time.monotonic() > until)
            if held:
                yield from self._releasing(held, until)
        except Exception as exc:  # noqa: BLE001 - their leases expire; the reaper re-runs them
            log.warning("%s: could not hand back claimed jobs (%s); the reaper will",
                        self._who, typed(exc))

    def _unclaimed(self, give_up: Callable[[], bool]) -> Logic:
        """``(id, token, group)`` of the jobs claimed by us and not handed to a handler: held
        ones and those of a cut-short claim or start. Each is started first (a paused queue's
        start parks it on the delayed set instead: no longer ours) to learn its group."""
        claim, self._claiming = self._claiming, None
        if claim is not None:
            reply = yield from until_done(claim, "claim", self._who, give_up)
            if reply is not None:
                self._hold(core.parse_claim(reply)[3], [])
        with self._guard:
            pairs = [(h.job_id, h.token) for h in self._held.values()]
            self._held.clear()
            self._held_groups.clear()
        held: List[Tuple[str, str, Optional[str]]] = []
        for at in range(0, len(pairs), core.START_CHUNK):
            chunk = pairs[at:at + core.START_CHUNK]
            rows = yield from until_done(core.start_call(self._keys, chunk), "start",
                                         self._who, give_up)
            if rows is not None:  # a job whose lease is gone has an empty row: not ours
                held += [(job.id, token, job_group(job))
                         for job, token in core.started_jobs(self._rows, chunk, rows)]
        return held

    # --- starting jobs ------------------------------------------------------------------
    def _hold(self, pairs: Sequence[Tuple[str, str]], served: Sequence[str]) -> None:
        """Claimed jobs join those held until a handler slot frees (their leases renewed on
        the beat like running ones)."""
        now = time.monotonic()
        with self._guard:
            self._claiming = None
            self.stats.claimed += len(pairs)
            for job_id, token in pairs:
                self._held[job_id] = HeldLease(job_id, token, now)
            if pairs:
                self._held_groups.update(served)

    def _start_held(self, slots: int) -> Logic:
        """Start up to ``slots`` held jobs, oldest first (a handler slot is free for each, so
        each begins at once), in calls of at most ``START_CHUNK`` (bounded work per call)."""
        while slots > 0 and self._held:
            with self._guard:
                chunk = list(islice(self._held.values(), min(slots, core.START_CHUNK)))
                groups = sorted(self._held_groups)
            yield from self._start_chunk([(h.job_id, h.token) for h in chunk], groups)
            with self._guard:  # handed out (or no longer ours)
                for h in chunk:
                    self._held.pop(h.job_id, None)
                if not self._held:
                    self._held_groups.clear()
            slots -= len(chunk)

    def _start_chunk(self, pairs: Sequence[Tuple[str, str]], groups: List[str]) -> Logic:
        start = core.start_call(self._keys, pairs, groups)
        # re-sent after a lost reply: a job already started by its token is not counted twice
        rows = yield from until_done(start, "start", self._who, self._stop_overdue)
        if rows is None:  # stopping and Redis still unreachable: the leases will expire
            log.warning("%s: could not start %d claimed jobs before stopping; the reaper "
                        "will hand them back", self._who, len(pairs))
            return
        started = core.started_jobs(self._rows, pairs, rows)
        if started:
            yield from self._deps.load_results(started)  # job.dependency_results()
            self._hand_out(started)
