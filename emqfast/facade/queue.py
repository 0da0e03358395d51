"""The producer facade of one queue: :class:`Queue`, whose enqueue paths live here and
whose reads, control writes and housekeeping moves come from its mixins
(:mod:`~emqfast.facade.inspection`, :mod:`~emqfast.facade.control`,
:meth:`Queue.promote`, :meth:`Queue.reap`, :meth:`Queue.trim` below). Enqueue framing is in
:mod:`~emqfast.facade.admission`, bulk streaming and partial failures in
:mod:`~emqfast.facade.enqueue_batch`."""
from __future__ import annotations

import functools
import inspect
from typing import Any, Iterable, List, Optional, Sequence, Sized, Tuple

import redis

from emqfast.backends import select as backend
from emqfast.backends.drive import run
from emqfast.backends.scripts import load
from emqfast.core import codec, ids
from emqfast.core.errors import InputTypeError, InvalidInput, PartialBatch
from emqfast.core.gcpause import BULK, gc_paused
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import (REAP_BATCH, TRIM_BATCH, Batch, Call, Cmd, Gathered, Op, Returns,
                              Scan, batches, chunks, operation)
from emqfast.core.scores import MAX_RUN_AT_MS
from emqfast.core.times import Delay, RunAt, delay_ms
from emqfast.core.validation import check_int, check_new_job_id
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import admission, deps, job_wait, lanes, options, tracing
from emqfast.facade.admission import ADMITTED, MAX_ATTEMPTS, Job, Shared
from emqfast.facade.control import QueueControl
from emqfast.facade.dedupe import check_key, extras as dedupe_extras, key_list
from emqfast.facade.deps import QueueDependencies
from emqfast.facade.enqueue_batch import EnqueueBatch, admit_many, retry_partial
from emqfast.facade.group_commit import LIMIT, Entry, flush_op
from emqfast.facade.groups import Groups
from emqfast.facade.inspection import QueueInspection
from emqfast.facade.job import JobRef
from emqfast.facade.keyed import admit_one
from emqfast.facade.options import DEFAULT_BACKOFF, Backoff
from emqfast.facade.promote import expired_leases, parse_due, promote_op
from emqfast.facade.schedules import Schedules
from emqfast.facade.job_wait import QueueWaiting, binds_refs
from emqfast.server.connection import resolve

__all__ = ["Queue"]


_REAP = load("reap")
_TRIM = load("trim")
MAX_MOVE_LIMIT = 1_000_000  # the most jobs one promote/reap/trim call may handle in all
TRIM_LIMIT = 50_000  # trim's default per finished set: bounds one Worker beat too


def _with_extras(shared: Shared, dedupe_key: Optional[str], dedupe_ms: Optional[Delay],
                 dedupe: Optional[str], expires_ms: Optional[Delay],
                 has_deps: bool) -> Tuple[Optional[str], Shared]:
    """A single enqueue's dedupe key (checked) and ``shared`` with its expiry / dedupe
    options (facade/dedupe.py); a job with only an expiry is one enqueue.lua call."""
    if dedupe_key is None and dedupe_ms is None and dedupe is None and expires_ms is None:
        return None, shared  # (the per-request path: nothing to check)
    key = None if dedupe_key is None else check_key(dedupe_key)
    extras = dedupe_extras(key is not None, dedupe_ms, dedupe, expires_ms)
    if extras is not None and has_deps:
        raise InvalidInput("depends_on does not combine with dedupe_key/expires_ms yet")
    return key, shared if extras is None else shared._replace(extras=extras)


class Queue(QueueInspection, QueueControl, QueueDependencies,
            QueueWaiting):
    """A named queue on one Redis (or Cluster). Cheap to create; holds no state but config.

    ``partitions=P`` spreads the queue over P partitions, each in its own Cluster slot
    (so over the Cluster's masters): it returns a
    :class:`~emqfast.facade.partitioned.PartitionedQueue` (see that module and the
    docs' "Partitioned queues").

    ``attempts`` and ``backoff`` are the defaults for jobs enqueued without their own.

    ``wait_replicas=n`` (with ``wait_timeout_ms``) makes every enqueue path wait until
    ``n`` replicas acknowledged its writes (Redis ``WAIT`` on the same connection, right
    after them), else raise :class:`~emqfast.errors.NotReplicated` (the jobs are on the
    master). Without it an enqueue acknowledged by a master that dies before replicating
    is lost (Redis replication is asynchronous); see the README's failure section.

    ``group_commit`` (default True): concurrent :meth:`enqueue` calls of this queue on one
    client share script calls (see :meth:`enqueue`); False sends each alone.

    Each public operation is a generator (see :mod:`emqfast.core.ops`) run by
    :meth:`_drive`. :class:`emqfast.aio.Queue` swaps the driver and the connection
    resolver, keeps one client per event loop (``redis``) and makes :meth:`events` an
    async iterator; every other line of logic is shared.
    """

    _resolve = staticmethod(resolve)
    is_async = False  # True in emqfast.aio.Queue: operations return coroutines
    _partitioned: Optional[type] = None  # the PartitionedQueue of this facade (see __new__)

    def __new__(cls, *args: Any, partitions: Optional[int] = None, **kwargs: Any) -> "Queue":
        """``partitions=P`` makes a :class:`~emqfast.facade.partitioned.PartitionedQueue`
        of this facade: one logical queue over P partitions (a Queue too)."""
        if partitions is not None and not getattr(cls, "is_partitioned", False):
            made = cls._partitioned_class()
            return super().__new__(made)
        return super().__new__(cls)

    @classmethod
    def _partitioned_class(cls) -> type:
        """The PartitionedQueue class of this facade: emqfast.facade.partitioned registers
        it (it subclasses Queue; ``import emqfast`` imports it), emqfast.aio its own."""
        if cls._partitioned is None:
            raise InvalidInput("partitioned queues come with `import emqfast` "
                               "(emqfast.facade.partitioned is not loaded)")
        return cls._partitioned

    is_partitioned = False  # True on a PartitionedQueue

    def __init__(self, name: str, conn: Any = None, *, attempts: int = options.DEFAULT_ATTEMPTS,
                 backoff: Backoff = DEFAULT_BACKOFF,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD_BYTES,
                 wait_replicas: int = 0, wait_timeout_ms: int = 1000,
                 group_commit: bool = True, partitions: Optional[int] = None):
        if partitions is not None and not self.is_partitioned:
            raise InvalidInput("partitions= makes a PartitionedQueue (Queue(name, conn, "
                               "partitions=P)); this class is a plain queue")
        self.keys = QueueKeys(name)
        self.name = name
        self.redis: redis.Redis = self._resolve(conn)
        self.default_attempts = check_int(attempts, "attempts", 1, MAX_ATTEMPTS)
        self.default_backoff = admission.check_backoff(backoff)
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 0, 512 << 20)
        # durability: every enqueue path sends WAIT on the connection that wrote
        check_int(wait_replicas, "wait_replicas", 0, 1000)
        check_int(wait_timeout_ms, "wait_timeout_ms", 0, 1 << 31)
        self.wait_replicas, self.wait_timeout_ms = wait_replicas, wait_timeout_ms
        self._wait: admission.Wait = (wait_replicas, wait_timeout_ms) if wait_replicas else None
        if not isinstance(group_commit, bool):
            raise InputTypeError("group_commit must be True or False")
        self.group_commit = group_commit
        # concurrent enqueues of this queue on one client share calls when they agree on
        # these (facade/group_commit.py)
        self._gather_key = (self.name, self._wait)
        self._flush = functools.partial(flush_op, self.keys, self._wait)
        self._default_opts: Optional[Tuple[int, Backoff, bytes]] = None  # see _options
        self._default_shared: Optional[Shared] = None  # see _shared
        self._batcher: Any = None  # the live backend's Batcher, made by _live_batcher
        self._batcher_backend: Optional[str] = None  # the backend it was made under
        self._schedules: Optional[Schedules] = None
        self._groups: Optional[Groups] = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _drive(self, op: Op) -> Any:
        """Run one operation over the blocking client (bulk calls through the Batcher)."""
        return run(self.redis, op, batcher=self._live_batcher)

    def _live_batcher(self) -> Any:
        """The live backend's Batcher for this queue's connection (C when possible)."""
        want = backend.current()
        if self._batcher is None or self._batcher_backend != want:
            self._batcher, self._batcher_backend = backend.batcher_for(self.redis), want
        return self._batcher

    # --- enqueue -------------------------------------------------------------------------
    def _options(self, priority: int, attempts: Optional[int],
                 backoff: Optional[Backoff], group: Optional[str] = None) -> bytes:
        """A job's encoded options, this queue's defaults filling what is not given."""
        if type(priority) is int and priority == 0 and attempts is None and backoff is None \
                and group is None:  # the defaults, encoded once per queue (per-request path)
            made = self._default_opts
            if made is not None and made[0] == self.default_attempts \
                    and made[1] is self.default_backoff:
                return made[2]
            opts = admission.job_options(0, None, None, None,
                                         default_attempts=self.default_attempts,
                                         default_backoff=self.default_backoff)
            self._default_opts = (self.default_attempts, self.default_backoff, opts)
            return opts
        return admission.job_options(priority, attempts, backoff, group,
                                     default_attempts=self.default_attempts,
                                     default_backoff=self.default_backoff)

    def _shared(self, priority: int, attempts: Optional[int], backoff: Optional[Backoff],
                delay_ms: Optional[Delay], run_at_ms: Optional[RunAt],
                group: Optional[str], timeout_ms: Optional[int] = None,
                partition_key: Optional[str] = None) -> Shared:
        """Validate and encode what every job of one enqueue call shares (a plain queue
        only checks ``partition_key``: it is one partition)."""
        if partition_key is not None:
            check_placement_key(partition_key, optional=True)
        if delay_ms is None and run_at_ms is None and timeout_ms is None and group is None \
                and attempts is None and backoff is None and type(priority) is int \
                and priority == 0:  # the defaults (the per-request path): one Shared per queue
            return self._plain_shared()
        # the producer's trace context rides in the options when otel is on (facade/tracing.py)
        opts = tracing.stamp(options.with_timeout(self._options(priority, attempts, backoff,
                                                                group), timeout_ms))
        return Shared(opts, priority, admission.when(delay_ms, run_at_ms), group)

    def _plain_shared(self) -> Shared:
        """The :class:`Shared` of a job enqueued without options: this queue's defaults,
        encoded once per queue; the producer's traceparent added when a span is active."""
        made = self._default_shared
        if made is None or made.opts is not self._options(0, None, None):
            # first use, or the queue's defaults changed since (attempts / backoff are
            # plain attributes a caller may set)
            made = self._default_shared = Shared(self._options(0, None, None), 0,
                                                 admission.NOW, None)
        stamped = tracing.stamp(made.opts)  # a span active: its traceparent (facade/tracing.py)
        return made if stamped is made.opts else made._replace(opts=stamped)

    def _fixed_keys(self) -> List[str]:
        """enqueue.lua's KEYS[2..7] for this queue."""
        return admission.fixed_keys(self.keys)

    @operation
    def enqueue(self, payload: Any, *, job_id: Optional[str] = None, priority: int = 0,
                attempts: Optional[int] = None, backoff: Optional[Backoff] = None,
                delay_ms: Optional[Delay] = None, run_at_ms: Optional[RunAt] = None,
                dedupe_key: Optional[str] = None, dedupe_ms: Optional[Delay] = None,
                dedupe: Optional[str] = None, expires_ms: Optional[Delay] = None,
                group: Optional[str] = None, depends_on: Optional[Iterable[Any]] = None,
                on_dep_failure: str = "fail", timeout_ms: Optional[int] = None,
                partition_key: Optional[str] = None) -> Returns[JobRef]:
        """Add one job. ``payload`` is bytes or JSON-serialisable.

        ``delay_ms`` (ms or a ``timedelta``) or ``run_at_ms`` (epoch ms or an aware
        ``datetime``) makes it scheduled; see :meth:`enqueue_at` for what is refused.

        Lower ``priority`` runs first (0 .. 2**21-1). ``job_id`` must start with ``JOB``;
        enqueueing an existing id writes nothing and returns a ``duplicate`` ref.
        With ``group`` the job waits in that group's lane (see :mod:`emqfast.facade.groups`).
        ``dedupe_key`` (with ``dedupe_ms``, ``dedupe="drop"|"replace"|"extend"``)
        deduplicates: the ref of a job not admitted says ``deduplicated`` / ``replaced``
        and names the job holding the key; ``expires_ms`` discards the job as ``expired``
        if it has not started that long after it is due (see :mod:`emqfast.facade.dedupe`).
        With ``depends_on`` (JobRefs, ids of this queue, ``(queue, id)`` pairs) it waits
        as ``waiting_deps`` until they all completed (see :mod:`emqfast.facade.deps`).
        ``timeout_ms`` limits each run: a Worker stops the handler when it passes (see
        :mod:`emqfast.worker.cancels`); the job fails with ``JobTimeout`` (or retries).
        ``partition_key`` places it on a partitioned queue; a plain one only checks it.

        Concurrent calls share round trips (group commit, unless the queue was made with
        ``group_commit=False``): while an enqueue of this queue is in flight on this
        client, enqueues from other threads (or tasks) of the process wait and then go out
        together, those sharing their options as one enqueue_many.lua call; with nothing
        in flight a call goes out at once, alone. Each caller gets its own ref or its own
        typed error; input is validated before a job joins anything, so a bad job fails
        alone and writes nothing. If a shared call's reply is lost, its jobs are read
        back (found: status ``recovered``) and those not found are sent once more with
        their ids (never written twice); :class:`~emqfast.errors.ReplyLost` only when
        that fails too. Jobs with ``dedupe_key`` or ``depends_on`` are sent alone (see
        :mod:`emqfast.facade.group_commit`).
        """
        data, enc = codec.encode(payload, self.max_payload_bytes)  # (refs bound here: _bind)
        if attempts is None and backoff is None and delay_ms is None and run_at_ms is None \
                and dedupe_key is None and dedupe_ms is None and dedupe is None and group is None \
                and expires_ms is None and depends_on is None and timeout_ms is None \
                and partition_key is None and type(priority) is int and priority == 0:
            shared, key = self._plain_shared(), None  # no options: the per-request path
        else:
            shared = self._shared(priority, attempts, backoff, delay_ms, run_at_ms, group,
                                  timeout_ms, partition_key)
            key, shared = _with_extras(shared, dedupe_key, dedupe_ms, dedupe, expires_ms,
                                       depends_on is not None)
        job = Job(ids.new_id() if job_id is None else check_new_job_id(job_id), data, enc)
        if key is not None or depends_on is not None:  # multi-step paths, never gathered
            return self._bind((yield from self._admit_alone(job, shared, key, depends_on,
                                                            on_dep_failure)))
        if self.group_commit:  # shares a call with concurrent enqueues (facade/group_commit.py)
            ref: JobRef = yield Gathered(self._gather_key, Entry(job, shared), self._flush, LIMIT)
            return self._bind(ref)
        outcome = (yield from flush_op(self.keys, self._wait, [Entry(job, shared)]))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return self._bind(outcome)

    def _admit_alone(self, job: Job, shared: Shared, key: Optional[str],
                     depends_on: Optional[Iterable[Any]], on_dep_failure: str
                     ) -> Returns[JobRef]:
        """A single enqueue's multi-step paths (never gathered): with a dedupe ``key`` it
        reads the key's holder first (facade/keyed.py); with ``depends_on`` it waits for
        other jobs first (facade/deps.py)."""
        if key is not None:
            return (yield from admit_one(self.keys, job, shared, key, self._wait))
        return (yield from deps.enqueue_op(self.keys, job, shared, depends_on, on_dep_failure,
                                           self._wait))

    def enqueue_at(self, payload: Any, run_at_ms: RunAt, **opts: Any) -> JobRef:
        """Add a job that becomes pending at ``run_at_ms`` (compared with the server clock):
        epoch ms, or an aware ``datetime`` (truncated to the ms).

        A naive datetime is refused (:class:`~emqfast.errors.InvalidInput`: attach a zone),
        and so is an int in ``[1e9, 1e11)`` (:class:`~emqfast.errors.RangeError`): as ms
        that is 1970-1973, as seconds 2001-5138, so it is epoch seconds passed by mistake
        (``int(time.time())``). Smaller ints (0, ...) are the distant past: due at once."""
        return self.enqueue(payload, run_at_ms=run_at_ms, **opts)

    def enqueue_in(self, payload: Any, delay_ms: Delay, **opts: Any) -> JobRef:
        """Add a job that becomes pending ``delay_ms`` (ms or a ``timedelta``) from now,
        measured on the Redis server clock."""
        return self.enqueue(payload, delay_ms=delay_ms, **opts)

    @operation
    @binds_refs  # the refs know this queue: ref.wait() (facade/job_wait.py)
    def enqueue_many(self, payloads: Iterable[Any], *, job_ids: Optional[Sequence[str]] = None,
                     priority: int = 0, attempts: Optional[int] = None,
                     backoff: Optional[Backoff] = None, delay_ms: Optional[Delay] = None,
                     run_at_ms: Optional[RunAt] = None,
                     group: Optional[str] = None,
                     dedupe_keys: Optional[Sequence[Optional[str]]] = None,
                     dedupe_ms: Optional[Delay] = None, dedupe: Optional[str] = None,
                     expires_ms: Optional[Delay] = None,
                     timeout_ms: Optional[int] = None,
                     partition_key: Optional[str] = None,
                     partition_keys: Optional[Sequence[Optional[str]]] = None
                     ) -> Returns[List[JobRef]]:
        """Add many jobs with shared options, pipelined (thousands per round trip).

        Every payload and id is validated before anything is sent, so bad input
        writes nothing. Under the C backend the batch is framed and sent by hiredis;
        under :mod:`emqfast.aio` it goes through ``redis.asyncio`` pipelines (the
        C Batcher is a blocking socket). With ``group`` every job joins that group's
        lane (pipelined calls of enqueue_group.lua). ``dedupe_keys`` (one key or None per
        payload; ``dedupe_ms`` and ``dedupe`` shared) and ``expires_ms`` work as in
        :meth:`enqueue`; such jobs go as pipelined enqueue.lua calls. A batch of 1,000
        jobs or more builds its rows and refs with Python's cyclic garbage collector
        paused (only around those loops; a collector your app turned off stays off).
        Jobs minted together share one ``enqueued`` stream entry per 100 (readers of
        :meth:`events` still get one event per job).

        Failures. Nothing is re-sent blindly. When the batch fails part-way
        (the connection drops mid-batch, the server fills up, ...) this raises
        :class:`~emqfast.errors.PartialBatch`: ``landed`` holds the refs whose replies
        arrived, ``unknown`` the ids sent whose reply was lost (each may or may not be
        written), ``not_sent`` the ids certainly not written (never sent, or refused
        without running, e.g. OOM); ``__cause__`` says why (``ReplyLost``,
        ``ConnectionFailed``, ``ServerFull``, ...). ``q.retry_partial(err)`` re-sends the
        unknown and unsent jobs with the same ids: nothing is ever duplicated, and an
        unknown job that had landed is reported ``"recovered"``. (Re-sending the ids
        yourself with ``job_ids=`` is just as safe; those come back ``"duplicate"``.)
        A batch of which nothing was written raises the plain typed error instead.

        ``partition_key`` (all jobs) or ``partition_keys`` (one per job) place jobs on a
        partitioned queue; a plain queue only checks them (see :meth:`enqueue`).
        """
        if isinstance(payloads, (str, bytes, bytearray, memoryview, dict)) \
                or not _iterable(payloads):
            # a lone payload would be split into characters / bytes / keys
            raise InputTypeError("enqueue_many takes an iterable of payloads (a list), not "
                               f"one payload ({type(payloads).__name__}): use enqueue for one")
        shared = self._shared(priority, attempts, backoff, delay_ms, run_at_ms, group,
                              timeout_ms)
        jobs = _job_rows(payloads, job_ids, self.max_payload_bytes)
        keys = key_list(dedupe_keys, len(jobs))
        shared = shared._replace(extras=dedupe_extras(keys is not None, dedupe_ms, dedupe,
                                                      expires_ms))
        if partition_key is not None or partition_keys is not None:
            placement_keys(len(jobs), partition_key, partition_keys)
        return (yield from admit_many(self.keys, self.name,
                                      EnqueueBatch(jobs, shared, self._wait, dedupe_keys=keys)))

    @operation
    @binds_refs  # the refs know this queue: ref.wait() (facade/job_wait.py)
    def retry_partial(self, partial: PartialBatch) -> Returns[List[JobRef]]:
        """Re-send what a :class:`~emqfast.errors.PartialBatch` raised by this queue's
        ``enqueue_many`` left undone, with the same ids, payloads and options.

        Returns refs for the whole original batch, in its order: the landed ones as
        reported, the re-sent ones as admitted now. A re-sent ``unknown`` id found already
        existing was written by the first call (its reply was lost; a minted id is unique,
        so nobody else made it): its status is ``"recovered"``, not ``"duplicate"``. May
        raise PartialBatch again (retry that one in turn). Nothing is ever duplicated.
        """
        return (yield from retry_partial(self.keys, self.name, partial, self._wait))

    # --- the sub-facades ------------------------------------------------------------------
    @property
    def groups(self) -> Groups:
        """Group lanes of this queue: caps and counts (see :mod:`emqfast.facade.groups`)."""
        groups: Optional[Groups] = getattr(self, "_groups", None)
        if groups is None:
            groups = self._groups = Groups(self)
        return groups

    @property
    def schedules(self) -> Schedules:
        """Repeatable schedules of this queue (see :mod:`emqfast.facade.schedules`)."""
        if self._schedules is None:
            self._schedules = Schedules(self)
        return self._schedules

    # --- maintenance: promote, reap, trim, delete ---------------------------------------
    @operation
    def promote(self, limit: int = 1000) -> Returns[int]:
        """Release up to ``limit`` due delayed jobs to pending (server clock); returns how
        many moved. Reads the due ids :data:`~emqfast.core.ops.DUE_BATCH` at a time and
        moves them in script calls of at most :data:`~emqfast.core.ops.PROMOTE_BATCH` jobs
        (bounded work per call)."""
        check_int(limit, "limit", 1, MAX_MOVE_LIMIT)
        moved: int = yield from promote_op(self.keys, limit)
        return moved

    @operation
    def reap(self, max_stalled: int = 1, limit: int = 1000) -> Returns[Tuple[int, int]]:
        """Return up to ``limit`` jobs with expired leases to pending;
        ``(requeued, failed_as_stalled)``. Works in calls of at most :data:`REAP_BATCH` jobs."""
        check_int(max_stalled, "max_stalled", 0, 1_000_000)
        check_int(limit, "limit", 1, MAX_MOVE_LIMIT)
        requeued = failed = 0
        for asked in batches(limit, REAP_BATCH):
            seen, (r, f) = yield from self._reap_batch(max_stalled, asked)
            requeued, failed = requeued + r, failed + f
            if seen < asked:  # no more expired leases
                break
        return requeued, failed

    def _reap_batch(self, max_stalled: int, asked: int) -> Op:
        """One bounded step of :meth:`reap`: ``(expired ids seen, (requeued, failed))``."""
        k = self.keys
        due = parse_due((yield expired_leases(k, asked)))
        if not due.ids:
            return 0, (0, 0)
        # a reaped grouped job rejoins its lane (queues that never had groups skip the lookup)
        by_group = (yield from lanes.groups_of(k, due.ids)) if due.grouped else {None: due.ids}
        calls = lanes.lane_moves(k, by_group, lambda pending, ids: Call(
            _REAP,
            [k.active, k.leases, pending, k.failed, k.marker, k.meta, k.events, k.metrics,
             k.waiters, k.dependents, k.outbox, *k.jobs(ids)],
            [max_stalled, KEYSPACE_VERSION, *ids]))
        if len(calls) == 1:
            requeued, failed = yield calls[0]
            return len(due.ids), (int(requeued), int(failed))
        return len(due.ids), lanes.combine_moves(calls, (yield Batch(calls)), lanes.split_counts)

    @operation
    def trim(self, *, keep_completed: int = 1000, keep_failed: int = 10_000,
             max_age_ms: Optional[Delay] = None, limit: int = TRIM_LIMIT,
             keep_cancelled: int = 1000, keep_expired: int = 1000) -> Returns[int]:
        """Retention: delete the oldest finished (and cancelled, and expired) jobs beyond the
        counts
        (and older than ``max_age_ms``, server clock); returns how many were deleted.

        At most ``limit`` jobs per finished set go in one call (in script calls of
        :data:`TRIM_BATCH`), so the Worker's beat stays short; call again for the rest.
        """
        k = self.keys
        # validate everything first: a bad keep_failed must not leave completed trimmed
        check_int(keep_completed, "keep_completed", 0, 1 << 40)
        check_int(keep_failed, "keep_failed", 0, 1 << 40)
        check_int(keep_cancelled, "keep_cancelled", 0, 1 << 40)
        check_int(keep_expired, "keep_expired", 0, 1 << 40)
        if max_age_ms is not None:  # ms or a timedelta
            max_age_ms = delay_ms(max_age_ms, "max_age_ms", 0, MAX_RUN_AT_MS)
        check_int(limit, "limit", 1, MAX_MOVE_LIMIT)
        age = -1 if max_age_ms is None else max_age_ms
        removed = 0
        for key, keep in ((k.completed, keep_completed), (k.failed, keep_failed),
                          (k.cancelled, keep_cancelled), (k.expired, keep_expired)):
            removed += yield from self._trim_set(key, keep, age, limit)
        return removed

    def _trim_set(self, key: str, keep: int, age: int, limit: int) -> Op:
        """Trim one finished set: read its oldest ids a batch at a time (a bounded ZRANGE)
        and let trim.lua delete those the rule does not keep (it re-checks each)."""
        removed = 0
        for asked in batches(limit, TRIM_BATCH):
            head = [i.decode() for i in (yield Cmd.of("ZRANGE", key, 0, asked - 1))]
            if not head:
                break
            # the dedupe hash: a deleted job gives up its dedupe key
            deleted, more = yield Call(_TRIM, [key, self.keys.meta, self.keys.dedupe,
                                               *self.keys.jobs(head)],
                                       [KEYSPACE_VERSION, keep, age, *head])
            removed += int(deleted)
            if not int(more) or len(head) < asked:
                break
        return removed

    @operation
    def obliterate(self) -> Returns[int]:
        """Delete every key of this queue (jobs, schedules, meta). Returns keys deleted.

        Nothing is left waiting on it: its jobs that ended first tell their dependents
        (as a Worker's settle would); then, the jobs deleted, every job of another queue
        that depends on one of them fails or runs per its ``on_dep_failure`` (the
        dependency is missing), and every ``ref.wait()`` on one of them raises
        :class:`~emqfast.errors.JobNotFound`."""
        k = self.keys
        yield from deps.drain_all_op(k)  # while the results are there to copy
        found = [key.decode() if isinstance(key, bytes) else key
                 for key in (yield Scan(k.glob(), 1000))]
        # what says who waits or depends goes last: read once the jobs are gone, so a
        # wait or a link arriving meanwhile finds no job rather than a key about to go
        notes = [k.waiters, k.dependents, k.outbox]
        notes += [key for key in found
                  if key.startswith(k.base + "job:") and key.endswith(":dependents")]
        late = set(notes)
        n = 0
        for batch in chunks([key for key in found if key not in late], 500):
            n += int((yield Cmd.of("UNLINK", *batch)))
        yield from deps.orphan_dependents_op(k)  # it deletes each job's dependents set
        yield from job_wait.tell_deleted_op(k)
        for batch in chunks(notes, 500):
            yield Cmd.of("UNLINK", *batch)
        return n + len(late.intersection(found))


def constructor_signature(cls: type) -> inspect.Signature:
    """``cls.__init__``'s signature without ``self``: what ``inspect`` (``help()``, IDEs,
    the API reference) should show for a Queue class, whose ``__new__`` takes anything."""
    init = inspect.signature(cls.__init__)  # type: ignore[misc]
    return init.replace(parameters=list(init.parameters.values())[1:])


Queue.__signature__ = constructor_signature(Queue)  # type: ignore[attr-defined]


def _job_rows(payloads: Iterable[Any], job_ids: Optional[Sequence[str]],
              max_payload_bytes: int) -> List[Job]:
    """``enqueue_many``'s jobs: every payload encoded and every id checked (or minted)
    before anything is sent. The rows all survive the call, so they are built with the
    cyclic GC paused (:mod:`emqfast.core.gcpause`)."""
    with gc_paused(len(payloads) if isinstance(payloads, Sized) else BULK):
        encoded: List[Tuple[bytes, Any]] = [codec.encode(p, max_payload_bytes)
                                            for p in payloads]
        if job_ids is None:
            job_ids = ids.new_ids(len(encoded))
        elif isinstance(job_ids, str) or not _iterable(job_ids):
            raise InputTypeError("job_ids takes a list of ids (str starting with 'JOB'), one "
                                 f"per payload, not {type(job_ids).__name__}")
        else:
            job_ids = [check_new_job_id(j) for j in job_ids]
            if len(job_ids) != len(encoded):
                raise InvalidInput("job_ids and payloads differ in length")
        row = tuple.__new__  # Job(j, data, enc) without its Python-level __new__
        return [row(Job, (j, data, enc)) for j, (data, enc) in zip(job_ids, encoded)]


def check_placement_key(key: Any, optional: bool = False) -> Optional[str]:
    """A ``partition_key``: a non-empty str (or None, when ``optional``), else a typed
    error."""
    if key is None and optional:
        return key
    if not isinstance(key, str) or not key:
        raise InputTypeError(f"partition_key must be a non-empty str, not {key!r:.40}")
    return key


def placement_keys(n: int, partition_key: Optional[str],
                   partition_keys: Optional[Sequence[Optional[str]]]) -> List[Optional[str]]:
    """The placement key of each of ``n`` jobs of one enqueue_many (None: none), checked."""
    if partition_keys is None:
        return [None if partition_key is None else check_placement_key(partition_key)] * n
    if partition_key is not None:
        raise InvalidInput("give partition_key or partition_keys, not both")
    if isinstance(partition_keys, (str, bytes)) or not _iterable(partition_keys):
        raise InputTypeError("partition_keys takes a list (one key or None per job)")
    placing = [None if k is None else check_placement_key(k) for k in partition_keys]
    if len(placing) != n:
        raise InvalidInput(f"{len(placing)} partition_keys for {n} payloads")
    return placing


def _iterable(value: Any) -> bool:
    """Whether ``iter(value)`` works (a list, tuple, generator...)."""
    try:
        iter(value)
    except TypeError:
        return False
    return True
