"""Dependencies between jobs: ``enqueue(..., depends_on=[...])``, and the step
that releases (or fails) waiting jobs when their dependencies end.

The protocol, one atomic script per slot and every step safe to send again:

1. **Check** (reads only): every dependency exists, else :class:`UnknownDependency` and
   nothing is written.
2. **Write** the dependent in its own slot as ``waiting_deps`` (``dep_enqueue.lua``): its
   hash, ``waitdeps``, its set of remaining dependencies, and a mark on ``deplink`` (the
   queue's zset of jobs whose links are not all sent yet; key ``emq:{q}:deplink``).
3. **Link** it in each dependency's slot (``dep_link.lua``: idempotent). A dependency that
   has already ended is not linked: the dependent is resolved at once
   (``dep_resolve.lua``). Then the mark is cleared.
4. When a linked dependency ends for good, the finish hook (``includes/finished.lua``)
   queues ``"<outcome>\\0<id>"`` on its queue's ``outbox``. :func:`~emqfast.facade.deps.settle_op` (the Workers
   after their acks and on their beat, ``q.settle_dependencies()``) drains it: each
   dependent (SSCAN of the dependency's dependents set) gets ``dep_resolve.lua`` in its
   own slot, then the entry and the set are deleted. A dependent failed there (``"fail"``)
   is queued on its own queue's outbox by the same hook: the cascade, drained in the same
   call when it stays within :data:`DRAIN_ROUNDS`.
5. **Repair**: a producer that died between steps 2 and 3 leaves its mark; :func:`~emqfast.facade.deps.settle_op`
   re-sends the links of jobs marked longer than :data:`REPAIR_GRACE_MS` (idempotent),
   :data:`REPAIR_BATCH` per call; a sweep of the ``dependents`` hash catches jobs that
   ended without the finish hook (:mod:`emqfast.facade.deps`).

A dependency that vanished (deleted, trimmed before a late link) counts as not completed
(outcome ``missing``). A job waiting for dependencies has no delay and no group
(refused together, :class:`~emqfast.errors.InvalidInput`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

from emqfast.backends.scripts import load
from emqfast.core import codec
from emqfast.core.errors import (DependencyCycle, EmqError, InputTypeError, InvalidInput,
                                 UnknownDependency)
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Logic, Op, Returns, operation
from emqfast.core.validation import check_int, check_job_id, check_queue_name
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import options
from emqfast.facade.admission import Job, Shared
from emqfast.facade.job import JobRef

log = logging.getLogger("emqfast.worker")  # the dependency step runs in Workers

DEP_ENQUEUE = load("dep_enqueue")
DEP_LINK = load("dep_link")
DEP_RESOLVE = load("dep_resolve")
DEP_STALE = load("dep_stale")
DEP_CANCEL = load("dep_cancel")

MAX_DEPS = 1000          # dependencies per job (dep_enqueue.lua refuses more too)
DRAIN_ENTRIES = 100      # outbox entries read per round
DRAIN_ROUNDS = 20        # outbox reads per settle call (the cascade included)
SCAN_COUNT = 200         # dependents read per SSCAN
REPAIR_GRACE_MS = 5000   # a mark older than this is a producer that died between steps
REPAIR_BATCH = 50        # jobs re-linked per settle call
ON_DEP_FAILURE = ("fail", "run")
# dep_resolve.lua's replies
RELEASED, FAILED = 1, 2

Dep = Tuple[str, str]  # (queue name, job id)


def deplink_key(k: QueueKeys) -> str:
    """zset of the queue's jobs whose dependency links are not all sent: id -> enqueue ms."""
    return k.base + "deplink"


def member(queue: str, job_id: str) -> str:
    """How a job is named in a deps / dependents set: ``<queue>\\0<job id>``."""
    return queue + "\0" + job_id


def split_member(raw: Any) -> Dep:
    """Inverse of :func:`member` (bytes or str)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    queue, _, job_id = text.partition("\0")
    return queue, job_id


def text_of(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- input ----------------------------------------------------------------------------------

def parse_deps(depends_on: Any, own_queue: str) -> List[Dep]:
    """Validate ``depends_on``: a list of JobRefs (this queue's unless the ref names its
    queue), job ids of this queue, or ``(queue_name, job_id)`` pairs. Duplicates go."""
    if isinstance(depends_on, (str, bytes, bytearray, dict)) or not iterable(depends_on) \
            or is_pair(depends_on):
        raise InputTypeError("depends_on takes a list of dependencies (JobRefs, job ids or "
                             f"(queue, job_id) pairs), not {type(depends_on).__name__}")
    deps: List[Dep] = []
    for item in depends_on:
        dep = one_dep(item, own_queue)
        if dep not in deps:
            deps.append(dep)
    if len(deps) > MAX_DEPS:
        raise InvalidInput(f"a job takes at most {MAX_DEPS} dependencies, got {len(deps)}")
    return deps


def one_dep(item: Any, own_queue: str) -> Dep:
    """One validated dependency (see :func:`parse_deps`)."""
    if isinstance(item, JobRef) or (hasattr(item, "id") and not isinstance(item, tuple)):
        # a ref knows its queue when its Queue made it (JobRef._queue: ref.wait's)
        owner = getattr(item, "_queue", None)
        queue = getattr(item, "queue", None) or getattr(owner, "name", None)
        return check_queue_name(queue) if queue else own_queue, check_job_id(item.id)
    if isinstance(item, str):
        return own_queue, check_job_id(item)
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(x, str)
                                                                  for x in item):
        return check_queue_name(item[0]), check_job_id(item[1])
    raise InputTypeError("a dependency is a JobRef, a job id (str) or a (queue, job_id) pair, "
                         f"not {type(item).__name__}")


def is_pair(value: Any) -> bool:
    """A lone ``(queue, job_id)`` pair passed where a list of them is taken."""
    return isinstance(value, tuple) and len(value) == 2 and \
        all(isinstance(x, str) for x in value) and not value[0].startswith("JOB")


def iterable(value: Any) -> bool:
    try:
        iter(value)
    except TypeError:
        return False
    return True


def check_on_dep_failure(value: Any) -> str:
    """``"fail"`` or ``"run"``."""
    if value not in ON_DEP_FAILURE:
        raise InvalidInput(f"on_dep_failure must be 'fail' or 'run', not {value!r}")
    return str(value)


def with_deps(opts: bytes, deps: Sequence[Dep]) -> bytes:
    """The job's options with its dependency list (``"d"``), which the Worker reads to
    hand the handler :meth:`~emqfast.Job.dependency_results`."""
    decoded = json.loads(opts) if opts else dict(options.DEFAULT_OPTIONS)
    decoded["d"] = [list(dep) for dep in deps]
    return json.dumps(decoded, separators=(",", ":")).encode()


# --- calls ----------------------------------------------------------------------------------

def write_call(k: QueueKeys, job: Job, opts: bytes, priority: int, deps: Sequence[Dep],
               on_dep_failure: str) -> Call:
    """dep_enqueue.lua: the dependent, written as waiting_deps in its own slot."""
    return Call(DEP_ENQUEUE, [k.job(job.id), k.waitdeps, k.job_deps(job.id), deplink_key(k),
                              k.meta, k.counter, k.events],
                [job.id, job.data, job.enc, opts, priority, on_dep_failure, KEYSPACE_VERSION,
                 *(member(q, j) for q, j in deps)])


def link_call(dep: Dep, dependent: str) -> Call:
    """dep_link.lua: ``dependent`` (a member) linked in the slot of ``dep``."""
    dk = QueueKeys(dep[0])
    return Call(DEP_LINK, [dk.job(dep[1]), dk.job_dependents(dep[1]), dk.dependents, dk.meta],
                [dep[1], dependent, KEYSPACE_VERSION])


def resolve_call(k: QueueKeys, job_id: str, dep_member: str, outcome: str,
                 result: Optional[bytes] = None) -> Call:
    """dep_resolve.lua: the dependency ``dep_member`` of ``job_id`` ended with ``outcome``;
    a completed one's stored ``result`` is copied into the dependent's hash."""
    return Call(DEP_RESOLVE, [k.job(job_id), k.job_deps(job_id), k.waitdeps, deplink_key(k),
                              k.pending, k.failed, k.marker, k.meta, k.events, k.metrics,
                              k.waiters, k.dependents, k.outbox],
                [job_id, dep_member, outcome, KEYSPACE_VERSION,
                 *(() if result is None or outcome != "completed" else (result,))])


def result_field(dep_member: str) -> str:
    """The field of a dependent's hash holding the copied result of ``dep_member``."""
    return "dr:" + dep_member


def link_reply(reply: Any) -> Tuple[str, Optional[bytes]]:
    """dep_link.lua's reply as (``linked``, ``missing`` or the final state, the result of
    a completed dependency)."""
    if isinstance(reply, list):
        return text_of(reply[0]), (reply[1] if len(reply) > 1 else None)
    return text_of(reply), None


def cancel_waiting_call(k: QueueKeys, job_id: str) -> Call:
    """dep_cancel.lua: cancel ``job_id`` while it waits for its dependencies (reply 1; 0
    when it is not waiting for them). For ``Queue.cancel`` on a ``waiting_deps`` job."""
    return Call(DEP_CANCEL, [k.job(job_id), k.job_deps(job_id), k.waitdeps, deplink_key(k),
                             k.cancelled, k.meta, k.events, k.waiters, k.dependents, k.outbox],
                [job_id, KEYSPACE_VERSION])


def raise_any(replies: Sequence[Any]) -> None:
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply


# --- enqueue --------------------------------------------------------------------------------

def enqueue_op(k: QueueKeys, job: Job, shared: Shared, depends_on: Any, on_dep_failure: Any,
               wait: Any = None) -> Returns[JobRef]:
    """Enqueue ``job`` waiting for ``depends_on`` (see the module docstring); its status
    is ``waiting_deps``, or ``pending`` / ``failed`` when its dependencies had all ended,
    or ``duplicate`` (a re-run: its unsent links are sent now)."""
    deps = parse_deps(depends_on, k.name)
    odf = check_on_dep_failure(on_dep_failure)
    check_shared(shared, wait)
    if (k.name, job.id) in deps:
        raise DependencyCycle(f"job {job.id} cannot depend on itself")
    if not deps:
        raise InvalidInput("depends_on is empty: enqueue without it")
    yield from check_exist(deps)
    ref: JobRef = yield from admit_op(k, job, shared, deps, odf)
    return ref


def check_shared(shared: Shared, wait: Any = None) -> None:
    """What a job with dependencies cannot have (yet): a delay, a group, wait_replicas."""
    if shared.group is not None or shared.when.mode != b"now" or wait is not None:
        raise InvalidInput("depends_on cannot be combined with a delay, a group or "
                           "wait_replicas (yet)")


class Admit(NamedTuple):
    """One job to admit as waiting for ``deps`` (all known to exist)."""

    keys: QueueKeys
    job: Job
    shared: Shared
    deps: Sequence[Dep]
    odf: str


def admit_op(k: QueueKeys, job: Job, shared: Shared, deps: Sequence[Dep],
             odf: str) -> Returns[JobRef]:
    """Write ``job`` as waiting_deps and link it (its dependencies known to exist)."""
    refs: List[JobRef] = yield from admit_many_op([Admit(k, job, shared, deps, odf)])
    return refs[0]


def admit_many_op(items: Sequence[Admit]) -> Returns[List[JobRef]]:
    """Admit jobs none of which depends on another of them: every write in one pipeline,
    then every link in one (and the resolves of dependencies found ended, and the marks
    cleared). A written job keeps its mark until its links landed."""
    written = yield Batch([write_call(i.keys, i.job, with_deps(i.shared.opts, i.deps),
                                      i.shared.priority, i.deps, i.odf) for i in items])
    raise_any(written)
    todo = [(i, list(i.deps)) for i, w in zip(items, written) if int(w)]
    rerun = [n for n, w in enumerate(w for w in written if int(w)) if int(w) == 2]
    if rerun:  # written before, links unsent: link what it stored, not this call's list
        stored = yield Batch([Cmd.of("SMEMBERS", todo[n][0].keys.job_deps(todo[n][0].job.id))
                              for n in rerun])
        for n, members in zip(rerun, stored):
            todo[n] = (todo[n][0], [split_member(m) for m in members])
    statuses = yield from _link_all([(i.keys, i.job.id, d) for i, d in todo])
    status = {i.job.id: st for (i, _), st in zip(todo, statuses)}
    return [JobRef(i.job.id, "duplicate" if not int(w) or int(w) == 2 else status[i.job.id])
            for i, w in zip(items, written)]


def check_exist(deps: Sequence[Dep]) -> Op:
    """Raise :class:`UnknownDependency` unless every dependency's job hash exists."""
    found = yield Batch([Cmd.of("EXISTS", QueueKeys(q).job(j)) for q, j in deps])
    missing = [dep for dep, n in zip(deps, found) if not int(n)]
    if missing:
        named = ", ".join(f"{q}/{j}" for q, j in missing[:5])
        raise UnknownDependency(f"unknown dependency: {named} (nothing was written)", missing)
    return None


def link_op(k: QueueKeys, job_id: str, deps: Sequence[Dep]) -> Op:
    """Link ``job_id`` in every dependency's slot, resolve those already ended, clear its
    mark. Returns its status: ``waiting_deps``, ``pending`` or ``failed``."""
    statuses = yield from _link_all([(k, job_id, deps)])
    return statuses[0]


Waiting = Tuple[QueueKeys, str, Sequence[Dep]]  # a written job and what it waits for


def _link_all(jobs: Sequence[Waiting]) -> Returns[List[str]]:
    """:func:`link_op` for many jobs: the links pipelined :data:`SCAN_COUNT` at a time."""
    status = ["waiting_deps"] * len(jobs)
    links = [(n, dep) for n, (_, _, deps) in enumerate(jobs) for dep in deps]
    for at in range(0, len(links), SCAN_COUNT):
        chunk = links[at:at + SCAN_COUNT]
        states = yield Batch([link_call(dep, member(jobs[n][0].name, jobs[n][1]))
                              for n, dep in chunk])
        raise_any(states)
        ended = [(n, dep, *link_reply(s)) for (n, dep), s in zip(chunk, states)
                 if link_reply(s)[0] != "linked"]
        if not ended:
            continue
        replies = yield Batch([resolve_call(jobs[n][0], jobs[n][1], member(*dep), outcome,
                                            result) for n, dep, outcome, result in ended])
        raise_any(replies)
        for (n, _, _, _), reply in zip(ended, replies):
            if int(reply) in (RELEASED, FAILED):
                status[n] = "pending" if int(reply) == RELEASED else "failed"
    if jobs:
        yield Batch([Cmd.of("ZREM", deplink_key(k), job_id) for k, job_id, _ in jobs])
    return status


# --- results for the handler ------------------------------------------------------------------

def deps_of(extra: Dict[str, Any]) -> List[Dep]:
    """A running job's dependencies, from its options (``"d"``)."""
    return [(str(q), str(j)) for q, j in extra.get("d") or ()]


def results_op(jobs: Sequence[Any]) -> Op:
    """Read the results of the dependencies of ``jobs`` (running :class:`~emqfast.Job` s
    with a ``"d"`` option) into each job's ``dependency_results()``: one pipeline."""
    wanted = [(job, dep) for job in jobs for dep in deps_of(job.extra)]
    if not wanted:
        return None
    # the copy in the job's own hash (dep_resolve.lua) outlives the dependency's record,
    # which retention may have trimmed; the dependency's hash answers for a job without one
    rows = yield Batch([cmd for job, (q, j) in wanted for cmd in (
        Cmd.of("HGET", QueueKeys(job.queue).job(job.id), result_field(member(q, j))),
        Cmd.of("HMGET", QueueKeys(q).job(j), "state", "result"))])
    found: Dict[int, Dict[str, Any]] = {id(job): {} for job in jobs}
    for n, (job, (_, dep_id)) in enumerate(wanted):
        copied, (state, result) = rows[2 * n], rows[2 * n + 1]
        if copied is None and state == b"completed":
            copied = result
        found[id(job)][dep_id] = None if copied is None else codec.decode_result(copied)
    for job in jobs:
        job._dep_results = found[id(job)]
    return None


DEP_SWEEP = load("dep_sweep")
SWEEP_COUNT = 200  # dependents-hash entries checked per settle call

@dataclass
class Settled:
    """What one :func:`settle_op` did."""

    told: int = 0       # outbox entries handled (dependencies that ended)
    released: int = 0   # dependents released to pending
    failed: int = 0     # dependents failed ('dependency failed')
    relinked: int = 0   # waiting jobs whose unsent links the repair sent
    swept: int = 0      # ended jobs the sweep found still owing their dependents a word
    cursor: int = 0     # where the next sweep of the dependents hash resumes (0: the start)
    busy: bool = False  # the queue has dependency links in play (worth draining often)
    unlinked: int = 0   # jobs of the queue marked on deplink (links not all sent)


def settle_op(k: QueueKeys, grace_ms: Optional[int] = None, repair: bool = True,
              cursor: int = 0) -> Returns[Settled]:
    """Drain ``k``'s outbox (and, for the cascade, the outboxes of queues whose jobs it
    failed); with ``repair`` also re-send unsent links older than ``grace_ms`` (default
    :data:`~emqfast.facade.deps.REPAIR_GRACE_MS`) and sweep one chunk of the dependents
    hash from ``cursor``. Bounded by :data:`~emqfast.facade.deps.DRAIN_ROUNDS` reads."""
    grace_ms = REPAIR_GRACE_MS if grace_ms is None else grace_ms
    done = Settled(cursor=cursor)
    yield from _drain(k, done)  # its first read says whether more is worth a round trip
    if repair and done.busy:
        yield from sweep_op(k, done)
        if done.swept:  # drained in this same call
            yield from _drain(k, done)
    if repair and done.unlinked:
        yield from repair_op(k, grace_ms, done)
    return done


def _drain(k: QueueKeys, done: Settled) -> Op:
    todo: List[QueueKeys] = [k]
    rounds = 0
    while todo and rounds < DRAIN_ROUNDS:
        qk = todo.pop(0)
        rounds += 1
        entries, links, unlinked = yield Batch([
            Cmd.of("LRANGE", qk.outbox, 0, DRAIN_ENTRIES - 1), Cmd.of("HLEN", qk.dependents),
            Cmd.of("ZCARD", deplink_key(qk))])
        if qk is k:
            done.busy = done.busy or bool(entries) or bool(int(links))
            done.unlinked = int(unlinked)
        cascaded: Set[str] = set()
        for raw in entries:
            cascaded |= yield from _tell_dependents(qk, raw, done)
        if len(entries) == DRAIN_ENTRIES:
            cascaded.add(qk.name)
        todo += [QueueKeys(name) for name in sorted(cascaded)
                 if name not in {t.name for t in todo}]
    return None


def _tell_dependents(qk: QueueKeys, raw: Any, done: Settled) -> Returns[Set[str]]:
    """Resolve every dependent of one outbox entry, then delete the entry and the set."""
    outcome, _, dep_id = text_of(raw).partition("\0")
    dep = member(qk.name, dep_id)
    key = qk.job_dependents(dep_id)
    # a completed job's result goes along: each dependent keeps a copy, so retention
    # trimming this job before they start loses them nothing
    result = (yield Cmd.of("HGET", qk.job(dep_id), "result")) if outcome == "completed" \
        else None
    cascaded: Set[str] = set()
    cursor: Any = 0
    while True:
        cursor, found = yield Cmd.of("SSCAN", key, cursor, "COUNT", SCAN_COUNT)
        targets = [split_member(m) for m in found]
        if targets:
            replies = yield Batch([resolve_call(QueueKeys(q), j, dep, outcome, result)
                                   for q, j in targets])
            raise_any(replies)
            for (queue, _), reply in zip(targets, replies):
                done.released += int(reply) == RELEASED
                if int(reply) == FAILED:
                    done.failed += 1
                    cascaded.add(queue)
        if int(cursor) == 0:
            break
    yield Batch([Cmd.of("DEL", key), Cmd.of("LREM", qk.outbox, 1, raw)])
    done.told += 1
    return cascaded


def drain_all_op(k: QueueKeys) -> Returns[int]:
    """Drain ``k``'s outbox to the end (not :data:`DRAIN_ROUNDS` at a time): every
    dependency of the queue that ended tells its dependents. Returns entries handled."""
    told = 0
    while True:
        done = Settled()
        yield from _drain(k, done)
        told += done.told
        if not done.told:
            return told


def orphan_dependents_op(k: QueueKeys) -> Returns[int]:
    """After ``k``'s job hashes were deleted (``Queue.obliterate``): every job that
    depends on one of them, on any queue, is told its dependency is ``missing``, so it
    fails or runs per its ``on_dep_failure`` instead of waiting for good. Outbox entries
    left over are told as they ended. Returns the dependencies whose dependents were told."""
    told: int = yield from drain_all_op(k)
    cursor: Any = 0
    while True:
        cursor, found = yield Cmd.of("HSCAN", k.dependents, cursor, "COUNT", SWEEP_COUNT)
        ids = found.keys() if isinstance(found, dict) else found[::2]
        for job_id in ids:
            yield from _tell_dependents(k, "missing\0" + text_of(job_id), Settled())
            told += 1
        if int(cursor) == 0:
            return told


def repair_op(k: QueueKeys, grace_ms: int, done: Settled) -> Op:
    """Re-send the links of jobs marked on ``deplink`` for longer than ``grace_ms``."""
    stale = yield Call(DEP_STALE, [deplink_key(k)], [grace_ms, REPAIR_BATCH])
    for raw in stale:
        job_id = text_of(raw)
        state, deps = yield Batch([Cmd.of("HGET", k.job(job_id), "state"),
                                   Cmd.of("SMEMBERS", k.job_deps(job_id))])
        if state == b"waiting_deps" and deps:
            yield from link_op(k, job_id, [split_member(m) for m in deps])
            done.relinked += 1
        else:  # released, failed or gone meanwhile: nothing left to link
            yield Cmd.of("ZREM", deplink_key(k), job_id)
    return None


def sweep_op(k: QueueKeys, done: Settled) -> Op:
    """One HSCAN chunk of the dependents hash from ``done.cursor``, checked by
    dep_sweep.lua; ``done.cursor`` is left where the next sweep resumes."""
    cursor, found = yield Cmd.of("HSCAN", k.dependents, done.cursor, "COUNT", SWEEP_COUNT)
    done.cursor = int(cursor)
    ids: List[str] = [text_of(i) for i in (found.keys() if isinstance(found, dict) else found[::2])]
    if ids:
        done.swept += int((yield Call(DEP_SWEEP, [k.dependents, k.outbox, k.meta, *k.jobs(ids)],
                                      [KEYSPACE_VERSION, *ids])))
    return None


class QueueDependencies:
    """The dependency step of :class:`~emqfast.Queue` (a mixin: ``keys`` and ``_drive``
    are the Queue's)."""

    keys: QueueKeys
    _drive: Callable[[Op], Any]

    @operation
    def settle_dependencies(self, grace_ms: Optional[int] = None) -> Returns[Settled]:
        """Release (or fail) the jobs waiting on dependencies of this queue that ended:
        drain its outbox, and re-send the links a producer that died between its steps
        left unsent for longer than ``grace_ms``. The Workers run it after their acks and
        on their beat; safe to call any time, from anywhere, as often as you like."""
        if grace_ms is not None:
            check_int(grace_ms, "grace_ms", 0, 1 << 40)
        settled: Settled = yield from settle_op(self.keys, grace_ms)
        while settled.cursor:  # by hand: the whole dependents hash is swept
            more: Settled = yield from settle_op(self.keys, grace_ms, cursor=settled.cursor)
            settled = _add(settled, more)
        return settled


def _add(a: Settled, b: Settled) -> Settled:
    return Settled(told=a.told + b.told, released=a.released + b.released,
                   failed=a.failed + b.failed, relinked=a.relinked + b.relinked,
                   swept=a.swept + b.swept, cursor=b.cursor, busy=a.busy or b.busy)


class DependencyStep:
    """The dependency step of one Worker (``machine``: its WorkerMachine): settle on the
    beat and after acks, load the results of started jobs' dependencies. Its parts are
    operations the Worker's driver runs; a failure is logged, never raised."""

    def __init__(self, machine: Any):
        self.machine = machine
        self.busy = False  # the queue had dependents or outbox entries at the last look
        self.cursor = 0    # where the next sweep of the dependents hash resumes

    def settle(self) -> Logic:
        """On the beat: settle the queue's dependencies (drain, repair, one sweep chunk)."""
        yield from self._settle(repair=True)

    def after_acks(self) -> Logic:
        """After an ack batch: drain the outbox now if the queue has dependency links in
        play (the repair of unsent links is left to the beat)."""
        if self.busy:
            yield from self._settle(repair=False)

    def _settle(self, repair: bool) -> Logic:
        try:
            settled = yield from settle_op(self.machine.queue.keys, repair=repair,
                                           cursor=self.cursor)
        except EmqError as exc:  # never stop a worker over it: the next beat retries
            log.warning("%s: dependency step failed (%s); next beat", self.machine.name, exc)
            return
        if isinstance(settled, Settled):
            self.busy = settled.busy or bool(settled.told or settled.relinked)
            self.cursor = settled.cursor

    def load_results(self, started: Sequence[Tuple[Any, str]]) -> Logic:
        """Fill ``dependency_results()`` of the started jobs that have dependencies."""
        jobs = [job for job, _ in started if job.extra and job.extra.get("d")]
        if not jobs:
            return
        try:
            yield from results_op(jobs)
        except EmqError as exc:
            log.warning("%s: dependency results not read (%s)", self.machine.name, exc)
