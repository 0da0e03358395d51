"""The calls a Worker makes and how their replies read (claim, start, extend, release,
progress), and the wait plan after an empty claim.

No I/O here: each function builds a :class:`~emqfast.core.ops.Call` (a ``(script, keys,
args)`` tuple) or interprets a reply. The worker machine (:mod:`emqfast.worker.machine`)
looks these up on this module when it calls them, so a test may patch one here.
Outcomes live in :mod:`emqfast.worker.outcomes`, the ack calls in
:mod:`emqfast.worker.acks`, the re-send policy in :mod:`emqfast.worker.resend`; the
names re-exported below keep older imports working.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

from emqfast.core import codec
from emqfast.core.errors import LeaseLost
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.backends.scripts import load
from emqfast.worker.rows import JobRows
from emqfast.facade.job import Job

if TYPE_CHECKING:
    from emqfast.facade.schedule_sweep import Sweep

log = logging.getLogger("emqfast.worker")

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
    past its expiry (issue 15) is ended as expired instead: its row is empty, as for a lost
    lease, so it is never run."""
    ids = [i for i, _ in pairs]
    return Call(_START, [k.active, k.leases, k.meta, k.events, k.metrics, k.rate, k.delayed,
                         k.marker, k.grate, k.waiters, k.dependents, k.outbox, k.expired,
                         *k.jobs(ids), *[k.group_rate(g) for g in groups]],
                [KEYSPACE_VERSION, *[x for pair in pairs for x in pair], *groups])


def started_jobs(rows: JobRows, pairs: Sequence[Pair],
                 reply: Sequence[Any]) -> List[Tuple[Job, str]]:
    """The running ``(job, token)`` for each start.lua row (an empty row: lease gone)."""
    return [(rows.job(job_id, row), token) for (job_id, token), row in zip(pairs, reply) if row]


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
