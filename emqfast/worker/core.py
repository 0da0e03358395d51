"""What the sync and async Workers share: the calls they make and how replies are read.

No I/O here. Each function builds a :class:`~emqfast.ops.Call` (a ``(script,
keys, args)`` tuple) or interprets a reply, so :class:`emqfast.Worker` (threads)
and :class:`emqfast.aio.Worker` (asyncio) claim, start, finish, fail, retry,
extend and release jobs by the same rules; only scheduling and I/O differ.
"""
from __future__ import annotations

import inspect
import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from emqfast.core import codec
from emqfast.worker.rows import JobRows
from emqfast.core.errors import (EmqError, LeaseLost, PartialBatch, PayloadError,
    PermissionDenied, Unrecoverable, from_reply, is_transient, translate)
from emqfast.facade.job import Job
from emqfast.core.keys import QueueKeys
from emqfast.facade.metrics import Observations
from emqfast.core.ops import Call
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION

log = logging.getLogger("emqfast.worker")

_CLAIM = load("claim")
_START = load("start")
_COMPLETE = load("complete")
_FAIL = load("fail")
_EXTEND = load("extend")
_RELEASE = load("release")
_PROGRESS = load("progress")
_METRICS_ADD = load("metrics_add")

# Group lanes (claim.lua): how many ready groups a claim reply names for the next turn,
# when a group parked at its cap is re-checked at the latest (a finishing job's group_free
# call unparks it and wakes a worker at once: this is only the safety net, e.g. for a
# worker that died), and jobs per group per turn.
RING_HEAD = 16
CAP_POLL_MS = 1000
GROUP_QUANTUM = 1
# Due delayed jobs promoted per promotion a Worker makes (claim reply says one is due, a
# wait ended at a run-at, the beat): one due read and one bounded promote call.
PROMOTE_BATCH = 500
# Successful outcomes per complete.lua call, and claimed jobs per start.lua call: one
# call's Lua run stays ~1-2 ms, well inside the 20 ms a busy host may stretch it to.
COMPLETE_CHUNK = 128
START_CHUNK = 128
COMPLETE_CHUNK_BYTES = 1 << 20  # ...and about this much result JSON
# Leases extended / jobs released per script call (bounded server work per call).
LEASE_CHUNK = 500

Pair = Tuple[str, str]  # (job id, lease token)
# An outcome: ("done", job, token, result_json) or ("fail", job, token, exc, tb, may_retry)
Outcome = tuple


# --- faults ---------------------------------------------------------------------------------

# How Redis words an ACL denial of a command a script calls (no NOPERM code prefix).
_SCRIPT_NOPERM = "user executing the script can't run this command"


def typed(exc: BaseException) -> BaseException:
    """emqfast's typed error for whatever a call raised (a partial batch by its cause)."""
    if isinstance(exc, PartialBatch) and exc.__cause__ is not None:
        exc = exc.__cause__
    out = translate(exc)
    if not isinstance(out, EmqError) and _SCRIPT_NOPERM in str(out):
        return PermissionDenied(str(out))
    return out


def transient(exc: BaseException) -> bool:
    """True when the call may succeed if sent again later: a lost connection or reply, a
    server loading, busy, failing over or full. The Workers' calls are all safe to re-send
    with the same arguments (claim by its request id, start/complete/fail by the token), so
    they wait these out; anything else (PermissionDenied: an ACL or password problem) is
    permanent and stops the Worker."""
    return is_transient(typed(exc))


class Backoff:
    """Exponential waits between re-sends: 50 ms doubling to 5 s."""

    def __init__(self, first_s: float = 0.05, most_s: float = 5.0):
        self.first_s, self.most_s = first_s, most_s
        self.next_s = first_s

    def __call__(self) -> float:
        """The wait before the next try (and double the one after)."""
        wait, self.next_s = self.next_s, min(self.next_s * 2, self.most_s)
        return wait

    def reset(self) -> None:
        self.next_s = self.first_s


def transient_slots(replies: Sequence[Any]) -> List[int]:
    """Indexes of replies that are transient error replies (e.g. one call of a pipeline
    met LOADING or OOM): those calls did not run and must be sent again."""
    return [i for i, r in enumerate(replies) if isinstance(r, BaseException) and transient(r)]


def is_async_handler(handler: Any) -> bool:
    """True for ``async def`` functions (or objects whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(handler) or \
        inspect.iscoroutinefunction(getattr(handler, "__call__", None))


def refuse_async_handler(handler: Any) -> None:
    """The sync Worker runs handlers in threads: an ``async def`` handler would only ever
    return an un-awaited coroutine. Refuse it at construction."""
    if is_async_handler(handler):
        raise TypeError("emqfast.Worker runs plain functions in threads; this handler is a "
                        "coroutine function (async def): use emqfast.aio.Worker with an "
                        "emqfast.aio.Queue for it")


def awaitable_result(job: Job, token: str, result: Any) -> Outcome:
    """The failed, non-retried outcome of a sync handler that returned an awaitable (a
    coroutine it never awaited): it did not do its work, and retrying cannot help."""
    close = getattr(result, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top
    exc = TypeError(f"handler returned an awaitable ({type(result).__name__}), not a result: "
                    "async handlers need emqfast.aio.Worker")
    return ("fail", job, token, exc, "", False)


# --- claim and start ----------------------------------------------------------------------

def claim_call(k: QueueKeys, n: int, lease_ms: int, worker: str,
               groups: Sequence[str] = (), request: str = "") -> Call:
    """claim.lua: pop up to ``n`` pending jobs under leases of ``lease_ms`` (fewer when
    the queue's or a group's rate limit says so), round-robin across the flat pending set
    and the lanes of ``groups`` (the ready groups the previous reply named: a stale list is
    harmless, the script re-checks the ring and each group's cap).

    ``request`` names this claim (unique per worker, e.g. ``"<n>"``): the same call re-sent
    after its reply was lost pops nothing and returns the pairs its first send leased, so a
    Worker may re-send it (``""``: no record, a re-send claims again)."""
    return Call(_CLAIM, [k.pending, k.active, k.leases, k.meta, k.marker, k.delayed, k.counter,
                         k.rate, k.groups, k.gactive, k.glimit, k.grate, k.worker_claim(worker),
                         *[key for g in groups for key in (k.group_pending(g), k.group_rate(g))]],
                [n, lease_ms, worker, KEYSPACE_VERSION, RING_HEAD, CAP_POLL_MS, GROUP_QUANTUM,
                 request, *groups])


def parse_claim(reply: Sequence[Any]) -> Tuple[int, int, int, List[Pair]]:
    """``(server now ms, status, next due ms or -1, [(job id, token), ...])``.

    Status 1 claimed, 0 paused, 2 rate limited by the queue's window or, with nothing
    claimed, by the served groups' windows (next due is then the earliest opening
    when that comes first: the wait plan sleeps on the marker until it). The trailing
    ready-groups list (see :func:`claim_groups`) is skipped."""
    end = len(reply) - 1 if len(reply) % 2 == 0 and isinstance(reply[-1], list) else len(reply)
    pairs = [(reply[i].decode(), reply[i + 1].decode()) for i in range(3, end, 2)]
    return int(reply[0]), int(reply[1]), int(reply[2]), pairs


def due_now(status: int, next_due: int, now: int) -> bool:
    """A claim reply says a delayed job (or retry) is due: promote it now, whether or not
    the claim leased jobs (a backlog must not hold a due job back until claims run dry)."""
    return status in (1, 2) and next_due != -1 and next_due <= now


def claim_groups(reply: Sequence[Any]) -> List[str]:
    """The ready groups a claim reply names (pass them to the next :func:`claim_call`)."""
    if len(reply) % 2 == 0 and isinstance(reply[-1], list):
        return [g.decode() for g in reply[-1]]
    return []


def start_call(k: QueueKeys, pairs: Sequence[Pair], groups: Sequence[str] = ()) -> Call:
    """start.lua: stamp claimed jobs as started (their keys declared now that ids are known).
    ``groups``: the groups the claim served (every grouped job it claimed is in one), so a
    start also re-checks its group's rate window. Safe to re-send with the same arguments:
    a job already started by its token is reported as started, not counted again."""
    ids = [i for i, _ in pairs]
    return Call(_START, [k.active, k.leases, k.meta, k.events, k.metrics, k.rate, k.delayed,
                         k.marker, k.grate, *k.jobs(ids), *[k.group_rate(g) for g in groups]],
                [KEYSPACE_VERSION, *[x for pair in pairs for x in pair], *groups])


def started_jobs(rows: JobRows, pairs: Sequence[Pair],
                 reply: Sequence[Any]) -> List[Tuple[Job, str]]:
    """The running ``(job, token)`` for each start.lua row (an empty row: lease gone)."""
    return [(rows.job(job_id, row), token) for (job_id, token), row in zip(pairs, reply) if row]


# --- outcomes -----------------------------------------------------------------------------

def success(job: Job, token: str, result: Any) -> Outcome:
    """A handler's return value as the outcome to write (JSON result)."""
    return ("done", job, token, b"null" if result is None else codec.encode_result(result))


def failure(job: Job, token: str, exc: BaseException, tb: str) -> Outcome:
    """A handler's exception as the outcome to write; Unrecoverable and bad payloads never retry."""
    may_retry = not isinstance(exc, (Unrecoverable, PayloadError))
    return ("fail", job, token, exc, tb, may_retry)


def retry_delay_ms(job: Job, may_retry: bool) -> int:
    """Delay before the next attempt (the job's backoff), or -1: no attempt left."""
    if not may_retry or job.attempts >= job.max_attempts:
        return -1
    return job.backoff.delay_ms(job.attempts) if job.backoff is not None else 0


def complete_call(k: QueueKeys, done: Sequence[Outcome]) -> Call:
    """complete.lua for many successful outcomes: one call, one reply entry per job. Each
    job's attempt, start and wait go along, as start.lua reported them, so the script
    need not read them back from every job hash."""
    args: List[Any] = [KEYSPACE_VERSION]
    for _, job, token, result in done:
        args += (job.id, token, result, *run_record(job))
    return Call(_COMPLETE, [k.active, k.leases, k.completed, k.meta, k.events, k.metrics,
                            *k.jobs([o[1].id for o in done])], args)


def run_record(job: Job) -> Tuple[Any, Any, Any]:
    """(attempt, started ms, wait ms) of a running job for complete.lua; ``''`` for all
    three when the job does not know when it started (the script then reads its hash).
    The wait runs from when the job was due (its run-at, else its creation) to its start."""
    if job.started_ms is None:
        return "", "", ""
    due = job.run_at_ms if job.run_at_ms is not None else job.created_ms
    wait = max(job.started_ms - due, 0) if due is not None else -1
    return job.attempts, job.started_ms, wait


def fail_call(k: QueueKeys, outcome: Outcome) -> Tuple[Call, bool]:
    """fail.lua for one failed outcome, and whether the job will retry."""
    job, token, exc, tb, may_retry = outcome[1], outcome[2], outcome[3], outcome[4], outcome[5]
    delay = retry_delay_ms(job, may_retry)
    if delay == 0 and job_group(job) is not None:
        # fail.lua re-pends a zero-delay retry on the flat pending set; a grouped job
        # must rejoin its lane, which promote does (it knows the job's group)
        delay = 1
    message = f"{type(exc).__name__}: {exc}"
    return Call(_FAIL, [k.job(job.id), k.active, k.leases, k.failed, k.delayed, k.pending,
                        k.marker, k.meta, k.events, k.metrics],
                [job.id, token, delay, message, tb, KEYSPACE_VERSION]), delay >= 0


def _chunks_of_results(batch: Sequence[Outcome], done_at: List[int]) -> List[List[int]]:
    """``done_at`` (indexes of successes in ``batch``) cut into complete.lua calls of at
    most ``COMPLETE_CHUNK`` jobs and about ``COMPLETE_CHUNK_BYTES`` of results: one script
    call is one command, and Redis drops a client whose single command outgrows its query
    buffer limit (1 GB by default), which 200 large results could; a pipeline of small
    calls never does."""
    chunks: List[List[int]] = []
    size = 0
    for at in done_at:
        result = len(batch[at][3])
        full = chunks and (len(chunks[-1]) >= COMPLETE_CHUNK
                           or size + result > COMPLETE_CHUNK_BYTES)
        if not chunks or full:
            chunks.append([])
            size = 0
        chunks[-1].append(at)
        size += result
    return chunks


def free_calls(k: QueueKeys, batch: Sequence[Outcome]) -> List[Call]:
    """group_free.lua for a batch's grouped jobs (none for ungrouped batches)."""
    from emqfast.facade.lanes import free_call  # groups imports ops/scripts only; no cycle at import time
    finished = [(g, o[1].id) for o in batch for g in (job_group(o[1]),) if g is not None]
    return [free_call(k, part) for part in chunked(finished, 2000)]


class AckPlan:
    """The calls writing one batch of outcomes, and how to read their replies back per
    outcome. Successes share complete.lua calls of up to ``COMPLETE_CHUNK`` jobs (one
    script call per chunk, not per job: the per-call cost is most of a drain's Redis
    CPU); failures are rare and keep one fail.lua call each."""

    def __init__(self, k: QueueKeys, batch: Sequence[Outcome]):
        self.calls: List[Call] = []
        # per outcome: None (done) / True (retry) / False (failed), as tally() wants
        self.retrying: List[Optional[bool]] = []
        self._slots: List[Tuple[int, int]] = []  # per outcome: (call index, entry or -1)
        done_at: List[int] = []
        for at, outcome in enumerate(batch):
            if outcome[0] == "done":
                done_at.append(at)
                self.retrying.append(None)
                self._slots.append((-1, -1))
            else:
                call, retry = fail_call(k, outcome)
                self._slots.append((len(self.calls), -1))
                self.calls.append(call)
                self.retrying.append(retry)
        for chunk in _chunks_of_results(batch, done_at):
            for entry, at in enumerate(chunk):
                self._slots[at] = (len(self.calls), entry)
            self.calls.append(complete_call(k, [batch[at] for at in chunk]))
        # last: every finished grouped job freed a slot of its group; a group parked at its
        # cap rejoins the turn order and wakes a worker (no reply is read back per outcome)
        self.calls += free_calls(k, batch)

    def replies(self, replies: Sequence[Any]) -> List[Any]:
        """One reply per outcome from the calls' replies: complete.lua's ``[wait, run]``,
        fail.lua's ``[flag, wait, run]``, or an exception (:class:`LeaseLost` for a job
        whose lease was gone; a whole call's error for each of its jobs)."""
        out: List[Any] = []
        for call_at, entry in self._slots:
            reply = replies[call_at]
            if entry >= 0 and not isinstance(reply, Exception):
                reply = reply[entry]
                if isinstance(reply, bytes):  # 'EMQLEASE ...': this job only
                    reply = from_reply(reply.decode()) or LeaseLost(reply.decode())
            out.append(reply)
        return out


def log_context(job: Job) -> dict:
    """``extra=`` for log records about one job: queue, job id, attempt (never payloads,
    results or connection details, which may hold secrets)."""
    return {"queue": job.queue, "job_id": job.id, "attempt": job.attempts}


def tally(stats: Any, batch: Sequence[Outcome], replies: Sequence[Any],
          retrying: Sequence[Optional[bool]]) -> None:
    """Count written outcomes into ``stats``; a lost lease discards the outcome (logged)."""
    for outcome, reply, retry in zip(batch, replies, retrying):
        job = outcome[1]
        ctx = log_context(job)
        if isinstance(reply, LeaseLost):
            stats.lease_lost += 1
            log.warning("emqfast: job %s (queue %s, attempt %d) finished after its lease was "
                        "lost; outcome discarded", job.id, job.queue, job.attempts, extra=ctx)
        elif isinstance(reply, Exception):
            log.error("emqfast: writing outcome of %s (queue %s) failed: %s", job.id, job.queue,
                      reply, extra=ctx)
        elif retry is None:
            stats.completed += 1
            log.debug("emqfast: job %s completed (queue %s, attempt %d)", job.id, job.queue,
                      job.attempts, extra=ctx)
        else:
            if retry:
                stats.retried += 1
            else:
                stats.failed += 1
            # the exception's type and message only: payloads and tracebacks stay in Redis
            log.info("emqfast: job %s %s (queue %s, attempt %d): %s: %s", job.id,
                     "will retry" if retry else "failed", job.queue, job.attempts,
                     type(outcome[3]).__name__, outcome[3], extra=ctx)


def run_times(batch: Sequence[Outcome], replies: Sequence[Any]) -> Observations:
    """The wait/run times complete.lua (``[wait, run]``) and fail.lua (``[flag, wait,
    run]``) returned for a batch, bucketed for one :func:`metrics_call`; refused
    outcomes (lease lost, errors) were not timed."""
    waits, runs = [], []
    for outcome, reply in zip(batch, replies):
        if type(reply) is not list:  # an error reply: not timed
            continue
        if outcome[0] == "done":
            wait, run = reply
        else:
            _, wait, run = reply
        waits.append(wait)
        runs.append(run)
    obs = Observations()
    obs.observe_many("wait", waits)
    obs.observe_many("run", runs)
    return obs


def metrics_call(k: QueueKeys, obs: Observations) -> Call:
    """metrics_add.lua: add a batch's bucketed observations to the metrics hash."""
    return Call(_METRICS_ADD, [k.metrics, k.meta], [KEYSPACE_VERSION, *obs.pairs()])


# --- leases -------------------------------------------------------------------------------

def extend_call(k: QueueKeys, lease_ms: int, pairs: Sequence[Pair]) -> Call:
    """extend.lua for many ``(job id, token)``; the reply holds 1/0 per pair (0: lease lost).
    Callers with an unbounded list use :func:`chunked` (at most ``LEASE_CHUNK`` per call)."""
    return Call(_EXTEND, [k.active, k.leases, k.meta],
                [lease_ms, KEYSPACE_VERSION, *[x for pair in pairs for x in pair]])


def chunked(items: Sequence[Any], size: int = 0) -> List[Sequence[Any]]:
    """``items`` cut into slices of at most ``size`` (default ``LEASE_CHUNK``): one script
    call per slice keeps each call's server work bounded."""
    size = size or LEASE_CHUNK
    return [items[i:i + size] for i in range(0, len(items), size)]


def check_extended(job_id: str, reply: Sequence[Any]) -> None:
    """Raise :class:`LeaseLost` unless a single-job extend succeeded."""
    if not reply or not reply[0]:
        raise LeaseLost(f"lease on {job_id} is no longer held")


def progress_call(k: QueueKeys, job_id: str, token: str, value: Any) -> Call:
    """progress.lua: record a running job's progress (JSON; refused with PayloadError
    before anything is sent when it is not serialisable)."""
    return Call(_PROGRESS, [k.job(job_id), k.leases, k.meta, k.events],
                [job_id, token, codec.encode_result(value), KEYSPACE_VERSION])


def release_call(k: QueueKeys, job_id: str, token: str, group: Optional[str] = None) -> Call:
    """release.lua: hand a claimed job back to pending, or to its group's lane (only with
    its lease token)."""
    pending = k.pending if group is None else k.group_pending(group)
    return Call(_RELEASE, [k.job(job_id), k.active, k.leases, pending, k.marker, k.meta,
                           k.events],
                [job_id, token, KEYSPACE_VERSION])


def release_calls(k: QueueKeys, held: Sequence[Tuple[str, str, Optional[str]]]
                  ) -> Tuple[List[Call], int]:
    """The calls releasing ``(job id, token, group or None)`` s, and how many leading
    replies to skip: a grouped job's group joins the ring first, so its lane is served."""
    from emqfast.facade.lanes import join_call  # groups imports ops/scripts only; no cycle at import time
    groups = sorted({g for _, _, g in held if g is not None})
    calls = [join_call(k, groups)] if groups else []
    return calls + [release_call(k, job_id, token, g) for job_id, token, g in held], len(calls)


def job_group(job: Job) -> Optional[str]:
    """The group a running job was enqueued with (kept in its options), or None."""
    return job.extra.get("g")


# --- waiting ------------------------------------------------------------------------------

def next_schedule_ms(sweep: Any) -> Optional[float]:
    """When to pump schedules next (server ms) after a sweep; None: on the beat only."""
    if sweep.more:  # more were due than one pass takes: come back at once
        return sweep.now_ms
    if sweep.next_run_ms is not None and sweep.next_run_ms > sweep.now_ms:
        return sweep.next_run_ms
    return None  # none, or a head that cannot be minted (logged)


def wait_plan(beat_s: float, now: int, status: int, next_due: int,
              next_schedule: Optional[float]) -> Tuple[float, Optional[int]]:
    """After an empty claim: ``(ms to wait on the marker, due hint)``.

    The wait ends at the beat, the next delayed job's run-at (then promoted:
    the due hint), the rate window's opening (status 2) or the next schedule run,
    whichever comes first.
    """
    wait_ms = beat_s * 1000
    hint = None
    if status in (1, 2) and next_due != -1:
        wait_ms = min(wait_ms, max(next_due - now, 0))
        hint = next_due
    if next_schedule is not None:
        wait_ms = min(wait_ms, max(next_schedule - now, 0))
    return wait_ms, hint


def idle(until_idle: bool, wait_scheduled: bool, status: int, next_due: int, now: int) -> bool:
    """Nothing claimable is left for ``run_until_idle`` (the caller checks its own in-flight)."""
    return until_idle and status == 1 and \
        (next_due == -1 or (not wait_scheduled and next_due > now))


def forget_run(running: Dict[str, Any], outcome: tuple) -> None:
    """Drop the run an outcome belongs to from a Worker's ``running`` map, and only
    that run: a retried job may already be running again under the same id (a new
    lease token) by the time its previous outcome's write returns."""
    current = running.get(outcome[1].id)
    if current is not None and current.token == outcome[2]:
        del running[outcome[1].id]
