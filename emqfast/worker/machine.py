"""The worker state machine: one claim loop for both Workers, without I/O.

:class:`WorkerMachine` holds a Worker's state and its logic as sans-IO generators that
yield :mod:`emqfast.core.ops` requests (calls, commands, pipelines) and waits (``Sleep``,
``WaitForRoom``, ``WaitDrained``, ``PopMarker``, ``Hook``): claim under leases (re-sent
with the same request id after a lost reply), start the claimed jobs, promote due ones,
block on the wake marker, the beat (leases, reaping, retention), write outcomes in
batches. The facade's operations are composed with ``yield from``, so a test can script
every I/O the machine does. A driver subclasses it and supplies what differs between
threads and asyncio: ``_drive(logic)`` (run a generator with
:func:`emqfast.backends.drive.run` or ``run_async``, its waits by the driver's
``perform``); ``_hand_out(started)`` and ``_take_held(peek)`` (run handlers, take back
those not begun); ``_guard`` (a lock or a null context) and ``_wake()``;
``_stop_requested()`` and ``stop()``.

What a Worker shares with the other queues of a many-queue Worker (handler slots, claim
order, wake-ups) it asks its crew (``_crew``: :data:`~emqfast.worker.leases.SOLO` alone).
"""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from itertools import islice, takewhile
from typing import (Any, Callable, ContextManager, Dict, Iterator, List, Optional, Sequence, Set,
                    Tuple)

from emqfast.core.errors import (EvictionRisk, KeyTypeConflict, PermissionDenied,
                                 VersionMismatch)
from emqfast.core.ops import (Batch, Cmd, Hook, Logic, PopMarker, WaitDrained,
                              WaitForRoom)
from emqfast.core.validation import check_int
from emqfast.facade import tracing
from emqfast.facade.deps import DependencyStep
from emqfast.facade.job import Job
from emqfast.facade.queue import Queue
from emqfast.facade.schedules import Schedules
from emqfast.worker import calls
from emqfast.worker.calls import (AckPlan, JobRows, cancel_active_call, free_calls,
                                  metrics_call, run_times)
from emqfast.worker.cancels import CANCELLED, Stop, check_timeouts, stop_outcome
from emqfast.worker.heartbeat import Heartbeat
from emqfast.worker.leases import SOLO, Prefetch, RunningJob, Solo, held_lease
from emqfast.worker.outcomes import (CancelledRun, Failed, Outcome, WorkerStats,
                                     job_group, log_context, tally)
from emqfast.worker.resend import (Backoff, pipeline_until, transient, typed, until_all,
                                   until_done, until_landed, wait_out)

log = logging.getLogger("emqfast.worker")

TRIM_EVERY_S = 5.0  # retention (trim) runs on the beat at most this often
ACK_BATCH = 1000  # outcomes written per AckPlan at most
# refusals no re-run gets past (the ACL, the keyspace version, a foreign key type): the
# Worker stops and ``run`` raises them instead of running jobs whose outcomes can't land
PERMANENT = (PermissionDenied, VersionMismatch, KeyTypeConflict)

Held = Tuple[str, str, Optional[str]]  # (job id, lease token, group or None)
Lease = RunningJob  # a lease this worker renews: held or running


class WorkerMachine:
    """State and logic shared by :class:`emqfast.Worker` and :class:`emqfast.aio.Worker`."""

    _label = "worker"  # how log lines name this kind of worker (the logger says "emqfast")
    _guard: ContextManager[Any]  # the driver's: a lock (threads), a null context (asyncio)
    _members: Sequence["WorkerMachine"] = ()  # a many-queue Worker's (see _lead)

    # --- what each driver supplies: the machine's interface to it ------------------------
    def _stop_requested(self) -> bool:
        """A stop was asked for (the claim loop ends, re-sends stop after the timeout)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop claiming (graceful)."""
        raise NotImplementedError

    def _wake(self) -> None:
        """Wake this Worker's claim loop (under ``_guard``): see :meth:`_notify`."""
        raise NotImplementedError

    def _hand_out(self, started: List[Tuple[Job, str]]) -> None:
        """Run the handlers of the started ``(job, token)`` pairs (running jobs now);
        ``_stop_early(started)`` stops those cancelled while held: no handler sees them."""
        raise NotImplementedError

    def _take_held(self, peek: bool = False) -> List[Held]:
        """``(id, token, group)`` of started jobs no handler has begun (``peek``: kept)."""
        raise NotImplementedError

    def _connections_suspect(self) -> None:
        """A connection was lost (a half-open blip silences all at once): the driver drops
        the idle ones it keeps, so none waits out a read deadline of its own."""

    def _stopped(self, run: Optional[RunningJob]) -> None:
        """A run was asked to stop (None: nothing ran): cancel its task or let its thread
        see ``job.cancelled``, and arm the grace before it is abandoned."""
        raise NotImplementedError

    def _setup(self, queue: Any, handler: Callable[..., Any], *, concurrency: int,
               lease_ms: int, max_stalled: int, batch_size: Optional[int], batch_floor: int,
               keep_completed: int, keep_failed: int, max_age_ms: Optional[int],
               shutdown_timeout_s: float, name: Optional[str], allow_eviction: bool,
               prefetch: Optional[int], crew: Solo = SOLO) -> None:
        """Check the settings, set up the state (``crew``: what it shares its slots with);
        ``batch_size`` defaults to ``max(concurrency, batch_floor)``."""
        self.queue = queue
        self._crew = crew
        self._index = 0  # its place in the crew's claim order
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
        self.name = name or crew.name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._who = f"{self._label} {self.name}"
        self._stats = WorkerStats()
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
        self._held: Dict[str, RunningJob] = {}  # job id -> held lease, in claim order
        self._held_groups: Set[str] = set()  # the groups the claims of held jobs served
        self._early: Set[str] = set()  # held jobs asked to cancel (their handler never runs)
        self._keys_gone_said = False  # the queue's keys vanished: said once (see _renew)
        self._heartbeat = Heartbeat(self)  # the Workers page; signed off at the shutdown
        self._deps = DependencyStep(self)  # settles dependencies on the beat and after acks
        # callables run on every beat after the Worker's own steps (an awaitable one is
        # awaited under asyncio): extensions and tests hook in here
        self.beat_hooks: List[Callable[[], Any]] = []
        self._wait_active = False  # run_until_idle(wait_active=True)

    def _should_stop(self) -> bool:
        """The claim loop ends (the asyncio driver adds a cancelled run())."""
        return self._stop_requested()

    def _stop_overdue(self) -> bool:
        """Stopping for longer than ``shutdown_timeout_s``: stop re-sending."""
        return self._stop_requested() and \
            time.monotonic() - self._stopped_at > self.shutdown_timeout_s

    # --- a many-queue Worker: one Worker per queue in a crew, led by this one ----------------
    def _lead(self, crew: Any) -> None:
        """Lead ``crew``: its members (one Worker per queue) work; this one runs them."""
        self._members = crew.members
        self.name, self.concurrency, self.order = crew.name, crew.concurrency, crew.order

    @property
    def members(self) -> List["WorkerMachine"]:
        """The Worker of each queue: a many-queue Worker's members, else itself."""
        return list(self._members) or [self]

    @property
    def queues(self) -> List[Queue]:
        """The queues this Worker serves, in its claim order."""
        return [m.queue for m in self.members]

    @property
    def stats(self) -> WorkerStats:
        """What this Worker did (over all its queues)."""
        return WorkerStats.total(m._stats for m in self._members) if self._members \
            else self._stats

    @property
    def stats_by_queue(self) -> Dict[str, WorkerStats]:
        """What this Worker did, by queue name."""
        return {m.queue.name: m._stats for m in self.members}

    def _notify(self) -> None:
        """A job ended or an outcome was written: wake the claim loop(s) (under ``_guard``)."""
        self._crew.notify(self)

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

    def _write_ended(self, batch: List[Any]) -> Logic:
        """Write a batch of outcomes but cancelled runs (:meth:`_write_outcomes`), then
        release the jobs that waited on these; not idle until then, so run_until_idle sees
        the jobs it releases."""
        with self._guard:
            self._pending_acks += 1
        try:
            replies = yield from self._write_outcomes(batch)
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
        self._crew.joined(self)
        try:
            while not self._should_stop():
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"worker on {self.queue.name!r} not idle in time")
                try:
                    if (yield from self._turn(until_idle, wait_scheduled)):
                        return
                    backoff.reset()
                except Exception as exc:  # noqa: BLE001 - sorted by wait_out
                    yield from wait_out(exc, backoff, self._who, self._connections_suspect)
        finally:
            self._crew.left(self)

    def _turn(self, until_idle: bool, wait_scheduled: bool) -> Logic:
        """One turn of the loop; True when ``until_idle`` is satisfied."""
        yield from self._beat_if_due()
        if self._next_schedule_ms is not None and self._server_now_ms() >= self._next_schedule_ms:
            yield from self._pump_schedules()
        if self._due_hint is not None and self._server_now_ms() >= self._due_hint:
            # woken at a delayed job's run-at: promote before claiming (saves a round trip)
            self._due_hint = None
            yield from Queue.promote.op(self.queue, limit=calls.PROMOTE_BATCH)
        slots, room = yield WaitForRoom(self.beat_s)
        if slots and self._held:  # a handler slot is free: start a job we hold
            yield from self._start_held(slots)
            return False
        if room <= 0 or self._should_stop():  # stopped meanwhile (a beat): claim nothing
            return False
        # Idleness must be judged from before the claim: an outcome written after
        # it (a retry re-parked on the delayed set) is not in this claim's reply.
        idle_before_claim = self._idle()
        reply = yield from self._claim(min(room, self.batch_size))
        if reply is None:
            return False
        now, status, next_due, pairs = calls.parse_claim(reply)
        served, self._groups = self._groups, calls.claim_groups(reply)  # lanes for next turn
        self._hold(pairs, served)
        if status == calls.CLAIM_PAUSED:
            yield from self._release_held()
        self._server_offset_ms = now - time.monotonic() * 1000
        # a due delayed job (or retry) is promoted now, backlog or not: it must not wait
        # for an empty claim (one bounded promote; the next claim can take it)
        promoted = calls.due_now(status, next_due, now) and \
            (yield from Queue.promote.op(self.queue, limit=calls.PROMOTE_BATCH)) > 0
        if pairs:
            yield from self._start_held(slots)
            return False
        if promoted:
            return False
        if idle_before_claim and calls.idle(until_idle, wait_scheduled, status, next_due, now):
            if not (yield from self._wait_for_others(now, next_due)):
                return True
        yield from self._wait_for_work(until_idle, now, status, next_due)
        return False

    def _wait_for_others(self, now: int, next_due: int) -> Logic:
        """Idle here, but jobs may be active under other workers' leases (True: wait for
        them, ``wait_active``; a dead worker's are reaped on the beat) or scheduled for later
        (retries in their backoff: ``wait_scheduled`` waits). What is left is logged."""
        active = yield Cmd.of("ZCARD", self._keys.active)
        if active and self._wait_active:
            return True
        if next_due != -1:  # a warning when retries of this Worker's may be among them
            log.log(logging.WARNING if self._stats.retried else logging.INFO,
                    "%s: queue %r is idle here; leaving its scheduled jobs (retries waiting "
                    "out their backoff, jobs due later; the next in %.1f s): wait_scheduled="
                    "True waits for them", self._who, self.queue.name, (next_due - now) / 1000)
        if not active:
            return False
        head = yield Cmd.of("ZRANGE", self._keys.active, 0, 0, "WITHSCORES", withscores=True)
        ends_in = max((head[0][1] - now) / 1000, 0.0) if head else 0.0
        log.info("%s: queue %r is idle here; leaving %d job(s) active under other workers' "
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
        claim = calls.claim_call(self._keys, n, self.lease_ms, self.name, self._groups,
                                f"{self._claim_prefix}:{self._claim_seq}")
        self._claiming = claim
        reply = None
        try:
            reply = yield from until_done(claim, "claim", self._who, self._stop_overdue,
                                          self._connections_suspect)
            return reply
        finally:
            self._crew.claimed(self, reply)

    def _wait_for_work(self, until_idle: bool, now: int, status: int, next_due: int) -> Logic:
        """After an empty claim: wait until the beat, a run-at, a rate window's opening or
        the next schedule run, or until new work wakes the marker. True when it ended for
        work (a marker due now, or our own outcomes written), not by its time."""
        wait_ms, hint = calls.wait_plan(self.beat_s, now, status, next_due, self._next_schedule_ms)
        if hint is not None:
            self._due_hint = hint
        # draining: what ends this wait is our own outcomes being written, not the marker,
        # which would hold us a beat
        if until_idle and status == 1 and (yield WaitDrained(wait_ms / 1000)):
            return True
        if not self._crew.may_block(self):
            return False
        woken = True  # (an error: as before it waited)
        try:
            woken = yield from self._block_on_marker(wait_ms)
        finally:
            self._crew.woke(self, woken)
        return woken

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
                return False
            popped = yield PopMarker(self._keys.marker, remaining)
            if popped is None:
                return False
            score = popped[1]
            ahead_ms = score - self._server_now_ms()
            if ahead_ms <= 0:
                return True
            # it may be a schedule's next run (upserted or minted elsewhere): pump then
            if self._next_schedule_ms is None or score < self._next_schedule_ms:
                self._next_schedule_ms = score
            end = min(end, time.monotonic() + ahead_ms / 1000)
        return False

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
        log.info("%s: queue %r paused; handing back %d held jobs", self._who,
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
                self._hold(calls.parse_claim(reply)[3], [])
        with self._guard:
            pairs = [(h.job_id, h.token) for h in self._held.values()]
            self._held.clear()
            self._held_groups.clear()
        held: List[Tuple[str, str, Optional[str]]] = []
        for at in range(0, len(pairs), calls.START_CHUNK):
            chunk = pairs[at:at + calls.START_CHUNK]
            rows = yield from until_done(calls.start_call(self._keys, chunk), "start",
                                         self._who, give_up, self._connections_suspect)
            if rows is not None:  # a job whose lease is gone has an empty row: not ours
                held += [(job.id, token, job_group(job))
                         for job, token in calls.started_jobs(self._rows, chunk, rows)]
        return held

    # --- starting jobs ------------------------------------------------------------------
    def _hold(self, pairs: Sequence[Tuple[str, str]], served: Sequence[str]) -> None:
        """Claimed jobs join those held until a handler slot frees (their leases renewed on
        the beat like running ones)."""
        now = time.monotonic()
        with self._guard:
            self._claiming = None
            self._stats.claimed += len(pairs)
            held = self._held
            for job_id, token in pairs:
                held[job_id] = held_lease(job_id, token, now)
            if pairs:
                self._held_groups.update(served)

    def _start_held(self, slots: int) -> Logic:
        """Start up to ``slots`` held jobs, oldest first (a handler slot is free for each, so
        each begins at once), in calls of at most ``START_CHUNK`` (bounded work per call).
        The crew reserves the slots first (another queue's loop must not count them too)."""
        reserved = slots = self._crew.reserve(self, slots)
        try:
            yield from self._start_reserved(slots)
        finally:
            self._crew.unreserve(self, reserved)

    def _start_reserved(self, slots: int) -> Logic:
        while slots > 0 and self._held:
            with self._guard:
                chunk = list(islice(self._held.values(), min(slots, calls.START_PIPELINE)))
                groups = sorted(self._held_groups)
            yield from self._start_chunk([(h.job_id, h.token) for h in chunk], groups)
            with self._guard:  # handed out (or no longer ours)
                held = self._held
                if len(chunk) == len(held):  # all of them (only this loop adds to it)
                    held.clear()
                else:
                    for h in chunk:
                        held.pop(h.job_id, None)
                if self._early:
                    for h in chunk:
                        self._early.discard(h.job_id)
                if not held:
                    self._held_groups.clear()
            slots -= len(chunk)

    def _started_lease(self, job: Job, token: str, now: float) -> RunningJob:
        """The record of a job just started: its held lease's, now with its job."""
        run = self._held.get(job.id)
        if run is None or run.token != token:  # (not held: e.g. a scripted test)
            return RunningJob(job, token, now)
        run.job, run.lost = job, False  # started: start.lua found the lease ours
        return run

    def _start_chunk(self, pairs: Sequence[Tuple[str, str]], groups: List[str]) -> Logic:
        """Start ``pairs`` in calls of ``START_CHUNK`` sent in one round trip, and hand out
        those started."""
        chunks = [pairs[at:at + calls.START_CHUNK]
                  for at in range(0, len(pairs), calls.START_CHUNK)]
        # re-sent after a lost reply: a job already started by its token is not counted twice
        replies = yield from until_all([calls.start_call(self._keys, c, groups) for c in chunks],
                                       "start", self._who, self._stop_overdue,
                                       self._connections_suspect)
        if replies is None:  # stopping and Redis still unreachable: the leases will expire
            log.warning("%s: could not start %d claimed jobs before stopping; the reaper "
                        "will hand them back", self._who, len(pairs))
            return
        started = [run for chunk, rows in zip(chunks, replies)
                   for run in calls.started_jobs(self._rows, chunk, rows)]
        if started:
            yield from self._deps.load_results(started)  # job.dependency_results()
            self._hand_out(started)

    # --- the beat -----------------------------------------------------------------------
    renew_on_beat = True  # the asyncio driver's lease task renews them instead

    def _beat_if_due(self) -> Logic:
        """Once per ``beat_s``: renew leases, reap, promote, trim, pump schedules, release held
        jobs of a paused queue, hooks."""
        now = time.monotonic()
        if now < self._next_beat:
            return
        self._next_beat = now + self.beat_s
        # a stop cuts the beat short: on a silent server each step would wait out a deadline
        for step in takewhile(lambda _: not self._should_stop(), self._beat_steps(now)):
            yield from step

    def _beat_steps(self, now: float) -> Iterator[Logic]:
        """The beat's steps in order, each made as it is reached."""
        queue = self.queue
        if self.renew_on_beat:
            yield self._renew_on_beat(now)
        yield Queue.reap.op(queue, max_stalled=self.max_stalled)
        # due jobs are promoted on the beat too: a worker whose slots are all busy
        # does not claim, and the claim reply is where promotion is usually noticed
        yield Queue.promote.op(queue, limit=calls.PROMOTE_BATCH)
        if now >= self._next_trim:
            self._next_trim = now + TRIM_EVERY_S
            yield Queue.trim.op(queue, keep_completed=self.keep_completed,
                                keep_failed=self.keep_failed, max_age_ms=self.max_age_ms)
        yield from (self._pump_schedules(), self._check_paused(), self._heartbeat.beat(),
                    self._deps.settle(), self._recheck_cancels())  # (a cancel message lost)
        for hook in self.beat_hooks:
            yield _hook_step(hook)

    def _pump_schedules(self) -> Logic:
        """Mint due schedule occurrences; remember when the next one is due."""
        sweep = yield from Schedules.sweep.op(self.queue.schedules)
        self._next_schedule_ms = calls.next_schedule_ms(sweep)

    # --- leases -------------------------------------------------------------------------
    def _due_leases(self, now: float) -> List[Lease]:
        """Leases a third used (not lost, not being acked): running jobs' and held ones'
        (claimed, waiting for a handler slot)."""
        third = self.lease_ms / 3000.0
        with self._guard:
            held: List[Lease] = list(self._held.values())
            return [r for r in [*self._running.values(), *held]
                    if not r.lost and not r.acking and now - r.extended_at > third]

    def _renew(self, due: Sequence[Lease], now: float) -> Logic:
        """Extend ``due`` leases by ``lease_ms``, ``LEASE_CHUNK`` per call; a lease found
        gone is marked lost (logged) unless the job's outcome is being written."""
        for chunk in calls.chunked(due):
            call = calls.extend_call(self._keys, self.lease_ms,
                                    [(r.job_id, r.token) for r in chunk])
            replies = yield call
            lost = [r for r, ok in zip(chunk, replies) if not ok]
            for r, ok in zip(chunk, replies):
                if ok:
                    r.extended_at = now
            if not lost:
                continue
            # a lease lost with its job's hash is a job gone with its queue's keys (a
            # server emptied, obliterate): said once, not once per job
            there = yield Batch([Cmd.of("EXISTS", self._keys.job(r.job_id)) for r in lost])
            vanished = sum(1 for e in there if not e)
            if vanished:
                self._say_keys_gone(f"{vanished} leased job(s) vanished with their hashes",
                                    vanished)
            for r, e in zip(lost, there):
                self._lease_gone(r, quiet=not e)

    def _lease_gone(self, r: Lease, quiet: bool = False) -> None:
        """A renewal found the lease gone (reaped after a stall, deleted by hand; ``quiet``:
        with the whole queue, said once already)."""
        if r.job is None:
            if self._held.get(r.job_id) is r:  # never started: just forget it
                r.lost = True
                if r.job_id not in self._early and not quiet:  # (cancelled while held:
                    log.warning("lease on held job %r was lost", r.job_id)  # cancel.lua took it)
        elif self._running.get(r.job.id) is r and not r.acking:
            r.lost = True
            if not quiet:
                log.warning("lease on running job %r was lost", r.job.id)

    def _renew_due(self) -> Logic:
        """Renew every lease that is due now (errors raised)."""
        now = time.monotonic()
        yield from self._renew(self._due_leases(now), now)

    def _renew_on_beat(self, now: float) -> Logic:
        """Renew due leases; a transient fault leaves them due: the next beat (a third of
        the lease later at most) tries again, long before they expire."""
        due = self._due_leases(now)
        try:
            yield from self._renew(due, now)
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            if not transient(exc):
                raise
            log.warning("%s: cannot extend %d leases (%s); next beat", self._who, len(due),
                        type(typed(exc)).__name__)

    def _extend_one(self, job_id: str, token: str, ms: int) -> Logic:
        """A handler's ``job.extend_lease(ms)``: re-sent until it lands; LeaseLost when
        the lease is gone."""
        check_int(ms, "ms", 1, 1 << 40)
        call = calls.extend_call(self._keys, ms, [(job_id, token)])
        calls.check_extended(job_id, (yield from until_done(call, "extend", self._who)))
        running = self._running.get(job_id)
        if running is not None:
            running.extended_at = time.monotonic()

    def _progress(self, job_id: str, token: str, value: Any) -> Logic:
        """A handler's ``job.progress(value)``: recorded under the run's lease token."""
        yield calls.progress_call(self._keys, job_id, token, value)

    # --- releasing ----------------------------------------------------------------------
    def _releasing(self, held: Sequence[Held], until: float) -> Logic:
        """Give claimed jobs back to pending (grouped ones to their lanes), at most
        ``LEASE_CHUNK`` per round trip; transient faults are retried until ``until``
        (monotonic s), then left to the reaper (their leases expire)."""
        for chunk in calls.chunked(held):
            release, skip = calls.release_calls(self._keys, chunk)
            replies = yield from pipeline_until(release, until, f"release {len(chunk)} jobs")
            self._count_released(chunk, replies[skip:])

    def _count_released(self, chunk: Sequence[Held], replies: Sequence[Any]) -> None:
        with self._guard:
            for (job_id, token, _), reply in zip(chunk, replies):
                if reply == 1:
                    self._stats.released += 1
                elif isinstance(reply, Exception):
                    log.warning("could not release %r (%r); the reaper will", job_id,
                                reply)
                running = self._running.get(job_id)
                if running is not None and running.token == token:
                    del self._running[job_id]
            self._notify()

    # --- writing outcomes ---------------------------------------------------------------

    def _mark_acking(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes handed to the acker: their leases are renewed no more (the write ends
        them, and a renewal racing it would read as a lost lease). Under ``_guard``."""
        get = self._running.get
        for outcome in outcomes:
            run = get(outcome.job.id)
            if run is not None and run.token == outcome.token:
                run.acking = True

    def _write_outcomes(self, batch: List[Outcome]) -> Logic:
        """Write a batch of outcomes, count and forget them; the replies (for the run
        times). A stopping worker re-sends until ``_ack_until`` only."""
        plan = AckPlan(self._keys, batch)
        replies = plan.replies((yield from until_landed(plan.calls, self._who, self._ack_until,
                                                        self._connections_suspect)))
        gone = tally(self.stats, batch, replies, plan.retrying)
        if gone:
            self._say_keys_gone(str(gone[0]), len(gone))
        self._forget(batch)
        for reply in replies:  # a job's refusal that no re-run can get past stops us
            if isinstance(reply, PERMANENT):
                self._stop_fatally(reply)
                break
        return replies

    def _say_keys_gone(self, why: str, jobs: int) -> None:
        """The queue's keys vanished under jobs in hand (a server restart without
        persistence, FLUSHDB, obliterate): said once per Worker, not once per job."""
        if self._keys_gone_said:
            return
        self._keys_gone_said = True
        log.error("%s: the keys of queue %r are gone (%s): %d job(s) in hand were "
                  "discarded with them. A server restarted without persistence, FLUSHDB "
                  "or obliterate() empties a queue; what is enqueued again runs as usual",
                  self._who, self.queue.name, why, jobs)

    def _write_run_times(self, batch: List[Outcome], replies: List[Any]) -> Logic:
        """Add the batch's wait/run times to the histograms in one call. Best effort: the
        outcomes (and the exact counters) are already written, so a failure is logged,
        not retried."""
        obs = run_times(batch, replies)
        if not obs:
            return
        try:
            [reply] = yield Batch([metrics_call(self._keys, obs)], via_batcher=True)
            if isinstance(reply, Exception):
                raise reply
        except Exception as exc:  # noqa: BLE001 - never lose the acks over metrics
            log.warning("%s: could not record run times of %d jobs (%s)", self._who,
                        len(batch), exc)

    def _forget(self, batch: Sequence[Outcome]) -> None:
        """The batch is written (or abandoned): its runs are over; wake whoever waits."""
        with self._guard:
            running = self._running
            # only the run an outcome belongs to: a retried job may already run again
            # under the same id (a new lease token) by the time this write returns
            for outcome in batch:
                job_id = outcome.job.id
                run = running.get(job_id)
                if run is not None and run.token == outcome.token:
                    del running[job_id]
            self._pending_acks -= len(batch)
            self._notify()

    def _ack_failed(self, batch: Sequence[Outcome], exc: BaseException) -> None:
        """A batch could not be written: forget its jobs (no longer extending their leases
        hands them to the reaper: re-run, never lost, never hung). A permanent error
        stops the worker, and its ``run`` raises it: going on would run handler after
        handler whose outcomes can never be written."""
        error = typed(exc)
        log.error("%s: could not write %d outcomes (%s: %s); their leases will expire and "
                  "the reaper will re-run them", self._who, len(batch), type(error).__name__,
                  error)
        self._forget(batch)
        if isinstance(error, PERMANENT):
            self._stop_fatally(error)

    def _stop_fatally(self, error: BaseException) -> None:
        """Stop the worker on an error that re-running cannot get past; ``run`` raises it."""
        if self._fatal is None:
            self._fatal = error
            self.stop()

    # --- stopping running jobs (the rules: emqfast.worker.cancels) ---------------------
    def _setup_stops(self, job_timeout_ms: Optional[int], cancel_grace_ms: int) -> None:
        """The Worker's ``job_timeout_ms`` and ``cancel_grace_ms``, checked; no stop yet."""
        self.job_timeout_ms, self.cancel_grace_ms = check_timeouts(job_timeout_ms,
                                                                   cancel_grace_ms)
        # lease token -> its stop: a stop belongs to one run (attempt), never to the job id
        self._stops: Dict[str, Stop] = {}

    def _cancel_held(self, job_id: str) -> None:
        """A cancel of a job this Worker holds but has not started (prefetched): it is
        stopped as soon as it is handed to a handler (:meth:`_stop_early`)."""
        with self._guard:
            if job_id in self._held:
                self._early.add(job_id)

    def _stop_early(self, started: Sequence[Tuple[Job, str]]) -> None:
        """Jobs just handed out: stop those cancelled while they were held, whether this
        Worker heard the cancel (pub/sub) or start.lua found its mark (a cancel whose
        message had not arrived yet: the mark is read in the same step that starts it)."""
        for job, token in started:
            if self._early:
                with self._guard:
                    early = job.id in self._early
                    self._early.discard(job.id)
            else:
                early = False
            if early or "_cancel_at_start" in job.__dict__:
                self._on_cancel(job.id, token)

    def _stop_run(self, job_id: str, reason: str, token: Optional[str] = None
                  ) -> Optional[RunningJob]:
        """Ask a running job to stop (``token``: only that run); the run, or None when it
        is not ours, ended, is being acked or was stopped already. The driver then
        cancels a coroutine's task and arms the abandonment after the grace."""
        with self._guard:
            run = self._running.get(job_id)
            if run is None or run.acking or run.lost or run.token in self._stops \
                    or (token is not None and run.token != token):
                return None
            run.job._stop_reason = reason
            self._stops[run.token] = Stop(run.token, reason)
        log.info("%s: job %r %s; stopping its handler", self._who, job_id,
                 "was cancelled" if reason == CANCELLED else "timed out",
                 extra=log_context(run.job))
        return run

    def _settle_run(self, outcome: Outcome) -> Optional[Outcome]:
        """A handler ended with ``outcome``: for a stopped run, the outcome of its stop
        instead (None: the run was abandoned, its outcome written already)."""
        if not self._stops:  # the common case: nothing stopped, no lock taken
            return outcome
        token = outcome.token
        with self._guard:
            stop = self._stops.pop(token, None)
            if stop is None:
                return outcome
        if stop.settled:
            return None
        tb = outcome.traceback if isinstance(outcome, Failed) else ""
        return stop_outcome(outcome.job, token, stop.reason, tb)

    def _abandon_run(self, job_id: str, token: str) -> Optional[Failed]:
        """The grace after a stop has passed: the outcome to write now if the handler is
        still running (its late return is then ignored), else None."""
        with self._guard:
            stop = self._stops.get(token)
            if stop is None or stop.settled:
                return None
            run = self._running.get(job_id)
            if run is None or run.token != token or run.acking:
                del self._stops[token]  # ended meanwhile: nothing to abandon
                return None
            stop.settled = True
        log.warning("%s: job %r's handler did not end within cancel_grace_ms=%d of its %s; "
                    "abandoning the run (its thread keeps its slot until it returns)",
                    self._who, job_id, self.cancel_grace_ms,
                    "cancel" if stop.reason == CANCELLED else "timeout",
                    extra=log_context(run.job))
        return stop_outcome(run.job, token, stop.reason)

    def _unstopped(self) -> List[Tuple[str, str]]:
        """``(id, token)`` of running jobs not stopped yet: whose cancel marks the beat
        re-reads."""
        with self._guard:
            return [(i, r.token) for i, r in self._running.items()
                    if r.token not in self._stops and not r.acking and not r.lost]

    def _recheck_cancels(self) -> Logic:
        """Read the cancel marks of the running jobs not stopped yet (on the beat, and after
        the listener (re-)subscribed) and stop those marked: a cancel whose message was
        lost."""
        runs = self._unstopped()
        if not runs:
            return
        flags = yield Batch([Cmd.of("HGET", self._keys.job(job_id), "cancel")
                             for job_id, _ in runs])
        for (job_id, token), flag in zip(runs, flags):
            if flag:
                self._on_cancel(job_id, token)

    def _on_cancel(self, job_id: str, token: Optional[str] = None) -> None:
        """A cancel of ``job_id`` was heard (the driver's listener) or its mark read (the
        beat): its run is stopped, or, held and not started yet, it is stopped as it starts."""
        run = self._stop_run(job_id, CANCELLED, token)
        if run is None and token is None:
            self._cancel_held(job_id)
        self._stopped(run)

    # --- writing outcomes: cancelled runs apart ----------------------------------------
    def _write_batch(self, batch: List[Outcome]) -> Logic:
        """Write a batch of outcomes: cancelled runs end by cancel_active.lua, the rest by
        :meth:`_write_ended`. A mixed batch is written in two parts, each failing on its
        own (so no part is forgotten twice): the replies come back in the batch's order."""
        if not calls.has_kind(batch, CancelledRun):
            return (yield from self._write_ended(batch))
        ended = [o for o in batch if isinstance(o, CancelledRun)]
        rest = [o for o in batch if not isinstance(o, CancelledRun)]
        mine = iter((yield from self._write_part(self._write_cancelled, ended)))
        got = iter((yield from self._write_part(self._write_ended, rest)) if rest else [])
        return [next(mine) if isinstance(o, CancelledRun) else next(got) for o in batch]

    def _write_part(self, write: Any, part: List[Any]) -> Logic:
        """``write(part)``'s replies; a failure is handled as the acker handles a batch's
        (logged, forgotten, a permanent error stops the worker) and is each one's reply."""
        try:
            return (yield from write(part))
        except Exception as exc:  # noqa: BLE001 - the other part must still be written
            self._ack_failed(part, exc)
            return [exc] * len(part)

    def _write_cancelled(self, ended: List[CancelledRun]) -> Logic:
        """End cancelled runs (re-sent until they land: each is fenced by its token),
        free their groups' slots, count and forget them."""
        calls = [cancel_active_call(self._keys, o) for o in ended]
        calls += free_calls(self._keys, ended)
        replies = yield from until_landed(calls, self._who, self._ack_until)
        out = []
        for o, reply in zip(ended, replies):
            if isinstance(reply, Exception):
                log.warning("%s: could not end cancelled job %r (%r)", self._who, o.job.id,
                            reply, extra=log_context(o.job))
            else:
                self._stats.cancelled += 1
                log.info("%s: job %r cancelled", self._who, o.job.id,
                         extra=log_context(o.job))
            out.append(reply)
        self._forget(ended)
        return out


def _hook_step(hook: Callable[[], Any]) -> Logic:
    yield Hook(hook)  # (a step of its own: a stop may come between two hooks)
