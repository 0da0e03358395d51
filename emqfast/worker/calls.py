"""The calls a Worker makes and how their replies read: claim, start (and the start rows
turned into :class:`~emqfast.Job` s), extend, release, progress, the outcome writes
(complete, fail, cancel_active, metrics_add: :class:`AckPlan`), and the wait plan after an
empty claim.

No I/O here: each function builds a :class:`~emqfast.core.ops.Call` (a ``(script, keys,
args)`` tuple) or reads a reply. The worker machine looks these up on this module when it
calls them, so a test may patch one here.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from emqfast.backends.scripts import load
from emqfast.core import codec
from emqfast.core.errors import LeaseLost, PayloadError, from_reply
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import options
from emqfast.facade.job import Job
from emqfast.facade.lanes import free_call, join_call
from emqfast.facade.metrics import Observations
from emqfast.facade.schedule_sweep import Sweep
from emqfast.worker.outcomes import CancelledRun, Done, Failed, Outcome, job_group, retry_delay_ms



_CLAIM = load("claim")
_START = load("start")
_EXTEND = load("extend")
_RELEASE = load("release")
_PROGRESS = load("progress")

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
# Claimed jobs per start.lua call: one call's Lua run stays ~1-2 ms, well inside the
# 20 ms a busy host may stretch it to (acks.COMPLETE_CHUNK likewise for complete.lua).
START_CHUNK = 128
START_PIPELINE = 8 * START_CHUNK  # jobs a Worker starts per round trip, at most
# Leases extended / jobs released per script call (bounded server work per call).
LEASE_CHUNK = 500

Pair = Tuple[str, str]  # (job id, lease token)


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


CLAIM_PAUSED, CLAIM_OK, CLAIM_RATE_LIMITED = 0, 1, 2  # parse_claim's status


def claimed_any(reply: Sequence[Any]) -> bool:
    """Did this claim reply lease any job? (:func:`parse_claim`'s pairs are not empty;
    read without decoding them.)"""
    end = len(reply) - 1 if len(reply) % 2 == 0 and isinstance(reply[-1], list) else len(reply)
    return end > 3


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
    a job already started by its token is reported as started, not counted again. A job
    past its expiry is ended as expired instead: its row is empty, as for a lost
    lease, so it is never run."""
    ids = [i for i, _ in pairs]
    return Call(_START, [k.active, k.leases, k.meta, k.events, k.metrics, k.rate, k.delayed,
                         k.marker, k.grate, k.waiters, k.dependents, k.outbox, k.expired,
                         *k.jobs(ids), *[k.group_rate(g) for g in groups]],
                [KEYSPACE_VERSION, *[x for pair in pairs for x in pair], *groups])


def started_jobs(rows: JobRows, pairs: Sequence[Pair],
                 reply: Sequence[Any]) -> List[Tuple[Job, str]]:
    """The running ``(job, token)`` for each job start.lua started (of its flat reply)."""
    return rows.jobs(pairs, reply)


START_COLUMNS = 9  # a full row of start.lua: the values of one job


def start_rows(reply: Sequence[Any]) -> List[Any]:
    """start.lua's flat reply (its start instant, then a variable-width row per job) as one
    entry per job: the job's full row of ``START_COLUMNS`` values (``[attempts, payload,
    enc, opts, created, run_at, started, cancel, failed_before]``) when it started, else 0
    (lease gone, parked, expired)."""
    rows: List[Any] = []
    now, at, end = reply[0], 1, len(reply)
    while at < end:
        first = reply[at]
        if not first:
            rows.append(0)
            at += 1
        elif first > 0:  # the short row: no opts, run-at, cancel or failure; started now
            rows.append([first, reply[at + 1], reply[at + 2], None, reply[at + 3], None, now,
                         None, None])
            at += 4
        else:  # -1, then the full row
            rows.append(list(reply[at + 1:at + 1 + START_COLUMNS]))
            at += 1 + START_COLUMNS
    return rows


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
    groups = sorted({g for _, _, g in held if g is not None})
    calls = [join_call(k, groups)] if groups else []
    return calls + [release_call(k, job_id, token, g) for job_id, token, g in held], len(calls)


# --- waiting ------------------------------------------------------------------------------

def next_schedule_ms(sweep: Sweep) -> Optional[float]:
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


# --- start rows -> jobs --------------------------------------------------------------

_new_job = Job.__new__


class JobRows:
    """Builds the running :class:`Job` of one ``start.lua`` row, like ``Job.from_hash``.

    Per options blob it keeps a base dict (every field at its default, the options'
    fields set), so a job costs one dict built from it and the row's own values."""

    _MAX_CACHED = 256

    def __init__(self, queue: str):
        self.queue = queue
        # opts blob -> (base fields, None); options with extras are not cached: they may
        # hold mutable values, so each job parses its own
        self._bases: Dict[bytes, Tuple[Dict[str, Any], Optional[Dict[str, Any]]]] = {}
        # every field at its default, as Job(...) would set it
        self._template = dict(Job(id="", queue=queue, state="active", payload=None).__dict__)

    def _base(self, opts: Optional[bytes]) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
        key = opts or b""
        hit = self._bases.get(key)
        if hit is not None:
            return hit
        # no 'opts' (start.lua's nil) or an empty one: the library defaults
        parsed = options.decode(opts)  # PayloadError: the caller's
        # (the fast way's jobs: start.lua found no earlier failure; job() says for the rest)
        base = dict(self._template, max_attempts=parsed.max_attempts,
                    priority=parsed.priority, backoff=parsed.backoff, _clean_start=True)
        hit = (base, parsed.extra or None)
        if hit[1] is None:  # extra options may hold mutable values: each job parses its own
            if len(self._bases) >= self._MAX_CACHED:
                self._bases.clear()
            self._bases[key] = hit
        return hit

    def jobs(self, pairs: Sequence[Pair], reply: Sequence[Any]) -> List[Tuple[Job, str]]:
        """The running ``(job, token)`` for each job of start.lua's flat reply (its start
        instant, then per pair a short row, a full row after -1, or 0: not started). A
        row with cached options, no cancel mark and no earlier failure takes the short
        way."""
        out = []
        bases, new, cls, decode = self._bases, _new_job, Job, codec.decode
        now, at = reply[0], 1
        for job_id, token in pairs:
            first = reply[at]
            if not first:
                at += 1
                continue
            if first > 0:  # short: no opts, run-at, cancel or failure; started now
                attempts, payload, enc, created = first, reply[at + 1], reply[at + 2], \
                    reply[at + 3]
                opts = run_at = cancel = failed = None
                started = now
                at += 4
            else:
                attempts, payload, enc, opts, created, run_at, started, cancel, failed = \
                    reply[at + 1:at + 1 + START_COLUMNS]
                at += 1 + START_COLUMNS
            if not cancel and not failed and type(created) is int:
                hit = bases.get(opts or b"")
                if hit is not None and type(started) is int \
                        and (run_at is None or type(run_at) is int):
                    if enc != b"b":
                        try:
                            payload = decode(payload, enc)
                        except PayloadError:  # the long way records it
                            out.append((self.job(job_id, [attempts, payload, enc, opts,
                                                          created, run_at, started, cancel,
                                                          failed]), token))
                            continue
                    job = new(cls)
                    job.__dict__ = dict(hit[0], id=job_id, payload=payload,
                                        attempts=attempts, created_ms=created,
                                        run_at_ms=run_at, started_ms=started, extra={})
                    out.append((job, token))
                    continue
            out.append((self.job(job_id, [attempts, payload, enc, opts, created, run_at,
                                          started, cancel, failed]), token))
        return out

    def job(self, job_id: str, row: Any) -> Job:
        """``row`` = ``[attempts, payload, enc, opts, created, run_at, started, cancel,
        failed_before]``, one job's values from start.lua (``enc``, ``opts`` and ``run_at``
        are None when the hash omits them: JSON, the default options, never delayed; the
        times are ints, or bytes from rows of older scripts, which may end after
        ``created`` or ``started``). A ``cancel`` mark (a cancel asked for while the job
        was held unstarted) sets ``_cancel_at_start``: the Worker stops the run as it
        begins. A full row without ``failed_before`` (the hash held no earlier run's
        failure) sets ``_clean_start``: complete.lua need not clear one."""
        attempts, payload, enc, opts, created, *times = row
        run_at, started = times[:2] if times else (None, None)
        undecodable = None
        try:
            base, extra = self._base(opts)
            payload = payload if enc == b"b" else codec.decode(payload, enc)
        except PayloadError as exc:  # one corrupt hash must not stop the worker
            undecodable = exc
            base, extra = self._base(None)
        fields = dict(base, id=job_id, payload=payload, attempts=int(attempts),
                      created_ms=int(created) if created is not None else None,
                      run_at_ms=int(run_at) if run_at is not None else None,
                      started_ms=int(started) if started is not None else None,
                      extra=dict(extra) if extra else {})
        if undecodable is not None:
            fields["_undecodable"] = undecodable
        fields["_clean_start"] = len(times) == 4 and not times[3]
        if len(times) > 2 and times[2]:
            fields["_cancel_at_start"] = True
        job = _new_job(Job)
        job.__dict__ = fields
        return job


# --- writing outcomes ----------------------------------------------------------------

_COMPLETE = load("complete")
_FAIL = load("fail")
_METRICS_ADD = load("metrics_add")

# Successful outcomes per complete.lua call: one call's Lua run stays ~1-2 ms, well inside
# the 20 ms a busy host may stretch it to...
COMPLETE_CHUNK = 128
COMPLETE_CHUNK_BYTES = 1 << 20  # ...and about this much result JSON
FREE_CHUNK = 2000  # finished grouped jobs per group_free.lua call


_VERSION = KEYSPACE_VERSION.encode()
# the end of complete.lua's run argument: b":c" when start.lua found no earlier failure to
# clear
_CLEAN = {True: b":c", False: b""}


def complete_call(k: QueueKeys, done: Sequence[Done]) -> Call:
    """complete.lua for many successful outcomes: one call, one reply entry per job. Each
    job's attempt and start go along, as start.lua reported them, so the script need not
    read them back from every job hash. Keys and arguments go as bytes (what redis-py
    would send): the Batcher then joins them as they are, with no per-value encoding
    pass on the drain's hot path."""
    return _complete(k, done)[0]


def _complete(k: QueueKeys, done: Sequence[Done]) -> Tuple[Call, List[int]]:
    """:func:`complete_call` and each job's wait (due -> started ms, -1: not known): the
    script answers a timed run with its run ms alone."""
    keys = [x.encode() for x in (k.active, k.leases, k.completed, k.meta, k.events,
                                  k.metrics, k.waiters, k.dependents, k.outbox)]
    job_key = k.job("").encode()
    args: List[Any] = [_VERSION]
    waits: List[int] = []
    # the last run text, as bytes: it repeats from job to job (one start.lua call stamps
    # all its jobs with one instant and mostly one attempt)
    attempts_was = started_was = -1
    clean_was = None
    run = b""
    add_key, add_wait = keys.append, waits.append
    for job, token, result in done:
        job_id = job.id.encode()
        add_key(job_key + job_id)
        started = job.started_ms
        if started is None:
            args += (job_id, token.encode(), result, b"")  # the script reads the hash
            add_wait(-1)
            continue
        due = job.run_at_ms
        if due is None:
            due = job.created_ms  # the wait runs from when the job was due
        add_wait(-1 if due is None else started - due if started > due else 0)
        attempts, clean = job.attempts, job._clean_start
        if started != started_was or attempts != attempts_was or clean is not clean_was:
            attempts_was, started_was, clean_was = attempts, started, clean
            run = b"%d:%d%s" % (attempts, started, _CLEAN[clean])
        args += (job_id, token.encode(), result, run)
    return Call(_COMPLETE, keys, args), waits


def fail_call(k: QueueKeys, outcome: Failed) -> Tuple[Call, bool]:
    """fail.lua for one failed outcome, and whether the job will retry."""
    job = outcome.job
    delay = retry_delay_ms(job, outcome.may_retry)
    if delay == 0 and job_group(job) is not None:
        # fail.lua re-pends a zero-delay retry on the flat pending set; a grouped job
        # must rejoin its lane, which promote does (it knows the job's group)
        delay = 1
    message = f"{type(outcome.exc).__name__}: {outcome.exc}"
    return Call(_FAIL, [k.job(job.id), k.active, k.leases, k.failed, k.delayed, k.pending,
                        k.marker, k.meta, k.events, k.metrics, k.waiters, k.dependents,
                        k.outbox],
                [job.id, outcome.token, delay, message, outcome.traceback,
                 KEYSPACE_VERSION]), delay >= 0


_RESULT = attrgetter("result")
_EXTRA = attrgetter("job.extra")


def has_kind(batch: Sequence[Outcome], kind: type) -> bool:
    """Is any outcome of ``batch`` a ``kind``? (Its types are collected in one C pass: a
    batch holds a type or two, and this runs on every ack batch.)"""
    return any(issubclass(t, kind) for t in set(map(type, batch)))


def _chunks_of_results(batch: Sequence[Outcome], done_at: List[int]) -> List[List[int]]:
    """``done_at`` (indexes of successes in ``batch``) cut into complete.lua calls of at
    most ``COMPLETE_CHUNK`` jobs and about ``COMPLETE_CHUNK_BYTES`` of results: one script
    call is one command, and Redis drops a client whose single command outgrows its query
    buffer limit (1 GB by default), which 200 large results could; a pipeline of small
    calls never does."""
    total = sum(map(len, map(_RESULT, map(batch.__getitem__, done_at))))
    if total <= COMPLETE_CHUNK_BYTES:  # the common case: cut by count alone
        return [done_at[i:i + COMPLETE_CHUNK] for i in range(0, len(done_at), COMPLETE_CHUNK)]
    chunks: List[List[int]] = []
    size = 0
    for at in done_at:
        result = len(batch[at].result)  # type: ignore[union-attr]
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
    if not any(map(_EXTRA, batch)):  # the common case: nothing grouped
        return []
    finished = [(g, o.job.id) for o in batch for g in (job_group(o.job),) if g is not None]
    return [free_call(k, finished[i:i + FREE_CHUNK])
            for i in range(0, len(finished), FREE_CHUNK)]


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
        self._waits: List[int] = [-1] * len(batch)  # per outcome: its wait, for a timed run
        # all done (the drain's case): the complete calls in batch order, their sizes
        self._sizes: Optional[List[int]] = None
        done_at: List[int] = []
        if not has_kind(batch, Failed):  # all done: at once
            self.retrying = [None] * len(batch)
            self._waits, self._sizes = [], []
            for chunk in _chunks_of_results(batch, list(range(len(batch)))):
                call, waits = _complete(k, batch[chunk[0]:chunk[-1] + 1])  # type: ignore[arg-type]
                self._sizes.append(len(chunk))
                self._waits += waits
                self.calls.append(call)
            self.calls += free_calls(k, batch)
            return
        for at, outcome in enumerate(batch):
            if isinstance(outcome, Failed):
                call, retry = fail_call(k, outcome)
                self._slots.append((len(self.calls), -1))
                self.calls.append(call)
                self.retrying.append(retry)
            else:
                done_at.append(at)
                self.retrying.append(None)
                self._slots.append((-1, -1))
        for chunk in _chunks_of_results(batch, done_at):
            for entry, at in enumerate(chunk):
                self._slots[at] = (len(self.calls), entry)
            call, waits = _complete(k, [batch[at] for at in chunk])  # type: ignore[misc]
            self.calls.append(call)
            for at, wait in zip(chunk, waits):
                self._waits[at] = wait
        # last: every finished grouped job freed a slot of its group; a group parked at its
        # cap rejoins the turn order and wakes a worker (no reply is read back per outcome)
        self.calls += free_calls(k, batch)

    def replies(self, replies: Sequence[Any]) -> List[Any]:
        """One reply per outcome from the calls' replies: ``[wait, run]`` for a completed
        job (complete.lua's run ms joined with the wait the plan sent), fail.lua's
        ``[flag, wait, run]``, or an exception (:class:`LeaseLost` for a job whose lease
        was gone; a whole call's error for each of its jobs)."""
        if self._sizes is not None:
            return self._all_done(replies)
        out: List[Any] = []
        waits = self._waits
        for at, (call_at, entry) in enumerate(self._slots):
            reply = replies[call_at]
            if entry >= 0 and not isinstance(reply, Exception):
                reply = reply[entry]
                if type(reply) is int:  # the run ms (-1: a re-sent ack, timed already)
                    reply = [waits[at] if reply >= 0 else -1, reply]
                elif isinstance(reply, bytes):  # 'EMQLEASE ...': this job only
                    reply = from_reply(reply.decode()) or LeaseLost(reply.decode())
            out.append(reply)
        return out


    def _all_done(self, replies: Sequence[Any]) -> List[Any]:
        """:meth:`replies` of a batch of successes alone: its complete.lua calls' entries
        in order, read call by call (no per-outcome slot lookups)."""
        out: List[Any] = []
        waits = iter(self._waits)
        for reply, size in zip(replies, self._sizes or ()):
            if isinstance(reply, Exception):  # the whole call failed: each of its jobs
                out += [reply] * size
                for _ in range(size):
                    next(waits)
                continue
            for entry, wait in zip(reply, waits):
                if type(entry) is int:  # the run ms (-1: a re-sent ack, timed already)
                    out.append([wait if entry >= 0 else -1, entry])
                elif isinstance(entry, bytes):  # 'EMQLEASE ...': this job only
                    out.append(from_reply(entry.decode()) or LeaseLost(entry.decode()))
                else:
                    out.append(entry)
        return out


def run_times(batch: Sequence[Outcome], replies: Sequence[Any]) -> Observations:
    """The wait/run times complete.lua (``[wait, run]``) and fail.lua (``[flag, wait,
    run]``) returned for a batch, bucketed for one :func:`metrics_call`; refused
    outcomes (lease lost, errors) were not timed."""
    timed = [reply for reply in replies if type(reply) is list]  # (an error: not timed)
    waits = [reply[-2] for reply in timed]  # fail.lua's reply leads with its retry flag
    runs = [reply[-1] for reply in timed]
    obs = Observations()
    obs.observe_many("wait", waits)
    obs.observe_many("run", runs)
    return obs


def metrics_call(k: QueueKeys, obs: Observations) -> Call:
    """metrics_add.lua: add a batch's bucketed observations to the metrics hash."""
    return Call(_METRICS_ADD, [k.metrics, k.meta], [KEYSPACE_VERSION, *obs.pairs()])

_CANCEL_ACTIVE = load("cancel_active")


def cancel_active_call(k: QueueKeys, run: CancelledRun) -> Call:
    """cancel_active.lua: end a run of ours as cancelled (fenced by its lease token)."""
    return Call(_CANCEL_ACTIVE, [k.job(run.job.id), k.active, k.leases, k.cancelled, k.meta,
                                 k.events, k.metrics, k.waiters, k.dependents, k.outbox],
                [run.job.id, run.token, KEYSPACE_VERSION])


# --- the heartbeat ------------------------------------------------------------------------

_HEARTBEAT = load("heartbeat")
BEATS_KEPT = 3  # a record outlives its last beat by this many beats
MIN_TTL_MS = 3000  # ... and at least this long (a beat may be late under load)


def beat_call(keys: QueueKeys, token: str, ttl_ms: int, fields: Dict[str, Any]) -> Call:
    """heartbeat.lua recording ``fields`` for worker ``token``, alive for ``ttl_ms``."""
    pairs = [x for item in fields.items() for x in (item[0], str(item[1]))]
    return Call(_HEARTBEAT, [keys.worker_record(token), keys.workers, keys.meta],
                [token, ttl_ms, KEYSPACE_VERSION, *pairs])
