"""What the dashboard's pages show, read through the facade's operations.

Every read is one of the facade's sans-IO operations (``Queue.counts.op``, ``get.op``,
``Schedules.list.op``, ``Leaderboard.top.op``, the heartbeat's ``live_workers_op``...)
or a plain read of a key documented in ARCHITECTURE's keyspace table, stepped together
with :func:`~emqfast.web.lockstep.run_many` so a page costs a few round trips however
many queues it covers. Nothing here writes.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from emqfast.backends.drive import run
from emqfast.core.keys import QueueKeys, queue_meta_glob, queue_names_of
from emqfast.core.ops import Batch, Cmd, Op, Scan
from emqfast.core.redaction import redact
from emqfast.facade.deps import split_member
from emqfast.facade.job import Job
from emqfast.facade.leaderboard import Leaderboard
from emqfast.facade.metrics import physical_keys
from emqfast.facade.partitioned import PartitionedQueue, open_queue
from emqfast.facade.queue import Queue
from emqfast.facade.schedules import Schedule, Schedules
from emqfast.web.lockstep import run_many
from emqfast.facade.workers import WorkerInfo, live_workers_op

log = logging.getLogger("emqfast.web")
STATES = ("scheduled", "pending", "active", "completed", "failed")
# states a queue may also count: jobs waiting for their dependencies, the kept records of
# cancelled and expired jobs (where the library keeps them)
OPTIONAL_STATES = ("waiting_deps", "cancelled", "expired")


def states_of(counts: Dict[str, int]) -> List[str]:
    """The job states ``counts`` (``Queue.counts()``) reports, in their life order."""
    optional = [s for s in OPTIONAL_STATES if s in counts]
    head = [s for s in optional if s == "waiting_deps"]  # it comes before scheduled
    return head + list(STATES) + [s for s in optional if s != "waiting_deps"]
DISCOVERY_TTL_S = 5.0  # a SCAN of a big keyspace is not redone on every poll
PAGE_SIZE = 50
MAX_GROUPS = 100  # lanes listed on a queue page
TIMELINE_SCAN = 4000  # events read at most to build one job's timeline
# stream entries per read: a bulk enqueue's entry holds 100 events, so one read brings
# at most 5,000 of them
TIMELINE_ENTRIES = 50
LEADERBOARD_TOP = 10


@dataclass
class QueueRow:
    """One queue of the overview."""

    name: str
    counts: Dict[str, int] = field(default_factory=dict)
    paused: bool = False
    rate: Optional[Tuple[int, int]] = None
    completed_total: int = 0
    failed_total: int = 0
    partitions: Optional[int] = None  # a partitioned queue: its number of partitions
    error: Optional[str] = None


class Discovery:
    """The queue names on the server (SCAN over ``emq:{*}:meta``, never KEYS), or the
    fixed list the app was given; with ``match`` and ``parse``, other names found the
    same way (the leaderboards: :data:`BOARD_GLOB`, :func:`board_names`).

    A SCAN walks the whole keyspace: with 1M jobs in Redis it takes over a second. So
    only the first request (and ``fresh=True``) waits for one; afterwards the names are
    served from the last SCAN and, once older than :data:`DISCOVERY_TTL_S`, a background
    thread scans again (one at a time), so no page pays for it."""

    def __init__(self, client: Any, fixed: Optional[Sequence[str]] = None,
                 match: Optional[str] = None,
                 parse: Callable[[Any], List[str]] = queue_names_of,
                 ttl_s: float = DISCOVERY_TTL_S):
        self.client = client
        self.fixed = None if fixed is None else sorted({QueueKeys(q).name for q in fixed})
        self.match, self.parse, self.ttl_s = match or queue_meta_glob(), parse, ttl_s
        self._names: Optional[List[str]] = None
        self._at = -1e9
        self._lock = threading.Lock()
        self._scanning = False

    def names(self, fresh: bool = False) -> List[str]:
        if self.fixed is not None:
            return self.fixed
        if fresh or self._names is None:
            self._scan()
        elif time.monotonic() - self._at > self.ttl_s:
            with self._lock:
                start, self._scanning = not self._scanning, True
            if start:
                threading.Thread(target=self._scan, name="emqfast-web-scan", daemon=True).start()
        return self._names or []

    def _scan(self) -> None:
        try:
            names = self.parse(run(self.client, _scan_op(self.match)))
            self._names, self._at = names, time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a background scan keeps the last names
            if self._names is None:
                raise  # the page asking for them fails, and says why (one log line)
            log.warning("emqfast dashboard: queue discovery failed (keeping the last names): "
                        "%r", one_line(exc), exc_info=log.isEnabledFor(logging.DEBUG))
        finally:
            with self._lock:
                self._scanning = False

    def exists(self, name: str) -> bool:
        """Whether queue ``name`` is shown here: listed (if fixed) and its meta hash exists."""
        if self.fixed is not None and name not in self.fixed:
            return False
        return bool(run(self.client, _exists_op(QueueKeys(name).meta)))


def one_line(exc: BaseException) -> str:
    """``exc`` as one line for a log (its type and message, passwords masked)."""
    return redact(" ".join(f"{type(exc).__name__}: {exc}".split()))


def _scan_op(match: str) -> Op:
    return (yield Scan(match, 10_000))


def _exists_op(key: str) -> Op:
    return int((yield Cmd.of("EXISTS", key))) > 0


def _queue_settings_op(q: Queue) -> Op:
    """:func:`_settings_op` of a queue; a partitioned one's over its partitions: paused
    when all are, partition 0's rate limit (each partition's), the counters summed."""
    if not isinstance(q, PartitionedQueue):
        got = yield from _settings_op(q.keys)
        return got
    each = []
    for part in q.partition_queues:
        each.append((yield from _settings_op(part.keys)))
    return (all(paused for paused, _, _ in each), each[0][1],
            (sum(t[0] for _, _, t in each), sum(t[1] for _, _, t in each)))


def _settings_op(keys: QueueKeys) -> Op:
    """Paused flag and rate limit (the meta hash fields ``Queue.is_paused`` and
    ``Queue.rate_limit`` read, in one HMGET) and the metrics hash's outcome counters (the
    overview's rates come from their growth)."""
    (paused, rate_max, window), (done, failed) = yield Batch([
        Cmd.of("HMGET", keys.meta, "paused", "rate_max", "rate_window"),
        Cmd.of("HMGET", keys.metrics, "completed", "failed")])
    limit = (int(rate_max or 0), int(window or 0))
    return paused == b"1", limit if all(limit) else None, (int(done or 0), int(failed or 0))


class Queues:
    """One :class:`Queue` object per name, kept for the next request (an overview polled
    every 2 s over 1,000 queues would otherwise build 1,000 of them each time)."""

    def __init__(self, client: Any):
        self.client = client
        self._made: Dict[str, Queue] = {}

    def of(self, names: Sequence[str]) -> List[Queue]:
        made = self._made
        if len(made) > 4 * max(len(names), 1000):  # names come and go: start over
            made.clear()
        out = []
        for name in names:
            q = made.get(name)
            if q is None:  # opened as it was made: a partitioned queue as one
                q = made[name] = open_queue(name, self.client)
            out.append(q)
        return out


def overview(client: Any, names: Sequence[str],
             cache: Optional[Queues] = None) -> List[QueueRow]:
    """Counts, paused flag, rate limit and outcome totals of every queue, pipelined."""
    queues = (cache or Queues(client)).of(names)
    ops: List[Op] = []
    for q in queues:
        ops += [type(q).counts.op(q), _queue_settings_op(q)]
    results = run_many(client, ops)
    rows = []
    for i, q in enumerate(queues):
        counts, settings = results[2 * i:2 * i + 2]
        row = QueueRow(q.name)
        if isinstance(q, PartitionedQueue):
            row.partitions = q.partitions
        failure = next((r for r in (counts, settings) if isinstance(r, Exception)), None)
        if failure is not None:
            row.error = redact(f"{type(failure).__name__}: {failure}")
        else:
            row.counts = counts
            row.paused, row.rate, (row.completed_total, row.failed_total) = settings
        rows.append(row)
    return rows


@dataclass
class JobLine:
    """One job of a queue page's list (small fields only: never the payload)."""

    id: str
    created_ms: Optional[int]
    attempts: int
    error: Optional[str]
    group: Optional[str]
    exists: bool


def _line_op(holders: List[QueueKeys], job_id: str) -> Op:
    """One job's list line, read from the first of ``holders`` (a partitioned queue's
    partitions) holding it."""
    for keys in holders[:-1]:
        if int((yield Cmd.of("EXISTS", keys.job(job_id)))):
            break
    else:
        keys = holders[-1]
    created, attempts, error, group = yield Cmd.of(
        "HMGET", keys.job(job_id), "created", "attempts", "error", "group")
    text: Callable[[Optional[bytes]], Optional[str]] = (
        lambda v: v.decode("utf-8", "replace") if v is not None else None)
    return JobLine(job_id, int(created) if created else None, int(attempts or 0),
                   (text(error) or "")[:300] or None, text(group),
                   created is not None or attempts is not None)


@dataclass
class QueuePage:
    """What a queue page shows."""

    name: str
    counts: Dict[str, int]
    paused: bool
    rate: Optional[Tuple[int, int]]
    state: str
    start: int
    jobs: List[JobLine]
    groups: List[Dict[str, Any]]
    metrics: Any
    next_due_ms: Optional[int]
    # a partitioned queue: each partition's name and counts, in partition order
    partitions: List[Tuple[str, Dict[str, int]]] = field(default_factory=list)


def queue_page(client: Any, name: str, state: str, start: int) -> QueuePage:
    """A queue's counts and settings, ``PAGE_SIZE`` job ids of ``state`` from index
    ``start``, its group lanes and its metrics (a partitioned queue: over its partitions,
    with each partition's counts)."""
    q = open_queue(name, client)
    kind = type(q)
    counts, paused, rate, metrics, due, ids, groups = run_many(client, [
        kind.counts.op(q), kind.is_paused.op(q), kind.rate_limit.op(q),
        kind.metrics.op(q), kind.next_due_ms.op(q),
        kind.job_ids.op(q, state, start, start + PAGE_SIZE - 1),
        _groups_op(q)])
    for value in (counts, paused, rate, metrics, due, ids, groups):
        if isinstance(value, Exception):
            raise value
    lines = run_many(client, [_line_op(_holders(q), i) for i in ids])
    lanes = _lanes(client, q, groups)
    page = QueuePage(name, counts, paused, rate, state, start,
                     [x for x in lines if isinstance(x, JobLine)], lanes, metrics, due)
    if isinstance(q, PartitionedQueue):
        each = q.partition_counts()
        page.partitions = [(part.name, c) for part, c in zip(q.partition_queues, each)]
    return page


def _holders(q: Queue) -> List[QueueKeys]:
    """The keys that may hold a job of ``q``: its partitions', or its own."""
    if isinstance(q, PartitionedQueue):
        return [part.keys for part in q.partition_queues]
    return [q.keys]


def _groups_op(q: Queue) -> Op:
    """Up to :data:`MAX_GROUPS` group lanes with waiting jobs (over the partitions)."""
    found: List[str] = []
    for keys in _holders(q):
        raw = yield Cmd.of("ZRANGE", keys.groups, 0, MAX_GROUPS - 1)
        found += [g.decode("utf-8", "replace") for g in raw]
    return sorted(set(found))[:MAX_GROUPS]


def _lanes(client: Any, q: Queue, groups: List[str]) -> List[Dict[str, Any]]:
    """Each lane's backlog, active count, cap and rate limit."""
    g = q.groups
    ops: List[Op] = []
    for name in groups:
        ops += [type(g).counts.op(g, name), type(g).concurrency.op(g, name),
                type(g).rate_limit.op(g, name)]
    got = run_many(client, ops)
    lanes = []
    for i, name in enumerate(groups):
        counts, cap, rate = got[3 * i:3 * i + 3]
        if isinstance(counts, Exception):
            continue
        lanes.append({"name": name, "pending": counts["pending"], "active": counts["active"],
                      "cap": None if isinstance(cap, Exception) else cap,
                      "rate": None if isinstance(rate, Exception) else rate})
    return lanes


@dataclass
class Link:
    """A job at the other end of a dependency: where it is, and its state now (None: its
    record is gone)."""

    queue: str
    id: str
    state: Optional[str] = None


@dataclass
class JobPage:
    """What a job page shows."""

    job: Job
    lease_token: Optional[str]
    lease_deadline_ms: Optional[int]
    worker: Optional[str]
    group: Optional[str]
    timeline: List[Any]
    now_ms: int
    depends_on: List[Link] = field(default_factory=list)  # at most MAX_LINKS
    dependents: List[Link] = field(default_factory=list)  # still waiting on it: MAX_LINKS
    dependents_total: int = 0
    # a job failed with "dependency failed": the dependency that did not complete, and how
    culprit: Optional[Link] = None
    culprit_outcome: Optional[str] = None


MAX_LINKS = 200  # dependencies and dependents listed on a job page


def _text(v: Optional[bytes]) -> Optional[str]:
    return v.decode("utf-8", "replace") if v is not None else None


def _lease_op(keys: QueueKeys, job_id: str) -> Op:
    token, deadline, fields, (sec, usec), dependents = yield Batch([
        Cmd.of("HGET", keys.leases, job_id), Cmd.of("ZSCORE", keys.active, job_id),
        Cmd.of("HMGET", keys.job(job_id), "worker", "group", "dep_failed", "dep_outcome"),
        Cmd.of("TIME"), Cmd.of("SCARD", keys.job_dependents(job_id))])
    worker, group, culprit, outcome = (_text(v) for v in fields)
    return (_text(token), int(float(deadline)) if deadline is not None else None, worker,
            group, int(sec) * 1000 + int(usec) // 1000, int(dependents), culprit, outcome)


def _state_op(queue: str, job_id: str) -> Op:
    """A job's state without reading its payload: None when its record is gone."""
    k = QueueKeys(queue)
    state, exists, delayed, active = yield Batch([
        Cmd.of("HGET", k.job(job_id), "state"), Cmd.of("EXISTS", k.job(job_id)),
        Cmd.of("ZSCORE", k.delayed, job_id), Cmd.of("ZSCORE", k.active, job_id)])
    if not int(exists):
        return None
    text = _text(state)
    if text not in (None, "pending", "scheduled"):
        return text
    return "active" if active is not None else "scheduled" if delayed is not None else "pending"


def _dependents_op(keys: QueueKeys, job_id: str) -> Op:
    """Up to :data:`MAX_LINKS` of the jobs still waiting on this one (its dependents set,
    ``<queue>\\0<id>`` members; emptied once they have been told it ended)."""
    found: List[Tuple[str, str]] = []
    cursor: Any = 0
    while len(found) < MAX_LINKS:
        cursor, part = yield Cmd.of("SSCAN", keys.job_dependents(job_id), cursor, "COUNT", 200)
        found += [split_member(m) for m in part]
        if int(cursor) == 0:
            break
    return sorted(found)[:MAX_LINKS]


def _links(client: Any, pairs: Sequence[Tuple[str, str]]) -> List[Link]:
    states = run_many(client, [_state_op(q, j) for q, j in pairs])
    return [Link(q, j, None if isinstance(s, Exception) else s)
            for (q, j), s in zip(pairs, states)]


def _depends_on(job: Job) -> List[Tuple[str, str]]:
    """The job's dependencies as enqueued (``opts`` ``"d"``: ``[[queue, id], ...]``)."""
    raw = job.extra.get("d") if isinstance(job.extra, dict) else None
    return [(str(d[0]), str(d[1])) for d in (raw or [])
            if isinstance(d, (list, tuple)) and len(d) == 2][:MAX_LINKS]


def job_page(client: Any, queue: str, job_id: str) -> Optional[JobPage]:
    """The job, its lease, its dependencies and dependents, and its timeline; None when
    there is no such job."""
    q = open_queue(queue, client)
    if isinstance(q, PartitionedQueue):  # the job's partition holds all it shows
        q = q.find_partition(job_id) or q.partition(0)
    job, lease, waiting = run_many(client, [Queue.get.op(q, job_id), _lease_op(q.keys, job_id),
                                            _dependents_op(q.keys, job_id)])
    for value in (job, lease, waiting):
        if isinstance(value, Exception):
            raise value
    if job is None:
        return None
    token, deadline, worker, group, now, total, culprit, outcome = lease
    page = JobPage(job, token, deadline, worker, group, timeline(q, job), now)
    deps = _depends_on(job)
    links = _links(client, deps + list(waiting))
    page.depends_on, page.dependents = links[:len(deps)], links[len(deps):]
    page.dependents_total = total
    if culprit:
        cq, cid = split_member(culprit)
        page.culprit = next((d for d in page.depends_on if (d.queue, d.id) == (cq, cid)),
                            Link(cq, cid))
        page.culprit_outcome = outcome
    return page


def timeline(q: Queue, job: Job) -> List[Any]:
    """The job's events, oldest first: the stream read from the job's creation on (at most
    :data:`TIMELINE_SCAN` entries, so a busy stream costs a bounded read)."""
    since = f"{max((job.created_ms or 1) - 1, 0)}-0"
    found, seen = [], 0
    while seen < TIMELINE_SCAN:
        batch = q.read_events(since, count=TIMELINE_ENTRIES)
        if not batch:
            break
        seen += len(batch)
        found += [e for e in batch if e.job_id == job.id]
        since = batch[-1].id
    return found


def schedules(client: Any, names: Sequence[str]) -> List[Tuple[str, List[Schedule]]]:
    """Every queue's schedules (queues without any left out)."""
    queues = [open_queue(n, client) for n in names]
    sizes = run_many(client, [type(q.schedules).count.op(q.schedules) for q in queues])
    having = [q for q, n in zip(queues, sizes) if isinstance(n, int) and n > 0]
    lists = run_many(client, [type(q.schedules).list.op(q.schedules) for q in having])
    return [(q.name, found) for q, found in zip(having, lists) if isinstance(found, list)]


BOARD_GLOB = "emq:{lb:*}:board"
# boards come and go rarely; a SCAN of a big keyspace costs Redis real time, so the
# leaderboards page rescans at most this often, whoever polls it
BOARD_TTL_S = 30.0
MAX_BOARDS = 200  # boards listed on the page (the first by name)


def board_names(keys: Any) -> List[str]:
    """Leaderboard names from their keys (``emq:{lb:<name>}:board``), sorted."""
    return sorted({k.decode("utf-8", "replace")[len("emq:{lb:"):-len("}:board")]
                   for k in keys})


def leaderboards(client: Any, names: Sequence[str],
                 top: int = LEADERBOARD_TOP) -> List[Tuple[str, List[Any]]]:
    """The boards ``names`` (found by a :class:`Discovery` over :data:`BOARD_GLOB`, whose
    SCAN is shared by every request for :data:`BOARD_TTL_S`) and their top entries."""
    names = list(names)[:MAX_BOARDS]
    boards = [Leaderboard(client, n) for n in names]
    tops = run_many(client, [Leaderboard.top.op(b, top) for b in boards])
    return [(n, t if isinstance(t, list) else []) for n, t in zip(names, tops)]


def workers(client: Any, names: Sequence[str]) -> List[WorkerInfo]:
    """The live workers of every queue, freshest beat first."""
    found = run_many(client, [live_workers_op(keys) for n in names
                              for keys in physical_keys(client, n)])  # partitions too
    rows: Dict[str, WorkerInfo] = {}
    for got in found:  # a worker of several queues (or partitions) beats in each: once
        for w in got if isinstance(got, list) else []:
            if w.token not in rows or w.age_ms < rows[w.token].age_ms:
                rows[w.token] = w
    return sorted(rows.values(), key=lambda w: (w.age_ms, w.token))
