"""Writing a batch of outcomes: the calls (:class:`AckPlan`) and reading their replies.

No I/O here. Successes share complete.lua calls, each failure has a fail.lua call of
its own, grouped jobs free their group's slot (group_free.lua); the replies come back
one per outcome, and the run times they carry feed one metrics_add.lua call.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from emqfast.core.errors import LeaseLost, from_reply
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.backends.scripts import load
from emqfast.facade.metrics import Observations
from emqfast.worker.outcomes import Done, Failed, Outcome, job_group, retry_delay_ms

_COMPLETE = load("complete")
_FAIL = load("fail")
_METRICS_ADD = load("metrics_add")

# Successful outcomes per complete.lua call: one call's Lua run stays ~1-2 ms, well inside
# the 20 ms a busy host may stretch it to...
COMPLETE_CHUNK = 128
COMPLETE_CHUNK_BYTES = 1 << 20  # ...and about this much result JSON
FREE_CHUNK = 2000  # finished grouped jobs per group_free.lua call


_VERSION = KEYSPACE_VERSION.encode()


def complete_call(k: QueueKeys, done: Sequence[Done]) -> Call:
    """complete.lua for many successful outcomes: one call, one reply entry per job. Each
    job's attempt, start and wait go along, as start.lua reported them, so the script
    need not read them back from every job hash. Keys and arguments go as bytes (what
    redis-py would send): the Batcher then joins them as they are, with no per-value
    encoding pass on the drain's hot path (issue 12)."""
    keys = [x.encode() for x in (k.active, k.leases, k.completed, k.meta, k.events,
                                  k.metrics, k.waiters, k.dependents, k.outbox)]
    job_key = k.job("").encode()
    args: List[Any] = [_VERSION]
    for o in done:
        job = o.job
        job_id = job.id.encode()
        keys.append(job_key + job_id)
        started = job.started_ms
        if started is None:
            args += (job_id, o.token.encode(), o.result, *run_record(job))
            continue
        due = job.run_at_ms if job.run_at_ms is not None else job.created_ms  # run_record's
        args += (job_id, o.token.encode(), o.result, b"%d" % job.attempts, b"%d" % started,
                 b"%d" % (max(started - due, 0) if due is not None else -1))
    return Call(_COMPLETE, keys, args)


def run_record(job: Any) -> Tuple[bytes, bytes, bytes]:
    """(attempt, started ms, wait ms) of a running job for complete.lua, as bytes; empty for
    all three when the job does not know when it started (the script then reads its hash).
    The wait runs from when the job was due (its run-at, else its creation) to its start."""
    started = job.started_ms
    if started is None:
        return b"", b"", b""
    due = job.run_at_ms if job.run_at_ms is not None else job.created_ms
    wait = max(started - due, 0) if due is not None else -1
    return b"%d" % job.attempts, b"%d" % started, b"%d" % wait


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


def _chunks_of_results(batch: Sequence[Outcome], done_at: List[int]) -> List[List[int]]:
    """``done_at`` (indexes of successes in ``batch``) cut into complete.lua calls of at
    most ``COMPLETE_CHUNK`` jobs and about ``COMPLETE_CHUNK_BYTES`` of results: one script
    call is one command, and Redis drops a client whose single command outgrows its query
    buffer limit (1 GB by default), which 200 large results could; a pipeline of small
    calls never does."""
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
    from emqfast.facade.lanes import free_call  # groups imports ops/scripts only; no cycle at import time
    if not any(o.job.extra for o in batch):  # the common case: nothing grouped
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
        done_at: List[int] = []
        if not any(isinstance(outcome, Failed) for outcome in batch):  # all done: at once
            done_at = list(range(len(batch)))
            self.retrying = [None] * len(batch)
            self._slots = [(-1, -1)] * len(batch)
        for at, outcome in enumerate(batch if not done_at else ()):
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
            self.calls.append(complete_call(k, [batch[at] for at in chunk]))  # type: ignore[misc]
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


def run_times(batch: Sequence[Outcome], replies: Sequence[Any]) -> Observations:
    """The wait/run times complete.lua (``[wait, run]``) and fail.lua (``[flag, wait,
    run]``) returned for a batch, bucketed for one :func:`metrics_call`; refused
    outcomes (lease lost, errors) were not timed."""
    waits, runs = [], []
    for outcome, reply in zip(batch, replies):
        if type(reply) is not list:  # an error reply: not timed
            continue
        wait, run = reply[-2:]  # fail.lua's reply leads with its retry flag
        waits.append(wait)
        runs.append(run)
    obs = Observations()
    obs.observe_many("wait", waits)
    obs.observe_many("run", runs)
    return obs


def metrics_call(k: QueueKeys, obs: Observations) -> Call:
    """metrics_add.lua: add a batch's bucketed observations to the metrics hash."""
    return Call(_METRICS_ADD, [k.metrics, k.meta], [KEYSPACE_VERSION, *obs.pairs()])
