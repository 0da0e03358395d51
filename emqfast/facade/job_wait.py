"""Waiting for a job's result: ``ref.wait(timeout_s)``, ``q.wait_many(refs)``,
``emqfast.wait_all(refs)``; ``await`` them in :mod:`emqfast.aio`.

How one wait works, across processes, woken by the job's own end (no polling):

1. SUBSCRIBE the job's done channel ``emq:{q}:done:<id>`` and wait until Redis confirms;
2. register with ``lua/wait_register.lua``: in one atomic step it raises the job's count in
   the queue's ``waiters`` hash and returns the job's state, so a job that ended before
   (or between steps 1 and 2) is answered at once, and an unknown id is JobNotFound;
3. wait for the message: the script that ends the job for good (complete, the last fail,
   cancel, expiry; ``lua/includes/finished.lua``) PUBLISHes the outcome there and takes
   the count;
4. read ``state``/``result``/``error``/``traceback`` and settle: the decoded result, or
   :class:`~emqfast.errors.JobFailed` / ``Cancelled`` / ``JobExpired``;
5. at the timeout ``lua/wait_unregister.lua`` takes the count back:
   :class:`~emqfast.errors.WaitTimeout` (a ``TimeoutError`` too).

Many waits share one pub/sub connection per client and process (:mod:`.wait_reader`: a
reader thread; :mod:`emqfast.aio.job_wait`: a reader task), their commands go a few at a
time through the registry's lanes (pool connections stay O(1) in waits), and a wait over
many refs
(``wait_all``) subscribes, registers (500 ids per script call) and reads in batches.
A dropped pub/sub connection is re-opened and each waited job re-read once re-subscribed.

Decisions: a failed attempt that will be retried is not an end (fail.lua tells waiters
only on the last one). A job deleted while waited on (``q.delete``, ``q.obliterate``) is
told ``deleted``: its wait raises JobNotFound (retention trims ended jobs only: their
waiters were told). A waiter whose process dies leaves its count until the job ends (then
the hook takes it): harmless. With
``return_exceptions=False`` the first failure in the refs' order is raised once every
job ended; ``True`` puts each exception in its place of the list.
"""
from __future__ import annotations

import functools
import math
import time
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    TypeVar, cast)

from emqfast.backends.scripts import load
from emqfast.core import codec
from emqfast.core.errors import (Cancelled, ConnectionFailed, InputTypeError, InvalidInput,
                                 JobExpired, JobFailed, JobNotFound, WaitTimeout)
from emqfast.core.gcpause import gc_paused
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.core.validation import check_job_id
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.job import JobRef
from emqfast.facade.wait_reader import RETRY_S, Waiter, registry_for

ENDED = ("completed", "failed", "cancelled", "expired")
CHUNK = 500  # job ids per wait_register / wait_unregister call and per read
Fields = Sequence[Optional[bytes]]  # state, result, error, traceback of one job

_REGISTER = load("wait_register")
_UNREGISTER = load("wait_unregister")


def _text(value: Any) -> Optional[str]:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def settle(queue: str, job_id: str, fields: Fields) -> Any:
    """What a wait gives for an ended job: its decoded result, or the exception to raise."""
    state, error, tb = _text(fields[0]), _text(fields[2]), _text(fields[3])
    where = f"job {job_id} of queue {queue!r}"
    if state == "completed":
        return codec.decode_result(fields[1])
    if state == "failed":
        return JobFailed(f"{where} failed: {error}", job_id, error, tb)
    if state == "cancelled":
        exc = Cancelled(f"{where} was cancelled")
        setattr(exc, "job_id", job_id)
        return exc
    if state == "expired":
        return JobExpired(f"{where} expired before it started", job_id)
    # an outcome this client does not know (e.g. a later version's 'deleted'): it is gone
    return JobNotFound(f"{where} ended as {state!r}, with no result to give")


def check_timeout(timeout_s: Optional[float]) -> Optional[float]:
    """The deadline (monotonic) for ``timeout_s`` seconds; None waits without a limit."""
    if timeout_s is None:
        return None
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or math.isnan(timeout_s) or timeout_s < 0:
        raise InvalidInput(f"timeout_s must be a number of seconds >= 0 or None, "
                           f"not {timeout_s!r}")
    return time.monotonic() + float(timeout_s)


def _listed(refs: Any) -> List[Any]:
    """``refs`` as a list; one ref, an id or a non-iterable is an InputTypeError."""
    if isinstance(refs, (str, bytes, bytearray, dict, JobRef)):
        raise InputTypeError("takes a list of JobRefs (or job ids), not one "
                             f"{type(refs).__name__}: use ref.wait() for one")
    try:
        return list(refs)
    except TypeError:
        raise InputTypeError(f"takes a list of JobRefs (or job ids), not "
                             f"{type(refs).__name__}") from None


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for s in range(0, len(ids), CHUNK):
        yield ids[s:s + CHUNK]


_F = TypeVar("_F", bound=Callable[..., Any])


def binds_refs(fn: _F) -> _F:
    """Make an enqueue generator's JobRefs (one, or a list) know their queue, so
    ``ref.wait()`` works: put it under ``@operation``."""
    @functools.wraps(fn)
    def bound(self: Any, *args: Any, **kwargs: Any) -> Op:
        result = yield from fn(self, *args, **kwargs)
        if type(result) is JobRef:  # one ref (a single enqueue: the per-request path)
            return self._bind(result)
        refs = result if isinstance(result, list) else [result]
        with gc_paused(len(refs)):  # (binding allocates nothing new, but a pass may land)
            for ref in refs:
                if isinstance(ref, JobRef):
                    self._bind(ref)
        return result
    return cast(_F, bound)


def tell_deleted_op(k: QueueKeys) -> Returns[int]:
    """Publish ``deleted`` to the waiters of every job of ``k`` whose hash is gone
    (``Queue.obliterate``, after the deletion: a wait registered later finds no job and is
    JobNotFound at once) and take their counts; a job still there keeps its waiters.
    Returns the jobs whose waiters were told."""
    told = 0
    cursor: Any = 0
    while True:
        cursor, found = yield Cmd.of("HSCAN", k.waiters, cursor, "COUNT", CHUNK)
        ids = [i.decode() if isinstance(i, bytes) else str(i)
               for i in (found.keys() if isinstance(found, dict) else found[::2])]
        there = (yield Batch([Cmd.of("EXISTS", key) for key in k.jobs(ids)])) if ids else []
        gone = [job_id for job_id, n in zip(ids, there) if not int(n)]
        if gone:
            yield Batch([*(Cmd.of("PUBLISH", k.done_channel(j), "deleted") for j in gone),
                         Cmd.of("HDEL", k.waiters, *gone)])
            told += len(gone)
        if int(cursor) == 0:
            return told


class QueueWaiting:
    """``q.ref(id)``, ``q.wait_many(...)`` and the operations a wait sends (a mixin of
    :class:`~emqfast.Queue`; ``keys``, ``name``, ``_drive`` are the Queue's)."""

    keys: QueueKeys
    name: str
    _drive: Callable[[Op], Any]

    def ref(self, job_id: str) -> JobRef:
        """A :class:`JobRef` to job ``job_id`` of this queue, to ``wait()`` on (nothing is
        read: its status is ``"ref"``; an unknown id is JobNotFound when waited on)."""
        return self._bind(JobRef(check_job_id(job_id), "ref"))

    def _bind(self, ref: JobRef) -> JobRef:
        """``ref``, knowing this queue (what ``ref.wait()`` goes through)."""
        ref.__dict__["_queue"] = self  # (frozen: no setattr; not a field, see JobRef)
        return ref

    def _wait_one(self, job_id: str, timeout_s: Optional[float]) -> Any:
        """``ref.wait()``'s work: the result, or the outcome's exception raised."""
        return wait_all([self.ref(job_id)], timeout_s)[0]

    def wait_many(self, refs: Iterable[Any], timeout_s: Optional[float] = None, *,
                  return_exceptions: bool = False) -> List[Any]:
        """Wait for many jobs of this queue (JobRefs or ids) at once, over one pub/sub
        connection; see :func:`wait_all`."""
        return wait_all(self._refs(refs), timeout_s, return_exceptions=return_exceptions)

    def _refs(self, refs: Iterable[Any]) -> List[JobRef]:
        """``refs`` (JobRefs, or ids of this queue) as JobRefs; a lone value is typed."""
        return [r if isinstance(r, JobRef) else self.ref(r) for r in _listed(refs)]

    @operation
    def _wait_register(self, job_ids: Sequence[str]) -> Returns[List[Optional[Fields]]]:
        """wait_register.lua in chunks: per id its fields if it ended (not registered),
        else None (registered). An unknown id: JobNotFound, the earlier chunks taken back."""
        k = self.keys
        out: List[Optional[Fields]] = []
        done: List[str] = []
        for chunk in _chunks(job_ids):
            try:
                reply = yield Call(_REGISTER, [k.waiters, k.meta, *k.jobs(chunk)],
                                   [KEYSPACE_VERSION, *chunk])
            except JobNotFound as exc:
                yield from QueueWaiting._wait_unregister.op(self, done)
                raise JobNotFound(f"{exc} in queue {self.name!r}: never enqueued here, or "
                                  "deleted since (trim, obliterate)") from None
            for job_id, fields in zip(chunk, reply):
                out.append(list(fields) if fields else None)
                if not fields:
                    done.append(job_id)
        return out

    @operation
    def _wait_read(self, job_ids: Sequence[str]) -> Returns[List[Optional[Fields]]]:
        """Per id its state/result/error/traceback, or None for a job that is gone."""
        out: List[Optional[Fields]] = []
        for chunk in _chunks(job_ids):
            cmds = []
            for key in self.keys.jobs(chunk):
                cmds += [Cmd.of("HMGET", key, "state", "result", "error", "traceback"),
                         Cmd.of("EXISTS", key)]
            reply = yield Batch(cmds)
            out += [list(reply[i]) if reply[i + 1] else None
                    for i in range(0, len(reply), 2)]
        return out

    @operation
    def _wait_unregister(self, job_ids: Sequence[str]) -> Returns[int]:
        """Take back one registered wait per id (wait_unregister.lua); how many were held."""
        dropped = 0
        for chunk in _chunks(job_ids):
            dropped += int((yield Call(_UNREGISTER, [self.keys.waiters, self.keys.meta],
                                       [KEYSPACE_VERSION, *chunk])))
        return dropped


class WaitPlan:
    """One wait over many refs, without I/O: which channels, what is settled, what is
    left. The sync and asyncio drivers do the I/O in the order the module doc says."""

    def __init__(self, refs: Iterable[Any], timeout_s: Optional[float], is_async: bool):
        self.deadline = check_timeout(timeout_s)
        self.timeout_s = timeout_s
        self.refs: List[JobRef] = []
        for ref in _listed(refs):
            queue = getattr(ref, "_queue", None) if isinstance(ref, JobRef) else None
            if queue is None:
                raise InputTypeError("wait_all takes JobRefs from enqueue or q.ref(job_id), "
                                     f"not {type(ref).__name__}")
            if bool(getattr(queue, "is_async", False)) != is_async:
                raise InputTypeError(f"JobRef {ref.id} is from an {'' if queue.is_async else 'non-'}"
                                     "asyncio queue: use "
                                     f"{'await emqfast.aio.' if queue.is_async else 'emqfast.'}"
                                     "wait_all")
            self.refs.append(ref)
        self.groups: List[Tuple[Any, List[int]]] = []  # (queue, indices), one per queue
        by_queue: Dict[int, List[int]] = {}
        for i, ref in enumerate(self.refs):
            if id(ref._queue) not in by_queue:
                by_queue[id(ref._queue)] = []
                self.groups.append((ref._queue, by_queue[id(ref._queue)]))
            by_queue[id(ref._queue)].append(i)
        self.channel_of = [r._queue.keys.done_channel(r.id).encode() for r in self.refs]
        self.results: Dict[int, Any] = {}
        self.registered: Dict[int, bool] = {}

    def ids(self, idxs: Sequence[int]) -> List[str]:
        return [self.refs[i].id for i in idxs]

    def channels(self, idxs: Sequence[int]) -> List[bytes]:
        return list(dict.fromkeys(self.channel_of[i] for i in idxs))

    def pending(self, idxs: Optional[Sequence[int]] = None) -> List[int]:
        return [i for i in (range(len(self.refs)) if idxs is None else idxs)
                if i not in self.results]

    def took_register(self, idxs: Sequence[int], replies: List[Optional[Fields]]) -> None:
        for i, fields in zip(idxs, replies):
            if fields is None:
                self.registered[i] = True
            else:
                self.results[i] = settle(self.refs[i]._queue.name, self.refs[i].id, fields)

    def to_read(self, channels: Iterable[bytes]) -> List[Tuple[Any, List[int]]]:
        """Per queue, the pending refs on ``channels`` (an outcome came, or a re-check)."""
        wanted = set(channels)
        return [(q, idxs) for q, group in self.groups
                if (idxs := [i for i in self.pending(group) if self.channel_of[i] in wanted])]

    def took_read(self, idxs: Sequence[int], replies: List[Optional[Fields]],
                  arrived: Dict[bytes, bytes]) -> None:
        """Settle what a read found ended; a published outcome is believed even when the
        hash says otherwise (deleted, or retried, since)."""
        for i, fields in zip(idxs, replies):
            ref, told = self.refs[i], arrived.get(self.channel_of[i])
            state = _text(fields[0]) if fields else None
            if state in ENDED and fields is not None:
                self.results[i] = settle(ref._queue.name, ref.id, fields)
            elif told is not None:
                self.results[i] = settle(ref._queue.name, ref.id,
                                         [told, *(fields or [None] * 4)[1:]])
            elif fields is None:
                self.results[i] = JobNotFound(f"job {ref.id} of queue {ref._queue.name!r} "
                                              "was deleted while waited on")

    def to_unregister(self) -> List[Tuple[Any, List[str]]]:
        """Per queue, the ids registered and still pending (the wait gives up on them)."""
        return [(q, ids) for q, group in self.groups
                if (ids := [self.refs[i].id for i in self.pending(group)
                            if self.registered.get(i)])]

    def outcome(self, return_exceptions: bool) -> List[Any]:
        """The results in the refs' order; WaitTimeout while any is pending, else the
        first exception raised unless ``return_exceptions``."""
        left = self.pending()
        if left:
            ids = [self.refs[i].id for i in left]
            what = f"job {ids[0]}" if len(ids) == 1 else f"{len(ids)} jobs"
            raise WaitTimeout(f"{what} did not end within {self.timeout_s} s", ids)
        out = [self.results[i] for i in range(len(self.refs))]
        if not return_exceptions:
            for value in out:
                if isinstance(value, BaseException):
                    raise value
        return out


def retry_reads(deadline: Optional[float]) -> Iterator[Optional[float]]:
    """The pauses between tries of a wait's read that met a lost connection (backing off
    as the reader does), while ``deadline`` allows; the last one is None: give up."""
    pause = RETRY_S[0]
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= pause:
            yield None
            return
        yield pause
        pause = min(pause * 2, RETRY_S[1])


def wait_all(refs: Iterable[Any], timeout_s: Optional[float] = None, *,
             return_exceptions: bool = False) -> List[Any]:
    """Wait until every job of ``refs`` (JobRefs of sync Queues, any queues) ended for
    good and return their results in order. Raises the first failure (``JobFailed``,
    ``Cancelled``, ``JobExpired``, ``JobNotFound``) in the refs' order, or with
    ``return_exceptions=True`` puts each in its place; raises ``WaitTimeout`` (naming the
    jobs left) when ``timeout_s`` passes first. All the waits share one pub/sub
    connection per client and process."""
    plan = WaitPlan(refs, timeout_s, is_async=False)
    waiter = Waiter(list(dict.fromkeys(plan.channel_of)))
    added = []

    def read(q: Any, idxs: List[int], arrived: Dict[bytes, bytes]) -> None:
        for pause in retry_reads(plan.deadline):  # a read is safe to repeat after a blip
            try:
                with registry_for(q.redis).lanes:
                    replies = q._wait_read(plan.ids(idxs))
                break
            except ConnectionFailed:
                if pause is None:
                    raise
                time.sleep(pause)
        plan.took_read(idxs, replies, arrived)
    try:
        for q, idxs in plan.groups:
            reg = registry_for(q.redis)
            reg.add(waiter, plan.channels(idxs))
            added.append((reg, plan.channels(idxs)))
        if waiter.wait_confirmed(plan.deadline):
            for q, idxs in plan.groups:
                with registry_for(q.redis).lanes:
                    plan.took_register(idxs, q._wait_register(plan.ids(idxs)))
            while plan.pending():
                arrived, recheck = waiter.take(plan.deadline)
                if not arrived and not recheck:
                    break  # the deadline passed
                for q, idxs in plan.to_read([*arrived, *recheck]):
                    read(q, idxs, arrived)
        else:  # no time to subscribe: a last look (read only) still sees an ended job
            for q, idxs in plan.groups:
                read(q, idxs, {})
    finally:
        for reg, chans in added:
            reg.remove(waiter, chans)
        for q, ids in plan.to_unregister():
            with registry_for(q.redis).lanes:
                q._wait_unregister(ids)
    return plan.outcome(return_exceptions)
