"""The producer/inspection facade of one queue."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import redis

from emqfast.backends import select as backend
from emqfast.core import codec, ids
from emqfast.facade import events as events_mod, metrics as metrics_mod, options
from emqfast.core.ops import Batch, Call, Cmd, Columns, Op, Scan, operation
from emqfast.backends.drive import run
from emqfast.core.scores import MAX_OFFSET_MS, MAX_RUN_AT_MS, PRIORITY_MAX
from emqfast.facade.backoff import DEFAULT_BACKOFF, Backoff
from emqfast.server.connection import resolve
from emqfast.backends import transport
from emqfast.core.errors import (ConnectionFailed, InvalidInput, JobNotFound, NotReplicated,
    PartialBatch, RangeError)
from emqfast.facade.job import Job, JobRef
from emqfast.core.keys import QueueKeys
from emqfast.core.validation import check_group_name, check_int, check_job_id
from emqfast.core.batching import DUE_BATCH, PROMOTE_BATCH, REAP_BATCH, TRIM_BATCH, batches, chunks
from emqfast.facade import groups as groups_mod, lanes
from emqfast.backends.scripts import load, map_error
from emqfast.core.version import KEYSPACE_VERSION

_ENQUEUE = load("enqueue")
_DUE = load("due")
_PROMOTE = load("promote")
_REAP = load("reap")
_CANCEL = load("cancel")
_PAUSE = load("pause")
_TRIM = load("trim")
_RETRY = load("retry")
_CONFIGURE = load("configure")
_ENQUEUE_GROUP = load("enqueue_group")

MAX_ATTEMPTS = 1_000_000
# enqueue.lua's reply -> JobRef.status (0 = the id already existed)
_ADMITTED = {1: "pending", 2: "scheduled"}
_STATUS = {**_ADMITTED, 0: "duplicate"}
ENQUEUE_CHUNK = 50_000  # jobs per streamed batch (bounds the framing buffers)
MAX_MOVE_LIMIT = 1_000_000  # the most jobs one promote/reap/trim call may handle in all
TRIM_LIMIT = 50_000  # trim's default per finished set: bounds one Worker beat too


ACL_CHECKED_ALONE = 64  # batches above this send one checked call first (see _sends)


def _sends(n: int) -> Iterator[Tuple[int, int, int]]:
    """The round trips of an ``enqueue_many`` of ``n`` jobs: ``(start, stop, acl)``.

    Each enqueue script checks the user's ACL for every command it writes with before its
    first write (~1.5 us of Redis CPU, a quarter of an enqueue). A chunk of more than
    ``ACL_CHECKED_ALONE`` jobs sends its first job alone, checked, then the rest
    unchecked (same user): one more round trip per 50,000 jobs instead of the check per
    job. A refused first call stops the batch before the rest is sent."""
    for start in range(0, n, ENQUEUE_CHUNK):
        stop = min(start + ENQUEUE_CHUNK, n)
        if stop - start <= ACL_CHECKED_ALONE:
            yield start, stop, 1
        else:
            yield start, start + 1, 1
            yield start + 1, stop, 0


class _Batch:
    """What one ``enqueue_many`` sends: ids, encoded payloads, shared options; kept on its
    PartialBatch so :meth:`Queue.retry_partial` can re-send exactly the same jobs."""

    def __init__(self, job_ids: List[str], encoded: List[Tuple[bytes, Any]], opts: bytes,
                 priority: int, mode: bytes, value: int, group: Optional[str],
                 recovering: Optional[set] = None):
        self.job_ids, self.encoded, self.opts = job_ids, encoded, opts
        self.priority, self.mode, self.value, self.group = priority, mode, value, group
        self.recovering = recovering or set()  # unknown ids of an earlier try
        self.wait: Optional[Tuple[int, int]] = None

    def subset(self, picks: Iterable[int], recovering: set) -> "_Batch":
        picks = list(picks)
        return _Batch([self.job_ids[i] for i in picks], [self.encoded[i] for i in picks],
                      self.opts, self.priority, self.mode, self.value, self.group, recovering)


class Queue:
    """A named queue on one Redis (or Cluster). Cheap to create; holds no state but config.

    ``attempts`` and ``backoff`` are the defaults for jobs enqueued without their own.

    ``wait_replicas=n`` (with ``wait_timeout_ms``) makes every enqueue path wait until
    ``n`` replicas acknowledged its writes (Redis ``WAIT`` on the same connection, right
    after them), else raise :class:`~emqfast.errors.NotReplicated` (the jobs are on the
    master). Without it an enqueue acknowledged by a master that dies before replicating
    is lost (Redis replication is asynchronous); see the README's failure section.

    Each public operation is a generator (see :mod:`emqfast.ops`) run by
    :meth:`_drive`; :class:`emqfast.aio.Queue` overrides only ``_drive`` (and the
    connection resolver), so both facades share every line below.
    """

    _resolve = staticmethod(resolve)
    is_async = False  # True in emqfast.aio.Queue: operations return coroutines

    def __init__(self, name: str, conn: Any = None, *, attempts: int = options.DEFAULT_ATTEMPTS,
                 backoff: Backoff = DEFAULT_BACKOFF,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD_BYTES,
                 wait_replicas: int = 0, wait_timeout_ms: int = 1000):
        self.keys = QueueKeys(name)
        self.name = name
        self.redis: redis.Redis = self._resolve(conn)
        self.default_attempts = check_int(attempts, "attempts", 1, MAX_ATTEMPTS)
        if not isinstance(backoff, Backoff):
            raise InvalidInput("backoff must be an emqfast.Backoff")
        self.default_backoff = backoff
        self.max_payload_bytes = check_int(max_payload_bytes, "max_payload_bytes", 0, 512 << 20)
        # durability (issue 11): every enqueue path sends WAIT on the connection that wrote
        check_int(wait_replicas, "wait_replicas", 0, 1000)
        check_int(wait_timeout_ms, "wait_timeout_ms", 0, 1 << 31)
        self.wait_replicas, self.wait_timeout_ms = wait_replicas, wait_timeout_ms
        self._wait: Optional[Tuple[int, int]] = \
            (wait_replicas, wait_timeout_ms) if wait_replicas else None
        self._batcher: Any = None
        self._schedules: Any = None
        self._groups: Any = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def _drive(self, op: Op) -> Any:
        """Run one operation over the blocking client (bulk calls through the Batcher)."""
        return run(self.redis, op, batcher=self._live_batcher)

    # --- enqueue -------------------------------------------------------------
    def _options(self, priority: int, attempts: Optional[int],
                 backoff: Optional[Backoff], group: Optional[str] = None) -> bytes:
        check_int(priority, "priority", 0, PRIORITY_MAX)
        extra = {} if group is None else {"g": check_group_name(group)}  # the worker reads it
        attempts = self.default_attempts if attempts is None else \
            check_int(attempts, "attempts", 1, MAX_ATTEMPTS)
        backoff = self.default_backoff if backoff is None else backoff
        if not isinstance(backoff, Backoff):
            raise InvalidInput("backoff must be an emqfast.Backoff")
        # b"" for the library defaults: the scripts then store no 'opts' field
        return options.encode(attempts, priority, backoff, extra)

    @staticmethod
    def _when(delay_ms: Optional[int], run_at_ms: Optional[int]) -> Tuple[bytes, int]:
        if delay_ms is not None and run_at_ms is not None:
            raise InvalidInput("give delay_ms or run_at_ms, not both")
        if run_at_ms is not None:
            return b"at", check_int(run_at_ms, "run_at_ms", 0, MAX_RUN_AT_MS)
        if delay_ms is not None:
            return b"in", check_int(delay_ms, "delay_ms", 0, MAX_OFFSET_MS)
        return b"now", 0

    def _fixed_keys(self) -> List[str]:
        k = self.keys
        return [k.pending, k.delayed, k.marker, k.meta, k.counter, k.events]

    @operation
    def enqueue(self, payload: Any, *, job_id: Optional[str] = None, priority: int = 0,
                attempts: Optional[int] = None, backoff: Optional[Backoff] = None,
                delay_ms: Optional[int] = None, run_at_ms: Optional[int] = None,
                group: Optional[str] = None) -> JobRef:
        """Add one job. ``payload`` is bytes or JSON-serialisable.

        Lower ``priority`` runs first (0 .. 2**21-1). ``job_id`` must start with ``JOB``;
        enqueueing an existing id writes nothing and returns a ``duplicate`` ref.
        With ``group`` the job waits in that group's lane (see :mod:`emqfast.groups`).
        """
        data, enc = codec.encode(payload, self.max_payload_bytes)
        opts = self._options(priority, attempts, backoff, group)
        mode, value = self._when(delay_ms, run_at_ms)
        job_id = ids.new_id() if job_id is None else check_job_id(job_id)
        if group is not None:
            call = self._grouped_call(job_id, data, enc, opts, priority, mode, value, group)
        else:
            call = Call(_ENQUEUE, [self.keys.job(job_id), *self._fixed_keys()],
                        [job_id, data, enc, opts, priority, mode, value, KEYSPACE_VERSION, 1])
        if self._wait is None:
            reply = yield call
            return JobRef(job_id, _ADMITTED.get(int(reply), "duplicate"))
        reply, acked = yield Batch([call], wait=self._wait)  # WAIT on the same connection
        if isinstance(reply, Exception):
            raise reply
        ref = JobRef(job_id, _ADMITTED.get(int(reply), "duplicate"))
        self._check_replicated([ref], acked)
        return ref

    def _check_replicated(self, landed: List[JobRef], acked: Optional[int]) -> None:
        """Raise NotReplicated when WAIT saw fewer replicas than ``wait_replicas``."""
        if self._wait is not None and (acked or 0) < self._wait[0]:
            raise NotReplicated(
                f"{len(landed)} job(s) written to the master but acknowledged by "
                f"{acked or 0} of {self._wait[0]} replica(s) within {self._wait[1]} ms: "
                "they are lost if the master fails before replicating them",
                landed, acked or 0, self._wait[0])

    def _grouped_call(self, job_id: str, data: bytes, enc: Any, opts: bytes, priority: int,
                      mode: bytes, value: int, group: str, acl: int = 1) -> Call:
        k = self.keys
        return Call(_ENQUEUE_GROUP, [k.job(job_id), k.group_pending(group), k.delayed, k.marker,
                                     k.meta, k.counter, k.events, k.groups],
                    [job_id, data, enc, opts, priority, mode, value, KEYSPACE_VERSION, group,
                     acl])

    def enqueue_at(self, payload: Any, run_at_ms: int, **opts: Any) -> JobRef:
        """Add a job that becomes pending at ``run_at_ms`` (epoch ms, compared with the server clock)."""
        return self.enqueue(payload, run_at_ms=run_at_ms, **opts)

    def enqueue_in(self, payload: Any, delay_ms: int, **opts: Any) -> JobRef:
        """Add a job that becomes pending ``delay_ms`` from now, measured on the Redis server clock."""
        return self.enqueue(payload, delay_ms=delay_ms, **opts)

    @operation
    def enqueue_many(self, payloads: Iterable[Any], *, job_ids: Optional[Sequence[str]] = None,
                     priority: int = 0, attempts: Optional[int] = None,
                     backoff: Optional[Backoff] = None, delay_ms: Optional[int] = None,
                     run_at_ms: Optional[int] = None,
                     group: Optional[str] = None) -> List[JobRef]:
        """Add many jobs with shared options, pipelined (thousands per round trip).

        Every payload and id is validated before anything is sent, so bad input
        writes nothing. Under the C backend the batch is framed and sent by hiredis;
        under :mod:`emqfast.aio` it goes through ``redis.asyncio`` pipelines (the
        C Batcher is a blocking socket). With ``group`` every job joins that group's
        lane (pipelined calls of enqueue_group.lua).

        Failures (issue 11). Nothing is re-sent blindly. When the batch fails part-way
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
        """
        if isinstance(payloads, (str, bytes, bytearray, memoryview, dict)):
            # a lone payload would be split into characters / bytes / keys
            raise InvalidInput("enqueue_many takes an iterable of payloads, not one payload")
        encoded = [codec.encode(p, self.max_payload_bytes) for p in payloads]
        opts = self._options(priority, attempts, backoff, group)
        mode, value = self._when(delay_ms, run_at_ms)
        if job_ids is None:
            job_ids = ids.new_ids(len(encoded))
        else:
            job_ids = [check_job_id(j) for j in job_ids]
            if len(job_ids) != len(encoded):
                raise InvalidInput("job_ids and payloads differ in length")
        return (yield from self._admit_many(_Batch(job_ids, encoded, opts, priority, mode,
                                                   value, group)))

    @operation
    def retry_partial(self, partial: PartialBatch) -> List[JobRef]:
        """Re-send what a :class:`~emqfast.errors.PartialBatch` raised by this queue's
        ``enqueue_many`` left undone, with the same ids, payloads and options.

        Returns refs for the whole original batch, in its order: the landed ones as
        reported, the re-sent ones as admitted now. A re-sent ``unknown`` id found already
        existing was written by the first call (its reply was lost; a minted id is unique,
        so nobody else made it): its status is ``"recovered"``, not ``"duplicate"``. May
        raise PartialBatch again (retry that one in turn). Nothing is ever duplicated.
        """
        batch = getattr(partial, "batch", None)
        if not isinstance(batch, _Batch) or getattr(partial, "queue", None) != self.name:
            raise InvalidInput("retry_partial takes a PartialBatch raised by this queue's "
                               "enqueue_many")
        if batch.wait != self._wait:
            raise InvalidInput("retry_partial: the queue's wait_replicas changed")
        done = {ref.id: ref for ref in partial.landed}
        todo = set(partial.unknown) | set(partial.not_sent)
        pick = [i for i, j in enumerate(batch.job_ids) if j in todo]
        again = batch.subset(pick, recovering=set(partial.unknown) | batch.recovering)
        try:
            refs = yield from self._admit_many(again)
        except PartialBatch as err:  # report the whole original batch, retryable again
            err.landed = [done[j] for j in batch.job_ids if j in done] + err.landed
            err.batch = batch.subset(range(len(batch.job_ids)), again.recovering)
            raise
        done.update((ref.id, ref) for ref in refs)
        return [done[j] for j in batch.job_ids if j in done]

    def _admit_many(self, batch: "_Batch") -> Op:
        """Send ``batch`` in streamed chunks; report partial failures (see enqueue_many)."""
        batch.wait = self._wait
        replies: List[Any] = []
        acked: Optional[int] = None
        try:
            for start, stop, acl in _sends(len(batch.job_ids)):
                got = yield self._chunk_request(batch, start, stop, acl)
                if self._wait is not None:
                    acked = got[-1] if acked is None else min(acked, got[-1])
                    got = got[:-1]
                replies += got
                if acl and isinstance(got[0], Exception):
                    break  # refused (NOPERM, OOM, ...): the rest would be too; not sent
        except ConnectionFailed as exc:
            cut = list(getattr(exc, "replies", None) or [])
            rest = len(batch.job_ids) - len(replies) - len(cut)
            replies += cut + [transport.UNSENT] * rest
            if all(r is transport.UNSENT or isinstance(r, Exception) for r in replies):
                raise  # nothing written, nothing in doubt: the plain typed error
            raise self._partial(batch, replies, exc) from exc
        replies += [transport.UNSENT] * (len(batch.job_ids) - len(replies))
        try:  # the common case, every reply a status code: one cheap pass
            refs = [JobRef(job_id, _STATUS[reply]) for job_id, reply in zip(batch.job_ids, replies)]
        except (KeyError, TypeError):
            errs = [r for r in replies if isinstance(r, Exception)]
            if all(r is transport.UNSENT or isinstance(r, Exception) for r in replies):
                raise map_error(errs[0]) from None  # nothing landed: the plain typed error
            raise self._partial(batch, replies, map_error(errs[0])) from map_error(errs[0])
        if batch.recovering:
            refs = [JobRef(r.id, "recovered") if r.status == "duplicate" and r.id in batch.recovering
                    else r for r in refs]
        if acked is not None:  # None: nothing was sent (an empty batch)
            self._check_replicated(refs, acked)
        return refs

    def _chunk_request(self, batch: "_Batch", start: int, stop: int, acl: int) -> Any:
        """The request sending jobs ``[start, stop)`` of ``batch`` (one round trip); ``acl``
        says whether the scripts check the user's rights (see :func:`_sends`)."""
        ids_, encoded = batch.job_ids[start:stop], batch.encoded[start:stop]
        if batch.group is not None:
            return Batch([self._grouped_call(j, data, enc, batch.opts, batch.priority,
                                             batch.mode, batch.value, batch.group, acl)
                          for j, (data, enc) in zip(ids_, encoded)], via_batcher=True, wait=self._wait)
        tail = [batch.opts, str(batch.priority).encode(), batch.mode, str(batch.value).encode(),
                KEYSPACE_VERSION.encode(), b"%d" % acl]
        # Only the job key, id, payload and encoding differ between jobs: they travel as
        # columns, every other argument once (the C batcher frames and streams each call).
        encs = {enc for _, enc in encoded}
        enc_slot: tuple = (encs.pop(), None) if len(encs) == 1 else (b"", 2)
        slots = [(self.keys.job(""), 0), *((key, None) for key in self._fixed_keys()),
                 (b"", 0), (b"", 1), enc_slot, *((arg, None) for arg in tail)]
        columns = [[j.encode() for j in ids_], [data for data, _ in encoded]]
        if enc_slot[1] is not None:
            columns.append([enc for _, enc in encoded])
        return Columns(_ENQUEUE, 7, slots, columns, wait=self._wait)

    def _partial(self, batch: "_Batch", replies: List[Any], cause: BaseException) -> PartialBatch:
        """The PartialBatch for ``replies`` (one per job: a reply, LOST or UNSENT)."""
        landed, unknown, not_sent = [], [], []
        for job_id, reply in zip(batch.job_ids, replies):
            if reply is transport.LOST:
                unknown.append(job_id)
            elif reply is transport.UNSENT or isinstance(reply, Exception):
                not_sent.append(job_id)  # never left, or refused without running (OOM...)
            else:
                status = _STATUS.get(reply, "duplicate")
                if status == "duplicate" and job_id in batch.recovering:
                    status = "recovered"
                landed.append(JobRef(job_id, status))
        err = PartialBatch(f"enqueue_many on {self.name!r} failed part-way: {len(landed)} "
                           f"landed, {len(unknown)} unknown (sent, reply lost), "
                           f"{len(not_sent)} not written: {type(cause).__name__}: {cause}",
                           landed, unknown, not_sent)
        err.batch, err.queue = batch, self.name  # for retry_partial
        return err

    def _live_batcher(self) -> Any:
        """The live backend's Batcher for this queue's connection (C when possible)."""
        want = backend.current()
        if self._batcher is None or self._batcher[0] != want:
            self._batcher = (want, backend.batcher_for(self.redis))
        return self._batcher[1]

    # --- moves on the server clock ------------------------------------------
    @operation
    def promote(self, limit: int = 1000) -> int:
        """Release up to ``limit`` due delayed jobs to pending (server clock); returns how
        many moved. Reads the due ids :data:`DUE_BATCH` at a time and moves them in script
        calls of at most :data:`PROMOTE_BATCH` jobs (bounded work per call)."""
        check_int(limit, "limit", 1, MAX_MOVE_LIMIT)
        moved = 0
        for asked in batches(limit, DUE_BATCH):
            seen, n = yield from self._promote_batch(asked)
            moved += n
            if seen < asked:  # the due head is drained
                break
        return moved

    def _promote_batch(self, asked: int) -> Op:
        """One round of :meth:`promote`: ``(due ids seen, jobs moved)``."""
        k = self.keys
        reply = yield Call(_DUE, [k.delayed, k.meta], [asked, 1])
        due = [i.decode() for i in reply[2:]]
        if not due:
            return 0, 0
        # a grouped job rejoins its lane: promote.lua runs once per lane, with the lane
        # standing in for its pending set (queues that never had groups skip the lookup)
        by_group = (yield from lanes.groups_of(k, due)) if reply[1] else {None: due}
        calls = lanes.lane_moves(k, by_group, lambda pending, ids_: Call(
            _PROMOTE, [k.delayed, pending, k.marker, k.meta, k.events, *k.jobs(ids_)],
            [KEYSPACE_VERSION, *ids_]), PROMOTE_BATCH)
        if len(calls) == 1:
            return len(due), int((yield calls[0]))
        replies = yield Batch(calls)
        return len(due), _moved(calls, replies, sum)

    @operation
    def reap(self, max_stalled: int = 1, limit: int = 1000) -> Tuple[int, int]:
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
        reply = yield Call(_DUE, [k.active, k.meta], [asked, 0])
        expired = [i.decode() for i in reply[2:]]
        if not expired:
            return 0, (0, 0)
        # a reaped grouped job rejoins its lane (queues that never had groups skip the lookup)
        by_group = (yield from lanes.groups_of(k, expired)) if reply[1] else {None: expired}
        calls = lanes.lane_moves(k, by_group, lambda pending, ids_: Call(
            _REAP,
            [k.active, k.leases, pending, k.failed, k.marker, k.meta, k.events, k.metrics,
             *k.jobs(ids_)],
            [max_stalled, KEYSPACE_VERSION, *ids_]))
        if len(calls) == 1:
            requeued, failed = yield calls[0]
            return len(expired), (int(requeued), int(failed))
        replies = yield Batch(calls)
        return len(expired), _moved(calls, replies, lanes.split_counts)

    @operation
    def server_time_ms(self) -> int:
        """The Redis server's clock, epoch ms (the clock every schedule is measured on)."""
        sec, usec = yield Cmd.of("TIME")
        return int(sec) * 1000 + int(usec) // 1000

    # --- inspection and control ---------------------------------------------
    @operation
    def get(self, job_id: str) -> Optional[Job]:
        """The job's state and data, or None if it does not exist (or was trimmed)."""
        check_job_id(job_id)
        h, delayed = yield Batch([Cmd.of("HGETALL", self.keys.job(job_id)),
                                  Cmd.of("ZSCORE", self.keys.delayed, job_id)])
        return Job.from_hash(self.name, job_id, h, delayed) if h else None

    @operation
    def counts(self) -> Dict[str, int]:
        """Number of jobs per state. ``pending`` includes the jobs waiting in group lanes;
        ``grouped`` is how many of them do (one round trip without groups, two with)."""
        k = self.keys
        s, p, a, c, f, ring = yield Batch(
            [Cmd.of("ZCARD", key) for key in (k.delayed, k.pending, k.active, k.completed,
                                              k.failed)] + [Cmd.of("ZRANGE", k.groups, 0, -1)])
        grouped = 0
        if ring:  # a lane holding jobs keeps its group on the ring, so these are all of them
            lanes = yield Batch([Cmd.of("ZCARD", k.group_pending(g.decode())) for g in ring])
            grouped = sum(int(n) for n in lanes)
        return {"scheduled": s, "pending": p + grouped, "grouped": grouped, "active": a,
                "completed": c, "failed": f}

    @operation
    def job_ids(self, state: str, start: int = 0, stop: int = -1) -> List[str]:
        """Ids in one state, in the order they will run (or finished, newest first);
        ``start``/``stop`` index them as ZRANGE does (inclusive, negative from the end).

        ``pending`` holds every job :meth:`counts` counts as pending: the flat pending set
        in run order, then each group's lane (in run order within it) in the ring's order.
        Lanes take turns, so across lanes this is not the exact order jobs will start."""
        key = {"scheduled": self.keys.delayed, "pending": self.keys.pending,
               "active": self.keys.active, "completed": self.keys.completed,
               "failed": self.keys.failed}.get(state) if isinstance(state, str) else None
        if key is None:
            raise InvalidInput(f"unknown state {state!r}")
        check_int(start, "start", -(1 << 63), (1 << 63) - 1)  # Redis takes signed 64-bit
        check_int(stop, "stop", -(1 << 63), (1 << 63) - 1)
        if state in ("completed", "failed"):
            raw = yield Cmd.of("ZREVRANGE", key, start, stop)
        elif state == "pending":
            raw = yield from self._pending_ids(start, stop)
        else:
            raw = yield Cmd.of("ZRANGE", key, start, stop)
        return [i.decode() for i in raw]

    def _pending_ids(self, start: int, stop: int) -> Op:
        """The ``start..stop`` slice of the flat pending set followed by every lane."""
        k = self.keys
        ring = yield Cmd.of("ZRANGE", k.groups, 0, -1)
        if not ring:  # no groups: the flat set is all of it
            return (yield Cmd.of("ZRANGE", k.pending, start, stop))
        keys = [k.pending] + [k.group_pending(g.decode()) for g in ring]
        sizes = [int(n) for n in (yield Batch([Cmd.of("ZCARD", key) for key in keys]))]
        total = sum(sizes)
        first = start + total if start < 0 else start
        last = min(stop + total if stop < 0 else stop, total - 1)
        first = max(first, 0)
        reads, offset = [], 0
        for key, size in zip(keys, sizes):
            lo, hi = max(first - offset, 0), min(last - offset, size - 1)
            if lo <= hi:
                reads.append(Cmd.of("ZRANGE", key, lo, hi))
            offset += size
        if not reads:
            return []
        return [i for part in (yield Batch(reads)) for i in part]

    @operation
    def next_due_ms(self) -> Optional[int]:
        """Run-at (epoch ms) of the earliest delayed job, or None."""
        head = yield Cmd.of("ZRANGE", self.keys.delayed, 0, 0, "WITHSCORES", withscores=True)
        return backend.impl().unpack_delayed(int(head[0][1]))[0] if head else None

    @operation
    def cancel(self, job_id: str) -> bool:
        """Remove a scheduled or pending job atomically; False if it is running, done or unknown."""
        check_job_id(job_id)
        k = self.keys
        group = yield Cmd.of("HGET", k.job(job_id), "group")  # a grouped job waits in its lane
        pending = k.pending if group is None else k.group_pending(group.decode())
        return bool((yield Call(_CANCEL, [k.job(job_id), pending, k.delayed, k.meta, k.events],
                                [job_id, KEYSPACE_VERSION])))

    @operation
    def retry(self, job_id: str) -> None:
        """Send a failed job back to pending with a fresh set of attempts."""
        check_job_id(job_id)
        k = self.keys
        group, failed = yield Batch([Cmd.of("HGET", k.job(job_id), "group"),
                                     Cmd.of("ZSCORE", k.failed, job_id)])
        pending = k.pending if group is None else k.group_pending(group.decode())
        call = Call(_RETRY, [k.job(job_id), k.failed, pending, k.marker, k.meta, k.events],
                    [job_id, KEYSPACE_VERSION])
        if group is None or failed is None:
            yield call  # ungrouped, or refused by retry.lua (nothing written)
            return
        # a grouped job rejoins its lane, its group on the ring first
        calls = [lanes.join_call(k, [group.decode()]), call]
        _moved(calls, (yield Batch(calls)), lambda _: None)

    @operation
    def pause(self) -> None:
        """Stop workers from claiming jobs (enqueues still succeed)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [1, KEYSPACE_VERSION])

    @operation
    def resume(self) -> None:
        """Let workers claim again (wakes a blocked worker)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [0, KEYSPACE_VERSION])

    @operation
    def is_paused(self) -> bool:
        """True while the queue is paused."""
        return (yield Cmd.of("HGET", self.keys.meta, "paused")) == b"1"

    @operation
    def trim(self, *, keep_completed: int = 1000, keep_failed: int = 10_000,
             max_age_ms: Optional[int] = None, limit: int = TRIM_LIMIT) -> int:
        """Retention: delete the oldest finished jobs beyond the counts (and older than
        ``max_age_ms``, server clock); returns how many were deleted.

        At most ``limit`` jobs per finished set go in one call (in script calls of
        :data:`TRIM_BATCH`), so the Worker's beat stays short; call again for the rest.
        """
        k = self.keys
        # validate everything first: a bad keep_failed must not leave completed trimmed
        check_int(keep_completed, "keep_completed", 0, 1 << 40)
        check_int(keep_failed, "keep_failed", 0, 1 << 40)
        if max_age_ms is not None:
            check_int(max_age_ms, "max_age_ms", 0, MAX_RUN_AT_MS)
        check_int(limit, "limit", 1, MAX_MOVE_LIMIT)
        age = -1 if max_age_ms is None else max_age_ms
        removed = 0
        for key, keep in ((k.completed, keep_completed), (k.failed, keep_failed)):
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
            deleted, more = yield Call(_TRIM, [key, self.keys.meta, *self.keys.jobs(head)],
                                       [KEYSPACE_VERSION, keep, age, *head])
            removed += int(deleted)
            if not int(more) or len(head) < asked:
                break
        return removed

    @operation
    def obliterate(self) -> int:
        """Delete every key of this queue (jobs, schedules, meta). Returns keys deleted."""
        n = 0
        for batch in chunks(list((yield Scan(self.keys.glob(), 1000))), 500):
            n += int((yield Cmd.of("UNLINK", *batch)))
        return n

    # --- observability ---------------------------------------------------------
    @operation
    def configure_events(self, maxlen: int = events_mod.DEFAULT_EVENTS_CAP) -> None:
        """Cap the events stream at about ``maxlen`` entries; 0 turns events off.

        Stored in the queue's meta hash, so it applies to every producer and worker.
        """
        check_int(maxlen, "maxlen", 0, 1 << 40)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "events", maxlen])

    @operation
    def set_rate_limit(self, max_jobs: int, window_ms: int) -> None:
        """Let workers start at most ``max_jobs`` jobs of this queue in any ``window_ms``
        (a sliding window on the Redis server clock, enforced in claim.lua)."""
        check_int(max_jobs, "max_jobs", 1, 1 << 31)
        check_int(window_ms, "window_ms", 1, MAX_OFFSET_MS)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", max_jobs, "rate_window", window_ms])

    @operation
    def clear_rate_limit(self) -> None:
        """Remove the queue's rate limit (wakes a worker waiting on it)."""
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", 0, "rate_window", 0])

    @operation
    def rate_limit(self) -> Optional[Tuple[int, int]]:
        """``(max_jobs, window_ms)``, or None when the queue has no rate limit."""
        got = yield Cmd.of("HMGET", self.keys.meta, "rate_max", "rate_window")
        limit = tuple(int(v) if v is not None else 0 for v in got)
        return limit if all(limit) else None  # type: ignore[return-value]

    @operation
    def read_events(self, since: str = "0-0", *, count: int = 100,
                    block_ms: Optional[int] = None) -> List[events_mod.Event]:
        """Up to ``count`` events after stream position ``since`` (one XREAD);
        ``block_ms`` waits that long for the first one (0: forever)."""
        since = events_mod.check_position(since)
        check_int(count, "count", 1, 1_000_000)
        if block_ms is not None:
            check_int(block_ms, "block_ms", 0, 1 << 40)
        return (yield from events_mod.read_op(self.keys, since, count, block_ms))

    def events(self, since: str = "0-0", *, block_ms: Optional[int] = None,
               count: int = 100) -> Iterator[events_mod.Event]:
        """Iterate the events stream from ``since`` (``"0-0"``: the oldest kept, ``"$"``: new).

        ``block_ms=None`` ends at the stream's end; otherwise each read waits up to
        ``block_ms`` for more and the iteration ends when one wait brings nothing
        (``0`` waits forever: follow the stream).
        """
        since = events_mod.check_position(since)
        if block_ms is not None:
            check_int(block_ms, "block_ms", 0, 1 << 40)
        if since == "$":
            since = self.last_event_id()
        waits = events_mod.Waits(block_ms, events_mod.block_chunk_ms(self.redis))
        while True:
            wait = waits.next()
            if wait == -1:
                return
            batch = self.read_events(since, count=count, block_ms=wait)
            if batch:
                yield from batch
                since = batch[-1].id
                waits.restart()
            elif wait is None:
                return

    @operation
    def last_event_id(self) -> str:
        """Id of the newest event in the stream (``"0-0"`` when empty)."""
        return (yield from events_mod.last_id_op(self.keys))

    @operation
    def metrics(self) -> metrics_mod.QueueMetrics:
        """Counters and latency histograms of this queue (cluster-wide, from Redis)."""
        return (yield from metrics_mod.snapshot_op(self.keys))

    @property
    def groups(self) -> "groups_mod.Groups":
        """Group lanes of this queue: caps and counts (see :mod:`emqfast.groups`)."""
        if getattr(self, "_groups", None) is None:
            self._groups = groups_mod.Groups(self)
        return self._groups

    @property
    def schedules(self) -> Any:
        """Repeatable schedules of this queue (see :mod:`emqfast.schedules`)."""
        if self._schedules is None:
            from emqfast.facade.schedules import Schedules
            self._schedules = Schedules(self)
        return self._schedules


def _moved(calls: List[Call], replies: List[Any], combine: Any) -> Any:
    """Combine the replies of a ring join + lane moves batch (raising the first error)."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    moves = replies[1:] if calls[0].script.name == "group_join" else replies
    return combine(moves)


