"""Concurrent single enqueues sharing script calls (group commit): what one gathered flush
of a queue's jobs sends and what each job's caller gets back.

:meth:`Queue.enqueue <emqfast.Queue.enqueue>` yields its job as a
:class:`~emqfast.core.ops.Gathered` item; :mod:`emqfast.backends.gather` decides which
jobs share a flush (those that arrived while the queue's previous call on the same client
was in flight) and runs :func:`flush_op` for them. Sans-IO, like every operation.

A flush of one job sends exactly what an enqueue always sent (one enqueue.lua call). A
flush of many sends, in one round trip per part, the jobs sharing their options as one
enqueue_many.lua call (the same state as one enqueue.lua per job) and the others (grouped
jobs, jobs with an expiry, or a lone job of its options) as pipelined enqueue.lua /
enqueue_group.lua calls. (Jobs with a dedupe key or dependencies are not gathered: they
take their own multi-step paths.) Each caller gets its own outcome:

- its :class:`~emqfast.JobRef` (``pending``, ``scheduled``, ``duplicate``);
- its own typed error when its job was refused (nothing of it written);
- a call refused whole before it ran (enqueue_many.lua checks every job before its first
  write) and whose refusal is about input is re-sent job by job, so only the job at fault
  fails: the others were not written, so that re-send cannot add anything twice;
- a call whose reply was lost is followed by a read of the jobs' hashes: a job found was
  written (status ``recovered``); a job not found is sent once more with its id, which
  cannot write it twice (an id already there is a no-op; that one reports ``recovered``
  too). If that read or re-send fails as well, the caller gets
  :class:`~emqfast.errors.ReplyLost` (unknown; a re-send with the same ``job_id`` is safe);
- with ``wait_replicas``, a written job whose replicas did not acknowledge it (or whose
  WAIT reply was lost) is :class:`~emqfast.errors.NotReplicated` naming its ref.
"""
from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union, cast

from emqfast.backends.gather import own
from emqfast.backends.scripts import map_error
from emqfast.backends.transport import LOST, UNSENT
from emqfast.core import ids
from emqfast.core.errors import (ConnectionFailed, EmqError, InvalidInput, NotReplicated,
                                 ReplyLost)
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Cmd, Request, Returns
from emqfast.facade.admission import (ADMITTED, Job, Shared, Wait, check_replicated,
                                      enqueue_call)
from emqfast.facade.enqueue_batch import MANY_CHUNK, many_columns
from emqfast.facade.job import JobRef, ref_of, refs_of

__all__ = ["Entry", "entry_of", "flush_op", "LIMIT", "UNMINTED"]

LIMIT = MANY_CHUNK  # jobs per flush: each part is at most one enqueue_many.lua call

UNMINTED = ""  # a job id its flush mints, with the flush's others: one lock and clock read
Outcome = Union[JobRef, BaseException]
_ENQUEUED = {0: "duplicate", **ADMITTED}  # enqueue(_many).lua's status codes


class Entry(NamedTuple):
    """One caller's job, validated and encoded, with the options it was enqueued with."""

    job: Job
    shared: Shared


_tuple_new = tuple.__new__


def entry_of(job_id: str, data: bytes, enc: Any, shared: Shared) -> Entry:
    """``Entry(Job(job_id, data, enc), shared)``, the same objects built without the named
    tuples' Python-level ``__new__`` (half the cost; one per single enqueue)."""
    return _tuple_new(Entry, (_tuple_new(Job, (job_id, data, enc)), shared))


def flush_op(k: QueueKeys, wait: Wait, entries: Sequence[Entry]) -> Returns[List[Outcome]]:
    """Send ``entries`` (all of queue ``k``); one outcome per entry, in order. A job whose
    id is :data:`UNMINTED` gets a fresh one here, before anything is sent."""
    # Each entry's id, kept beside the entries (not in new ones): the common flush, one
    # enqueue_many.lua call, reads its jobs' ids from this list only.
    job_ids = _ids(entries)
    if len(entries) == 1:
        return [(yield from _lone(k, wait, entries[0], job_ids[0]))]
    parts = _parts(entries)
    if len(parts) == 1 and len(parts[0][0]) == len(entries):  # one call for them all
        return (yield from _send(k, wait, list(entries), job_ids, parts[0][1]))
    outcomes: List[Outcome] = [InvalidInput("not sent")] * len(entries)
    for picks, columnar in parts:
        got = yield from _send(k, wait, [entries[i] for i in picks],
                               [job_ids[i] for i in picks], columnar)
        for i, outcome in zip(picks, got):
            outcomes[i] = outcome
    return outcomes


def _ids(entries: Sequence[Entry]) -> List[str]:
    """Each entry's job id, those :data:`UNMINTED` minted together (one lock, one clock
    read)."""
    job_ids = [entry.job.id for entry in entries]
    if UNMINTED not in job_ids:
        return job_ids
    fresh = iter(ids.new_ids(job_ids.count(UNMINTED)))
    return [job_id or next(fresh) for job_id in job_ids]


def _job(entry: Entry, job_id: str) -> Job:
    """``entry``'s job, with its id ``job_id`` (minted by the flush)."""
    job = entry.job
    return job if job.id == job_id else Job(job_id, job.data, job.enc)


def _lone(k: QueueKeys, wait: Wait, entry: Entry, job_id: str) -> Returns[Outcome]:
    """One job alone: the enqueue.lua call a single enqueue has always made (a lost reply
    is :class:`~emqfast.errors.ReplyLost`, as it always was)."""
    call = enqueue_call(k, _job(entry, job_id), entry.shared)
    try:
        # Through the Batcher: under C, the calling thread's hiredis connection frames and
        # reads it, skipping redis-py's pool and packer. WAIT follows on that connection.
        replies = yield Batch([call], via_batcher=True, wait=wait)
        if isinstance(replies[0], Exception):
            raise replies[0]
        ref = ref_of(job_id, ADMITTED.get(int(replies[0]), "duplicate"))
        if wait is not None:
            check_replicated([ref], replies[1], wait)
        return ref
    except EmqError as exc:
        return exc


def _parts(entries: Sequence[Entry]) -> List[Tuple[List[int], bool]]:
    """The flush's round trips: ``(entry indexes, columnar)``. Plain jobs sharing their
    options make one enqueue_many.lua call each; the rest go as one pipeline of calls."""
    first = entries[0].shared
    if first.group is None and first.extras is None \
            and all(entry.shared is first for entry in entries):
        # the common case: every job took its queue's one default Shared (no options),
        # so one call, without hashing a Shared per job
        return [(list(range(len(entries))), True)]
    plain: Dict[Shared, List[int]] = {}
    each: List[int] = []
    for i, entry in enumerate(entries):
        if entry.shared.group is None and entry.shared.extras is None:
            plain.setdefault(entry.shared, []).append(i)
        else:
            each.append(i)
    parts = [(picks, True) for picks in plain.values() if len(picks) > 1]
    each += [picks[0] for picks in plain.values() if len(picks) == 1]
    if each:
        parts.append((sorted(each), False))
    return parts


def _request(k: QueueKeys, wait: Wait, part: Sequence[Entry], job_ids: List[str],
             columnar: bool) -> Request:
    if columnar:
        return many_columns(k, [e.job for e in part], part[0].shared, wait, job_ids)
    return Batch([enqueue_call(k, _job(e, job_id), e.shared)
                  for e, job_id in zip(part, job_ids)], via_batcher=True, wait=wait)


def _send(k: QueueKeys, wait: Wait, part: List[Entry], job_ids: List[str], columnar: bool,
          again: bool = False) -> Returns[List[Outcome]]:
    """Send one part (its jobs' ids ``job_ids``); each entry's outcome. ``again``: a
    re-send after a lost reply."""
    cut: Optional[ConnectionFailed] = None
    try:
        got = list((yield _request(k, wait, part, job_ids, columnar)))
    except ConnectionFailed as exc:  # cut part-way: the replies that arrived, then markers
        cut, got = exc, list(getattr(exc, "replies", None) or [])
    except EmqError as exc:  # refused whole before it ran (a transient state, a full pool)
        return [own(exc) for _ in part]
    acked = got.pop() if wait is not None and cut is None else None
    replies = _per_entry(got, len(part), columnar)
    if cut is None and wait is None and not again:
        try:  # the common case, every reply a status code: one cheap pass
            return cast(List[Outcome], refs_of(job_ids, [_ENQUEUED[r] for r in replies]))
        except (KeyError, TypeError):  # an error or marker among them: one by one
            pass
    if columnar and isinstance(replies[0], Exception) \
            and isinstance(map_error(replies[0]), InvalidInput):
        # refused before any write: send the jobs one by one, so only the bad one fails
        return (yield from _send(k, wait, part, job_ids, False, again))
    outcomes: List[Outcome] = []
    lost: List[int] = []
    for i, (job_id, reply) in enumerate(zip(job_ids, replies)):
        if reply is LOST:
            lost.append(i)
            outcomes.append(_unknown(cut))
        elif reply is UNSENT:
            outcomes.append(_not_sent(cut))
        elif isinstance(reply, Exception):
            outcomes.append(own(map_error(reply)))
        else:
            ref = JobRef(job_id, ADMITTED.get(int(reply), "recovered" if again else "duplicate"))
            outcomes.append(ref if wait is None else _replicated(ref, acked, wait, cut))
    if lost and not again:
        found = yield from _recover(k, wait, [part[i] for i in lost],
                                    [job_ids[i] for i in lost], cut)
        for i, outcome in zip(lost, found):
            outcomes[i] = outcome
    return outcomes


def _per_entry(got: List[Any], n: int, columnar: bool) -> List[Any]:
    """One reply per entry: enqueue_many.lua answers with a list of statuses; its error
    or marker stands for every entry; what never came back is UNSENT."""
    if columnar:
        first = got[0] if got else UNSENT
        return list(first) if isinstance(first, list) else [first] * n
    return got[:n] + [UNSENT] * (n - len(got))


def _recover(k: QueueKeys, wait: Wait, lost: List[Entry], job_ids: List[str],
             cause: Optional[ConnectionFailed]) -> Returns[List[Outcome]]:
    """After a lost reply: read which jobs were written; send the others once more with
    their ids (a job cannot be written twice by id)."""
    try:
        there = yield Batch([Cmd.of("EXISTS", k.job(job_id)) for job_id in job_ids])
    except EmqError:  # still unreachable: their fate stays unknown
        return [_unknown(cause) for _ in lost]
    outcomes: List[Outcome] = []
    absent: List[int] = []
    for i, (job_id, n) in enumerate(zip(job_ids, there)):
        if int(n):
            outcomes.append(_replicated(JobRef(job_id, "recovered"), None, wait, cause))
        else:
            absent.append(i)
            outcomes.append(_unknown(cause))
    if absent:
        again = yield from _send(k, wait, [lost[i] for i in absent],
                                 [job_ids[i] for i in absent], False, again=True)
        for i, outcome in zip(absent, again):
            outcomes[i] = outcome
    return outcomes


def _replicated(ref: JobRef, acked: Optional[int], wait: Wait,
                cut: Optional[ConnectionFailed]) -> Outcome:
    """``ref``, or NotReplicated naming it when ``wait`` asked for replicas not seen."""
    if wait is None:
        return ref
    if cut is not None or acked is None:  # written; its WAIT reply never came
        replicas, timeout_ms = wait
        return NotReplicated(f"job {ref.id} was written to the master, but the reply of "
                             f"its WAIT for {replicas} replica(s) was lost", [ref], 0,
                             replicas)
    try:
        check_replicated([ref], acked, wait)
    except NotReplicated as exc:
        return exc
    return ref


def _unknown(cause: Optional[BaseException]) -> ReplyLost:
    err = ReplyLost("the shared enqueue call was sent but its reply was lost, and the job "
                    f"could not be looked up since: it may or may not be written ({cause})")
    err.__cause__ = cause
    return err


def _not_sent(cause: Optional[BaseException]) -> ConnectionFailed:
    err = ConnectionFailed(f"the job was not sent: the connection failed first ({cause})")
    err.__cause__ = cause
    return err
