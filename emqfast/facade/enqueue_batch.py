"""Sending ``enqueue_many``: a batch streamed in bounded chunks, and the exact report
of a batch cut part-way (:class:`~emqfast.errors.PartialBatch`) that ``retry_partial``
re-sends from. Sans-IO: each function is (or builds a step of) an operation generator.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, NamedTuple, Optional, Sequence, Set

from emqfast.backends import transport
from emqfast.backends.scripts import load, map_error
from emqfast.core.errors import ConnectionFailed, InvalidInput, PartialBatch
from emqfast.core.gcpause import gc_paused
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Columns, Op, Request, Returns, Slot
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.admission import (ENCODING_COLUMN, ID_COLUMN, PAYLOAD_COLUMN, STATUS, Job,
                                      Shared, Wait, check_replicated, enqueue_call, status_of)
from emqfast.facade import keyed
from emqfast.facade.dedupe import STATUSES
from emqfast.facade.job import JobRef, refs_of

ENQUEUE_CHUNK = 50_000  # jobs per streamed batch (bounds the framing buffers)
ACL_CHECKED_ALONE = 64  # chunks above this send one checked call first (see sends)
MANY_CHUNK = 500  # jobs per enqueue_many.lua call (bounded work per call)
ENQUEUE_MANY = load("enqueue_many")


class Send(NamedTuple):
    """One round trip of a batch: jobs ``[start, stop)``; ``check_acl`` says whether its
    scripts check the user's ACL."""

    start: int
    stop: int
    check_acl: bool


def sends(n: int) -> Iterator[Send]:
    """The round trips of an ``enqueue_many`` of ``n`` jobs.

    Each enqueue script checks the user's ACL for every command it writes with before its
    first write (~1.5 us of Redis CPU, a quarter of an enqueue). A chunk of more than
    ``ACL_CHECKED_ALONE`` jobs sends its first job alone, checked, then the rest
    unchecked (same user): one more round trip per 50,000 jobs instead of the check per
    job. A refused first call stops the batch before the rest is sent."""
    for start in range(0, n, ENQUEUE_CHUNK):
        stop = min(start + ENQUEUE_CHUNK, n)
        if stop - start <= ACL_CHECKED_ALONE:
            yield Send(start, stop, True)
        else:
            yield Send(start, start + 1, True)
            yield Send(start + 1, stop, False)


@dataclass
class EnqueueBatch:
    """What one ``enqueue_many`` sends; kept on its PartialBatch so
    :meth:`Queue.retry_partial <emqfast.Queue.retry_partial>` can re-send exactly the same
    jobs."""

    jobs: List[Job]
    shared: Shared
    wait: Wait = None
    recovering: Set[str] = field(default_factory=set)  # unknown ids of an earlier try
    dedupe_keys: Optional[List[Optional[str]]] = None  # per job, None: no keys
    # job index -> the job holding its key, for jobs deduplicated or replaced (their refs)
    holders: Dict[int, str] = field(default_factory=dict)

    @property
    def job_ids(self) -> List[str]:
        return [job.id for job in self.jobs]

    @property
    def per_call(self) -> bool:
        """Whether each job is its own script call (enqueue.lua / enqueue_group.lua):
        grouped jobs, and jobs with expiry or dedupe keys (enqueue_many.lua admits only
        plain jobs, so they pay nothing for these features)."""
        return self.shared.group is not None or self.shared.extras is not None

    def subset(self, picks: Iterable[int], recovering: Set[str]) -> "EnqueueBatch":
        """The jobs at ``picks``, same options, with ``recovering`` ids of unknown fate."""
        picks = list(picks)
        keys = None if self.dedupe_keys is None else [self.dedupe_keys[i] for i in picks]
        return EnqueueBatch([self.jobs[i] for i in picks], self.shared, self.wait, recovering,
                            keys)


def many_sends(n: int) -> Iterator[Send]:
    """The round trips of an ungrouped ``enqueue_many`` of ``n`` jobs: enqueue_many.lua
    checks the ACL once per call of :data:`MANY_CHUNK` jobs, so every call checks it."""
    for start in range(0, n, ENQUEUE_CHUNK):
        yield Send(start, min(start + ENQUEUE_CHUNK, n), True)


def chunk_request(k: QueueKeys, batch: EnqueueBatch, send: Send,
                  holders: Optional[List[Optional[str]]] = None) -> Request:
    """The request sending one :class:`Send` of ``batch`` (one round trip); ``holders``:
    the job holding each job's dedupe key, as read before."""
    jobs = batch.jobs[send.start:send.stop]
    if batch.per_call:  # pipelined calls of enqueue.lua / enqueue_group.lua
        keys = batch.dedupe_keys[send.start:send.stop] if batch.dedupe_keys else [None] * len(jobs)
        held = holders or [None] * len(jobs)
        return Batch([enqueue_call(k, job, batch.shared, send.check_acl, key, holder)
                      for job, key, holder in zip(jobs, keys, held)],
                     via_batcher=True, wait=batch.wait)
    return many_columns(k, jobs, batch.shared, batch.wait)


def per_job(batch: EnqueueBatch, send: Send, got: List[Any]) -> List[Any]:
    """One reply per job of ``send``: enqueue_many.lua answers a whole call with a list
    of statuses; an error, LOST or UNSENT of a call stands for each of its jobs."""
    if batch.per_call:
        return got  # enqueue.lua / enqueue_group.lua: a reply per job already
    out: List[Any] = []
    for i, reply in enumerate(got):
        if isinstance(reply, list):
            out += reply
        else:
            lo = send.start + i * MANY_CHUNK
            out += [reply] * (min(lo + MANY_CHUNK, send.stop) - lo)
    return out


def admit_many(k: QueueKeys, queue: str, batch: EnqueueBatch) -> Returns[List[JobRef]]:
    """Send ``batch`` in streamed chunks; its refs, or PartialBatch / the plain typed error
    (see ``Queue.enqueue_many``)."""
    replies: List[Any] = []
    acked = None
    send = None
    try:
        for send in (sends if batch.per_call else many_sends)(len(batch.jobs)):
            holders = None
            if batch.dedupe_keys is not None:
                holders = yield from keyed.read_holders(
                    k, batch.dedupe_keys[send.start:send.stop])
            got = yield chunk_request(k, batch, send, holders)
            if batch.wait is not None:  # the replies end with WAIT's replica count
                acked = got[-1] if acked is None else min(acked, got[-1])
                got = got[:-1]
            got = per_job(batch, send, got)
            if holders is not None:
                got = yield from _settle(k, batch, send, holders, got)
            replies += got
            if send.check_acl and isinstance(got[0], Exception):
                break  # refused (NOPERM, OOM, ...): the rest would be too; not sent
    except ConnectionFailed as exc:
        cut = list(getattr(exc, "replies", None) or [])
        if send is not None and cut:
            cut = per_job(batch, send, cut)
        rest = len(batch.jobs) - len(replies) - len(cut)
        replies += cut + [transport.UNSENT] * rest
        if _nothing_landed(replies):
            raise  # nothing written, nothing in doubt: the plain typed error
        raise partial(queue, batch, replies, exc) from exc
    replies += [transport.UNSENT] * (len(batch.jobs) - len(replies))
    refs = _refs(queue, batch, replies)
    if acked is not None:  # None: nothing was sent (an empty batch)
        check_replicated(refs, acked, batch.wait)
    return refs


def _settle(k: QueueKeys, batch: EnqueueBatch, send: Send, holders: List[Optional[str]],
            got: List[Any]) -> Op:
    """Re-send the send's stale keyed jobs (:func:`keyed.settle`) and note the holder each
    deduplicated or replaced job names."""
    assert batch.dedupe_keys is not None
    keys = batch.dedupe_keys[send.start:send.stop]
    got = yield from keyed.settle(k, batch.jobs[send.start:send.stop], batch.shared, keys,
                                  holders, got)
    for i, (reply, holder) in enumerate(zip(got, holders)):
        if reply in STATUSES and holder is not None:
            batch.holders[send.start + i] = holder
    return got


def many_columns(k: QueueKeys, jobs: Sequence[Job], shared: Shared, wait: Wait,
                 job_ids: Optional[Sequence[str]] = None) -> Columns:
    """enqueue_many.lua for ``jobs`` (ungrouped), :data:`MANY_CHUNK` jobs per call, framed
    as columns: the job keys and (id, payload[, encoding]) per job, the rest once.
    ``job_ids``: the jobs' ids when not their own (minted by a group-commit flush)."""
    fixed = [Slot(key) for key in (k.pending, k.delayed, k.marker, k.meta, k.counter,
                                   k.events)]
    ids_column = [job.id.encode() for job in jobs] if job_ids is None \
        else [job_id.encode() for job_id in job_ids]
    columns: List[List[Any]] = [ids_column, [job.data for job in jobs]]
    per_job_args = [Slot(b"", ID_COLUMN, MANY_CHUNK), Slot(b"", PAYLOAD_COLUMN, MANY_CHUNK)]
    encodings = {job.enc for job in jobs}
    if len(encodings) == 1:
        encoding = Slot(encodings.pop())
    else:  # '' = each job carries its encoding
        encoding = Slot(b"")
        columns.append([job.enc for job in jobs])
        per_job_args.append(Slot(b"", ENCODING_COLUMN, MANY_CHUNK))
    when = shared.when
    args = [Slot(KEYSPACE_VERSION.encode()), Slot(b"1"), Slot(shared.opts),
            Slot(str(shared.priority).encode()), Slot(when.mode), Slot(str(when.value).encode()),
            encoding, *per_job_args]
    slots = [*fixed, Slot(k.job(""), ID_COLUMN, MANY_CHUNK), *args]
    return Columns(ENQUEUE_MANY, len(fixed) + 1, slots, columns, wait=wait)


def _nothing_landed(replies: List[Any]) -> bool:
    return all(r is transport.UNSENT or isinstance(r, Exception) for r in replies)


def _refs(queue: str, batch: EnqueueBatch, replies: List[Any]) -> List[JobRef]:
    """One ref per job of a batch whose every request was answered."""
    try:  # the common case, every reply a status code: one cheap pass
        with gc_paused(len(replies)):  # (they all survive: core/gcpause.py)
            refs = refs_of([job.id for job in batch.jobs], [STATUS[r] for r in replies])
    except (KeyError, TypeError):
        first = map_error([r for r in replies if isinstance(r, Exception)][0])
        if _nothing_landed(replies):
            raise first from None  # nothing landed: the plain typed error
        raise partial(queue, batch, replies, first) from first
    if batch.recovering:
        refs = [JobRef(r.id, "recovered") if r.status == "duplicate" and r.id in batch.recovering
                else r for r in refs]
    if batch.holders:  # a deduplicated or replaced job's ref names the job holding its key
        refs = [JobRef(batch.holders[i], r.status) if i in batch.holders else r
                for i, r in enumerate(refs)]
    return refs


def partial(queue: str, batch: EnqueueBatch, replies: List[Any],
            cause: BaseException) -> PartialBatch:
    """The PartialBatch for ``replies`` (one per job: a reply, LOST or UNSENT)."""
    landed, unknown, not_sent = [], [], []
    for i, (job, reply) in enumerate(zip(batch.jobs, replies)):
        if reply is transport.LOST:
            unknown.append(job.id)
        elif reply is transport.UNSENT or isinstance(reply, Exception):
            not_sent.append(job.id)  # never left, or refused without running (OOM...)
        else:  # (a deduplicated or replaced job's ref names the job holding its key)
            landed.append(JobRef(batch.holders.get(i, job.id),
                                 status_of(reply, batch.recovering, job.id)))
    err = PartialBatch(f"enqueue_many on {queue!r} failed part-way: {len(landed)} "
                       f"landed, {len(unknown)} unknown (sent, reply lost), "
                       f"{len(not_sent)} not written: {type(cause).__name__}: {cause}",
                       landed, unknown, not_sent)
    err.batch, err.queue = batch, queue  # for retry_partial
    return err


def retry_partial(k: QueueKeys, queue: str, err: PartialBatch,
                  wait: Wait) -> Returns[List[JobRef]]:
    """Re-send what ``err`` left undone (see ``Queue.retry_partial``); refs for the whole
    original batch, in its order."""
    batch = getattr(err, "batch", None)
    if not isinstance(batch, EnqueueBatch) or getattr(err, "queue", None) != queue:
        raise InvalidInput("retry_partial takes a PartialBatch raised by this queue's "
                           "enqueue_many")
    if batch.wait != wait:
        raise InvalidInput("retry_partial: the queue's wait_replicas changed")
    done = {ref.id: ref for ref in err.landed}
    todo = set(err.unknown) | set(err.not_sent)
    pick = [i for i, job in enumerate(batch.jobs) if job.id in todo]
    again = batch.subset(pick, recovering=set(err.unknown) | batch.recovering)
    try:
        refs = yield from admit_many(k, queue, again)
    except PartialBatch as cut:  # report the whole original batch, retryable again
        cut.landed = [done[j] for j in batch.job_ids if j in done] + cut.landed
        whole = batch.subset(range(len(batch.jobs)), again.recovering)
        cut.batch = whole
        raise
    done.update((ref.id, ref) for ref in refs)
    return [done[j] for j in batch.job_ids if j in done]
