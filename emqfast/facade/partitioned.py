"""One logical queue spread over P partitions: :class:`PartitionedQueue`.

``Queue("events", conn, partitions=P)`` returns one. Each partition is a plain
:class:`~emqfast.Queue` of its own name (:func:`~emqfast.core.keys.partition_names`:
``events#<i>~<P>``...), so its own hash slot, so its own Cluster master once the Cluster
has enough of them; every move stays a one-slot script. This class only places jobs and
reads or steers the P partitions as one queue:

- placement: a job goes to the partition of its placement key (its ``group``, else its
  ``partition_key``, else its ``dedupe_key``; :func:`~emqfast.core.keys.partition_of`),
  or round robin when it has none. Same key, same partition: strict order within it;
- by-id calls (``get``, ``cancel``, ``retry``...) find the partition holding the job in
  at most P reads;
- logical views (``counts``, ``metrics``, ``pause``, ``set_rate_limit``...) go over every
  partition. A rate limit is per partition (each partition gets the whole limit);
- the layout (P) is recorded once in the logical queue's meta hash
  (``partitions.lua``, checked before this client's first call), so a client opening the
  queue with another P gets :class:`~emqfast.errors.PartitionMismatch`, as does a plain
  ``Queue`` writing to the logical name.

A :class:`~emqfast.Worker` given a PartitionedQueue serves its partitions (or a subset)
in rotation (:mod:`emqfast.worker.queue_order`, ``order="rotate"``).
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Type, Union, cast

from emqfast.backends.scripts import load
from emqfast.core.errors import InputTypeError, InvalidInput, PartialBatch, PartitionMismatch
from emqfast.core.keys import MAX_PARTITIONS, QueueKeys, partition_names, partition_of
from emqfast.core.ops import Call, Cmd, Op, Returns, operation
from emqfast.core.times import Delay, RunAt
from emqfast.core.validation import check_group_name, check_int, check_job_id
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import events as events_mod, metrics as metrics_mod
from emqfast.facade.control import CancelResult
from emqfast.facade.deps import Settled
from emqfast.facade.dedupe import check_key, extras as dedupe_extras, key_list
from emqfast.facade.enqueue_batch import EnqueueBatch, admit_many
from emqfast.facade.job import Job, JobRef
from emqfast.facade.options import Backoff
from emqfast.facade.queue import (Queue, _iterable, _job_rows, check_placement_key,
                                  constructor_signature, placement_keys)

__all__ = ["PartitionedQueue", "PartitionedGroups", "PartitionedSchedules", "open_queue",
           "layout_of"]

_PARTITIONS = load("partitions")


def check_partitions(partitions: Any) -> int:
    """``partitions`` as an int in ``1..MAX_PARTITIONS``, else a typed error."""
    return check_int(partitions, "partitions", 1, MAX_PARTITIONS)


Placement = Dict[int, Sequence[int]]  # partition -> indexes of its jobs in one batch


def _subset(batch: EnqueueBatch, picks: Sequence[int]) -> EnqueueBatch:
    """The jobs of ``batch`` at ``picks`` (a range is sliced: the bulk path)."""
    if isinstance(picks, range):
        cut = slice(picks.start, picks.stop, picks.step)
        keys = None if batch.dedupe_keys is None else batch.dedupe_keys[cut]
        return EnqueueBatch(batch.jobs[cut], batch.shared, batch.wait, batch.recovering, keys)
    return batch.subset(picks, batch.recovering)


class PartitionedQueue(Queue):
    """A logical queue over ``partitions`` partitions (see the module docstring).

    Made by ``Queue(name, conn, partitions=P)`` (``emqfast.aio.Queue`` alike), with the
    same options as a :class:`~emqfast.Queue`, which every partition shares. Its enqueue
    calls take ``partition_key``; ``q.partition(i)`` is partition ``i``'s plain Queue.
    Operations a partitioned queue does not offer as one (schedules, dependencies between
    its jobs by bare id) are on the partitions: ``q.partition(i).schedules``.
    """

    #: the facade class of the partitions (emqfast.aio's PartitionedQueue: its aio Queue)
    _plain: Type[Queue] = Queue
    is_partitioned = True

    def __init__(self, name: str, conn: Any = None, *, partitions: int,
                 **options: Any):
        self.partitions = check_partitions(partitions)
        if "#" in name:
            raise InvalidInput(f"a partitioned queue's name must not contain '#' (its "
                               f"partitions are named <name>#<i>~<P>), got {name[:40]!r}")
        super().__init__(name, conn, **options)
        client = self._given_client()
        self.partition_queues: List[Queue] = [self._plain(part, client, **options)
                                              for part in partition_names(name, partitions)]
        self._turn = itertools.count()  # round robin for jobs without a placement key
        self._layout_known = False  # partitions.lua answered for this client

    def _given_client(self) -> Any:
        """The client the partitions share (the one this queue resolved)."""
        return self.redis

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, partitions={self.partitions})"

    # --- the layout and placement ----------------------------------------------------------
    def partition(self, i: int) -> Queue:
        """The plain :class:`~emqfast.Queue` of partition ``i`` (0 .. partitions-1)."""
        check_int(i, "partition", 0, self.partitions - 1)
        return self.partition_queues[i]

    def partition_for(self, key: str) -> int:
        """The partition a job with placement key ``key`` goes to (``partition_key``,
        group or dedupe key): the same in every process."""
        return partition_of(cast(str, check_placement_key(key)), self.partitions)

    @operation
    def check_layout(self) -> Returns[int]:
        """Record this queue's number of partitions in Redis, or check it against the one
        recorded; returns it. Raises :class:`~emqfast.errors.PartitionMismatch` (nothing
        written) when the queue was made with another number, or when its name holds a
        plain queue. Every operation of this object runs it once first."""
        n: int = yield from self._layout()
        return n

    def _layout(self, record: bool = True) -> Op:
        """The layout fence, once per client: writers record the layout when none is,
        readers only check it (a read never creates a queue)."""
        if self._layout_known:
            return self.partitions
        if not record:  # a plain read (the dashboard steps reads without scripts)
            have = yield Cmd.of("HGET", self.keys.meta, "version")
            self._layout_known = self._check_recorded(have)
            return self.partitions
        got = yield Call(_PARTITIONS, [self.keys.meta],
                         [self.partitions, KEYSPACE_VERSION, "record"])
        self._layout_known = bool(int(got))
        return self.partitions

    def _check_recorded(self, have: Optional[bytes]) -> bool:
        """Whether the layout ``have`` (the logical meta's ``version``) is this one; raises
        PartitionMismatch as partitions.lua would when it is another (None: none yet)."""
        if have is None:
            return False
        text = have.decode("utf-8", "replace")
        recorded = text.split(":")[1] if text.startswith("partitioned:") else None
        if recorded is None:
            raise PartitionMismatch(
                f"queue holds a plain (unpartitioned) queue of this name: it cannot be opened "
                f"with partitions={self.partitions}; drain it and use another name (see the "
                "docs: changing the number of partitions)")
        if recorded != str(self.partitions):
            raise PartitionMismatch(
                f"queue was made with partitions={recorded}, this client opens it with "
                f"partitions={self.partitions}: use {recorded}, or drain and switch (see the "
                "docs: changing the number of partitions)")
        return True

    def _place(self, partition_key: Optional[str], group: Optional[str],
               dedupe_key: Optional[str], job_id: Optional[str] = None) -> int:
        """The partition of one job: by its group, else its partition_key, else its
        dedupe key, else its caller-chosen id (so a re-sent id meets itself: duplicate),
        else the next in turn."""
        if group is not None:
            if partition_key is not None:
                raise InvalidInput("a grouped job is placed by its group (a group lives in "
                                   "one partition): drop partition_key")
            return self.partition_for(check_group_name(group))
        if partition_key is not None:
            if dedupe_key is not None:
                raise InvalidInput("a job with a dedupe_key is placed by it (the key lives in "
                                   "one partition): drop partition_key")
            return self.partition_for(partition_key)
        if dedupe_key is not None:
            return self.partition_for(check_key(dedupe_key))
        if job_id is not None:
            return self.partition_for(check_job_id(job_id))
        return next(self._turn) % self.partitions

    # --- enqueue -------------------------------------------------------------------------
    @operation
    def enqueue(self, payload: Any, *, job_id: Optional[str] = None, priority: int = 0,
                attempts: Optional[int] = None, backoff: Optional[Backoff] = None,
                delay_ms: Optional[Delay] = None, run_at_ms: Optional[RunAt] = None,
                dedupe_key: Optional[str] = None, dedupe_ms: Optional[Delay] = None,
                dedupe: Optional[str] = None, expires_ms: Optional[Delay] = None,
                group: Optional[str] = None, depends_on: Optional[Iterable[Any]] = None,
                on_dep_failure: str = "fail", timeout_ms: Optional[int] = None,
                partition_key: Optional[str] = None) -> Returns[JobRef]:
        """Add one job to its partition (see the module docstring for placement); the
        options are :meth:`emqfast.Queue.enqueue`'s. ``partition_key``: jobs sharing it
        go to one partition and run in their order (and priority) there. The ref knows
        its partition (``ref.wait()`` works)."""
        part = self.partition_queues[self._place(partition_key, group, dedupe_key, job_id)]
        yield from self._layout()
        ref: JobRef = yield from type(part).enqueue.op(
            part, payload, job_id=job_id, priority=priority, attempts=attempts,
            backoff=backoff, delay_ms=delay_ms, run_at_ms=run_at_ms, dedupe_key=dedupe_key,
            dedupe_ms=dedupe_ms, dedupe=dedupe, expires_ms=expires_ms, group=group,
            depends_on=depends_on, on_dep_failure=on_dep_failure, timeout_ms=timeout_ms)
        return ref

    @operation
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
        """Add many jobs with shared options (see :meth:`emqfast.Queue.enqueue_many`), each
        placed as :meth:`enqueue` places one: ``partition_key`` for all, or
        ``partition_keys`` (one key or None per payload); without keys the jobs are dealt
        round robin. Everything is validated before anything is sent; then each
        partition's jobs go as one bulk, partition after partition. A failure part-way
        raises :class:`~emqfast.errors.PartialBatch` over the whole batch (``not_sent``
        holds the jobs of partitions not reached); :meth:`retry_partial` re-sends the rest.
        Refs come back in the payloads' order."""
        if isinstance(payloads, (str, bytes, bytearray, memoryview, dict)) \
                or not _iterable(payloads):
            raise InputTypeError("enqueue_many takes an iterable of payloads (a list), not "
                                 f"one payload ({type(payloads).__name__}): use enqueue for one")
        shared = self._shared(priority, attempts, backoff, delay_ms, run_at_ms, group,
                              timeout_ms)
        jobs = _job_rows(payloads, job_ids, self.max_payload_bytes)
        keys = key_list(dedupe_keys, len(jobs))
        shared = shared._replace(extras=dedupe_extras(keys is not None, dedupe_ms, dedupe,
                                                      expires_ms))
        placement = self._placement(len(jobs), group, keys, partition_key, partition_keys,
                                    None if job_ids is None else [job.id for job in jobs])
        yield from self._layout()
        batch = EnqueueBatch(jobs, shared, self._wait, dedupe_keys=keys)
        refs: List[JobRef] = yield from self._admit_placed(batch, placement, {})
        return refs

    def _placement(self, n: int, group: Optional[str], keys: Optional[List[Optional[str]]],
                   partition_key: Optional[str],
                   partition_keys: Optional[Sequence[Optional[str]]],
                   chosen_ids: Optional[List[str]]) -> Placement:
        """Partition -> the indexes of its jobs, for ``n`` jobs of one enqueue_many
        (``chosen_ids``: the caller's job ids, or None when minted). Jobs dealt round
        robin get a ``range`` per partition (sliced, not looped, on the bulk path)."""
        placing = placement_keys(n, partition_key, partition_keys)
        if group is not None or (keys is None and partition_key is not None):
            one = self._place(partition_key, group, None) if n else 0
            if group is not None and any(k is not None for k in placing):
                raise InvalidInput("a grouped job is placed by its group: drop partition_keys")
            return {one: range(n)}
        if keys is None and chosen_ids is None and all(k is None for k in placing):
            start = next(self._turn)  # dealt round robin: job i to partition start + i
            by_range: Placement = {}
            for p in range(min(n, self.partitions)):
                by_range[(start + p) % self.partitions] = range(p, n, self.partitions)
            return by_range
        dedupe = keys if keys is not None else [None] * n
        chosen = chosen_ids if chosen_ids is not None else [None] * n
        by_list: Dict[int, List[int]] = {}
        for i, (pk, dk, j) in enumerate(zip(placing, dedupe, chosen)):
            by_list.setdefault(self._place(pk, None, dk, j), []).append(i)
        return dict(by_list)

    def _admit_placed(self, batch: EnqueueBatch, placement: Placement,
                      done: Dict[str, JobRef]) -> Returns[List[JobRef]]:
        """Send each partition's share of ``batch``, partition after partition; the refs
        of the whole batch in its order (``done``: refs landed by an earlier try, by the
        id sent). A partition failing part-way raises one PartialBatch over the whole
        batch (retry_partial re-sends the rest)."""
        out: List[Optional[JobRef]] = [None] * len(batch.jobs)
        unsent: List[str] = []
        failed: Optional[PartialBatch] = None
        first = True
        for p, picks in sorted(placement.items()):
            part = self.partition_queues[p]
            sub = _subset(batch, picks)
            if failed is not None:
                unsent += sub.job_ids
                continue
            try:
                refs = yield from admit_many(part.keys, part.name, sub)
            except PartialBatch as cut:
                failed = cut
                for ref in cut.landed:
                    done[ref.id] = part._bind(ref)
                continue
            except Exception as exc:  # nothing of this partition written: say what was
                if first and not done:
                    raise
                failed = PartialBatch(f"enqueue_many failed part-way: {exc}",
                                      not_sent=sub.job_ids)
                failed.__cause__ = exc
                continue
            finally:
                first = False
            bind = part._bind
            for ref in refs:  # (a deduplicated job's ref names the job holding its key)
                bind(ref)
            if isinstance(picks, range):
                out[picks.start:picks.stop:picks.step] = refs
            else:
                for i, ref in zip(picks, refs):
                    out[i] = ref
        if done:  # an earlier try's, or this one's landed before a failure
            for i, job in enumerate(batch.jobs):
                if out[i] is None and job.id in done:
                    out[i] = done[job.id]
        if failed is not None:
            whole = PartialBatch(str(failed), [ref for ref in out if ref is not None],
                                 failed.unknown, failed.not_sent + unsent)
            whole.__cause__ = failed.__cause__
            whole.batch = batch.subset(range(len(batch.jobs)),
                                       batch.recovering | set(failed.unknown))
            whole.queue = self.name
            whole.placement = placement  # type: ignore[attr-defined]
            raise whole
        return [ref for ref in out if ref is not None]

    @operation
    def retry_partial(self, partial: PartialBatch) -> Returns[List[JobRef]]:
        """Re-send what a PartialBatch raised by this queue's ``enqueue_many`` left undone,
        each job to the partition it was placed in, with the same ids (never duplicated;
        see :meth:`emqfast.Queue.retry_partial`). Refs for the whole original batch."""
        batch = getattr(partial, "batch", None)
        placement: Optional[Placement] = getattr(partial, "placement", None)
        if not isinstance(batch, EnqueueBatch) or placement is None \
                or getattr(partial, "queue", None) != self.name:
            raise InvalidInput("retry_partial takes a PartialBatch raised by this queue's "
                               "enqueue_many")
        done = {ref.id: ref for ref in partial.landed}
        todo = set(partial.unknown) | set(partial.not_sent)
        picks: List[int] = []
        by_part: Dict[int, List[int]] = {}
        for p, held in placement.items():
            for i in held:
                if batch.jobs[i].id in todo:
                    by_part.setdefault(p, []).append(len(picks))
                    picks.append(i)
        again = batch.subset(picks, batch.recovering | set(partial.unknown))
        refs: List[JobRef] = yield from self._admit_placed(again, dict(by_part), done)
        got = {job.id: ref for job, ref in zip(again.jobs, refs)}
        got.update(done)
        return [got[job.id] for job in batch.jobs if job.id in got]

    # --- by id: the partition holding the job ----------------------------------------------
    def _holder(self, job_id: str, record: bool = True) -> Op:
        """The partition queue holding job ``job_id``, or None (at most P reads)."""
        check_job_id(job_id)
        yield from self._layout(record)
        first = self.partition_for(job_id)  # where a caller-chosen id is placed
        for i in [first, *(i for i in range(self.partitions) if i != first)]:
            part = self.partition_queues[i]
            if (yield from _exists(part, job_id)):
                return part
        return None

    def _holder_or_raise(self, job_id: str) -> Op:
        part = yield from self._holder(job_id)
        if part is None:
            raise self._not_found(job_id)
        return part

    @operation
    def find_partition(self, job_id: str) -> Returns[Optional[Queue]]:
        """The plain Queue of the partition holding job ``job_id``, or None (the id's own
        partition is read first, then the others: at most P reads)."""
        part: Optional[Queue] = yield from self._holder(job_id, record=False)
        return part

    @operation
    def get(self, job_id: str) -> Returns[Optional[Job]]:
        """Job ``job_id`` from whichever partition holds it, or None."""
        part = yield from self._holder(job_id, record=False)
        if part is None:
            return None
        job: Optional[Job] = yield from type(part).get.op(part, job_id)
        return job

    @operation
    def cancel(self, job_id: str) -> Returns[Union[bool, CancelResult]]:
        """:meth:`emqfast.Queue.cancel` in the partition holding the job."""
        part = yield from self._holder_or_raise(job_id)
        got: Union[bool, CancelResult] = yield from type(part).cancel.op(part, job_id)
        return got

    @operation
    def retry(self, job_id: str) -> Returns[None]:
        """:meth:`emqfast.Queue.retry` in the partition holding the job."""
        part = yield from self._holder_or_raise(job_id)
        yield from type(part).retry.op(part, job_id)

    @operation
    def delete(self, job_id: str) -> Returns[bool]:
        """:meth:`emqfast.Queue.delete` in the partition holding the job."""
        part = yield from self._holder_or_raise(job_id)
        got: bool = yield from type(part).delete.op(part, job_id)
        return got

    @operation
    def promote_job(self, job_id: str) -> Returns[bool]:
        """:meth:`emqfast.Queue.promote_job` in the partition holding the job."""
        part = yield from self._holder_or_raise(job_id)
        got: bool = yield from type(part).promote_job.op(part, job_id)
        return got

    def ref(self, job_id: str) -> JobRef:
        """A :class:`JobRef` to job ``job_id``, bound to the partition holding it (one
        read per partition at most; an id no partition holds is bound to partition 0, so
        waiting on it raises JobNotFound as for a plain queue)."""
        if self.is_async:  # a lookup cannot be awaited from a plain method
            raise InputTypeError("under emqfast.aio use `await q.aref(job_id)`")
        found = self._drive(self._holder(job_id, record=False))
        return (found or self.partition_queues[0]).ref(job_id)

    async def aref(self, job_id: str) -> JobRef:
        """``ref`` for emqfast.aio (awaited)."""
        found = await self._drive(self._holder(job_id, record=False))
        return (found or self.partition_queues[0]).ref(job_id)

    # --- logical views: every partition ----------------------------------------------------
    @operation
    def counts(self) -> Returns[Dict[str, int]]:
        """Jobs per state over all partitions (see :meth:`emqfast.Queue.counts`)."""
        total: Dict[str, int] = {}
        for each in (yield from self._each("counts", layout=False)):
            for state, n in each.items():
                total[state] = total.get(state, 0) + n
        return total

    @operation
    def partition_counts(self) -> Returns[List[Dict[str, int]]]:
        """:meth:`emqfast.Queue.counts` of each partition, in partition order."""
        got: List[Dict[str, int]] = yield from self._each("counts", layout=False)
        return got

    @operation
    def job_ids(self, state: str, start: int = 0, stop: int = -1) -> Returns[List[str]]:
        """Ids in ``state`` over all partitions: each partition's, partition after
        partition, then ``start``/``stop`` applied to the whole (as ZRANGE indexes)."""
        reach = stop if start >= 0 and stop >= 0 else -1
        yield from self._layout(False)
        ids_: List[str] = []
        for part in self.partition_queues:
            ids_ += yield from type(part).job_ids.op(part, state, 0, reach)
        n = len(ids_)
        lo = start if start >= 0 else max(n + start, 0)
        hi = stop if stop >= 0 else n + stop
        return ids_[lo:hi + 1]

    @operation
    def next_due_ms(self) -> Returns[Optional[int]]:
        """The earliest due time of a scheduled job over all partitions, or None."""
        due = [d for d in (yield from self._each("next_due_ms", layout=False)) if d is not None]
        return min(due) if due else None

    @operation
    def is_paused(self) -> Returns[bool]:
        """Whether every partition is paused (:meth:`pause` pauses them all)."""
        return all((yield from self._each("is_paused", layout=False)))

    @operation
    def pause(self) -> Returns[None]:
        """Pause every partition: jobs are still accepted, workers claim none."""
        yield from self._each("pause")

    @operation
    def resume(self) -> Returns[None]:
        """Resume every partition."""
        yield from self._each("resume")

    @operation
    def configure_events(self, maxlen: int = events_mod.DEFAULT_EVENTS_CAP) -> Returns[None]:
        """Cap each partition's events stream at about ``maxlen`` entries."""
        yield from self._each("configure_events", maxlen)

    @operation
    def set_rate_limit(self, max_jobs: int, window_ms: Delay) -> Returns[None]:
        """Limit claims to ``max_jobs`` per ``window_ms`` **per partition**: each partition
        enforces it alone (one budget per slot, so per master), so the logical queue runs
        up to P times ``max_jobs`` per window. For a whole-queue budget B give
        ``ceil(B / P)`` (jobs spread evenly when placed round robin)."""
        yield from self._each("set_rate_limit", max_jobs, window_ms)

    @operation
    def clear_rate_limit(self) -> Returns[None]:
        """Remove every partition's rate limit."""
        yield from self._each("clear_rate_limit")

    @operation
    def rate_limit(self) -> Returns[Optional[Tuple[int, int]]]:
        """Partition 0's rate limit (each partition's, when set by :meth:`set_rate_limit`)."""
        part = self.partition_queues[0]
        yield from self._layout(False)
        got: Optional[Tuple[int, int]] = yield from type(part).rate_limit.op(part)
        return got

    @operation
    def metrics(self) -> Returns[metrics_mod.QueueMetrics]:
        """The partitions' metrics summed: counters, histograms and state sizes."""
        each: List[metrics_mod.QueueMetrics] = yield from self._each("metrics", layout=False)
        return metrics_mod.combine(self.name, each)

    @operation
    def read_events(self, since: str = "0-0", *, count: int = 100,
                    block_ms: Optional[int] = None) -> Returns[List[events_mod.Event]]:
        """Up to ``count`` events after position ``since`` over all partitions, merged by
        stream id (server time; each event's ``fields`` name its ``partition``).
        ``block_ms`` waits that long for one when there is none (shared out over the
        partitions in turn)."""
        since = events_mod.check_position(since)
        check_int(count, "count", 1, 1_000_000)
        if block_ms is not None:
            check_int(block_ms, "block_ms", 0, 1 << 40)
        yield from self._layout(False)
        merged: List[events_mod.Event] = yield from self._read_all(since, count, None)
        if merged or block_ms is None:
            return merged
        share = max(block_ms // self.partitions, 1) if block_ms else 1000
        blocked: List[events_mod.Event] = yield from self._read_all(since, count, share)
        return blocked

    def _read_all(self, since: str, count: int, block_ms: Optional[int]) -> Op:
        lists = []
        for i, part in enumerate(self.partition_queues):
            got = yield from events_mod.read_op(part.keys, since, count, block_ms)
            for event in got:
                event.fields.setdefault("partition", str(i))
            lists.append(got)
            if got and block_ms is not None:
                break
        return list(itertools.islice(heapq.merge(*lists, key=_event_order), count))

    @operation
    def last_event_id(self) -> Returns[str]:
        """The newest event id over all partitions (``"0-0"`` when none)."""
        last: List[str] = yield from self._each("last_event_id", layout=False)
        return max(last, key=_position)

    # --- maintenance: every partition -------------------------------------------------------
    @operation
    def promote(self, limit: int = 1000) -> Returns[int]:
        """:meth:`emqfast.Queue.promote` on each partition (``limit`` each); moved in all."""
        return sum((yield from self._each("promote", limit)))

    @operation
    def reap(self, max_stalled: int = 1, limit: int = 1000) -> Returns[Tuple[int, int]]:
        """:meth:`emqfast.Queue.reap` on each partition; ``(requeued, failed)`` in all."""
        got = yield from self._each("reap", max_stalled, limit)
        return sum(r for r, _ in got), sum(f for _, f in got)

    @operation
    def trim(self, *, keep_completed: int = 1000, keep_failed: int = 10_000,
             max_age_ms: Optional[Delay] = None, limit: int = 50_000,
             keep_cancelled: int = 1000, keep_expired: int = 1000) -> Returns[int]:
        """:meth:`emqfast.Queue.trim` on each partition (the counts kept are per partition)."""
        return sum((yield from self._each(
            "trim", keep_completed=keep_completed, keep_failed=keep_failed,
            max_age_ms=max_age_ms, limit=limit, keep_cancelled=keep_cancelled,
            keep_expired=keep_expired)))

    @operation
    def settle_dependencies(self, grace_ms: Optional[int] = None) -> Returns[Settled]:
        """:meth:`emqfast.Queue.settle_dependencies` on each partition; what they did, in
        all."""
        each: List[Settled] = yield from self._each("settle_dependencies", grace_ms)
        return Settled(**{f.name: (any if f.name == "busy" else sum)(
            getattr(x, f.name) for x in each) for f in dataclasses.fields(Settled)})

    @operation
    def obliterate(self) -> Returns[int]:
        """Delete every key of every partition and the layout record; keys deleted. The
        name may then be opened with another number of partitions."""
        n = sum((yield from self._each("obliterate", layout=None)))
        n += yield from Queue.obliterate.op(self)
        self._layout_known = False
        return int(n)

    def _each(self, method: str, *args: Any, layout: Optional[bool] = True,
              **kwargs: Any) -> Op:
        """Run ``method``'s operation on every partition in turn; the results in order.
        ``layout``: True for a write (records the layout), False for a read (checks it),
        None for neither."""
        if layout is not None:
            yield from self._layout(layout)
        out = []
        for part in self.partition_queues:
            out.append((yield from getattr(type(part), method).op(part, *args, **kwargs)))
        return out

    # --- what a logical queue does not offer as one --------------------------------------
    @property
    def groups(self) -> "PartitionedGroups":  # type: ignore[override]
        """Group lanes: each group's calls go to the partition holding it."""
        groups = getattr(self, "_groups", None)
        if not isinstance(groups, PartitionedGroups):
            groups = self._groups = PartitionedGroups(self)  # type: ignore[assignment]
        return groups

    @property
    def schedules(self) -> "PartitionedSchedules":  # type: ignore[override]
        """Repeatable schedules: each lives in the partition of its name (a Worker serving
        that partition mints its jobs there); :meth:`PartitionedSchedules.list` and
        ``pump`` cover them all."""
        made = getattr(self, "_schedules", None)
        if not isinstance(made, PartitionedSchedules):
            made = self._schedules = PartitionedSchedules(self)  # type: ignore[assignment]
        return made


Queue._partitioned = PartitionedQueue  # Queue(name, conn, partitions=P) makes one
PartitionedQueue.__signature__ = constructor_signature(  # type: ignore[attr-defined]
    PartitionedQueue)


class PartitionedGroups:
    """``q.groups`` of a :class:`PartitionedQueue`: each call goes to the partition
    holding the group (a group lives in one partition); :meth:`list` lists them all."""

    def __init__(self, queue: PartitionedQueue):
        self.queue = queue

    def _drive(self, op: Op) -> Any:
        return self.queue._drive(op)

    def _of(self, group: str) -> Any:
        return self.queue.partition_queues[self.queue.partition_for(check_group_name(group))]

    def _call(self, name: str, group: str, *args: Any) -> Op:
        yield from self.queue._layout()
        part = self._of(group)
        groups = part.groups
        return (yield from getattr(type(groups), name).op(groups, group, *args))

    @operation
    def set_concurrency(self, group: str, n: Optional[int]) -> Returns[None]:
        """Cap the group's running jobs at ``n`` (None: no cap), in its partition."""
        yield from self._call("set_concurrency", group, n)

    @operation
    def concurrency(self, group: str) -> Returns[Optional[int]]:
        """The group's cap, or None."""
        got: Optional[int] = yield from self._call("concurrency", group)
        return got

    @operation
    def set_rate_limit(self, group: str, max_jobs: int, window_ms: Delay) -> Returns[None]:
        """Limit the group to ``max_jobs`` claims per ``window_ms`` (it lives in one
        partition, so this is the group's whole budget)."""
        yield from self._call("set_rate_limit", group, max_jobs, window_ms)

    @operation
    def clear_rate_limit(self, group: str) -> Returns[None]:
        """Remove the group's rate limit."""
        yield from self._call("clear_rate_limit", group)

    @operation
    def rate_limit(self, group: str) -> Returns[Optional[Tuple[int, int]]]:
        """The group's rate limit ``(max_jobs, window_ms)``, or None."""
        got: Optional[Tuple[int, int]] = yield from self._call("rate_limit", group)
        return got

    @operation
    def counts(self, group: str) -> Returns[Dict[str, int]]:
        """The group's job counts (see :meth:`emqfast.facade.groups.Groups.counts`)."""
        got: Dict[str, int] = yield from self._call("counts", group)
        return got

    @operation
    def list(self) -> Returns[List[str]]:
        """Every group with waiting jobs, over all partitions (sorted)."""
        found: List[str] = []
        yield from self.queue._layout(False)
        for part in self.queue.partition_queues:
            groups = part.groups
            found += yield from type(groups).list.op(groups)
        return sorted(set(found))


def layout_of(client: Any, name: str) -> Optional[int]:
    """The number of partitions queue ``name`` was made with, or None for a plain queue
    (one read of its meta hash, on a blocking client): what tools open a queue with."""
    got = client.hget(QueueKeys(name).meta, "partitions")
    return int(got) if got is not None else None


def open_queue(name: str, client: Any, **options: Any) -> Queue:
    """Queue ``name`` as it was made: a :class:`PartitionedQueue` when its meta records a
    layout, else a plain Queue (the CLI, the dashboard and the exporter open queues by
    name with it, so they show a partitioned queue as one)."""
    partitions = layout_of(client, name)
    if partitions is None:
        return Queue(name, client, **options)
    return Queue(name, client, partitions=partitions, **options)


class PartitionedSchedules:
    """``q.schedules`` of a :class:`PartitionedQueue`: a schedule lives in the partition of
    its name (its jobs are minted there); listing and pumping cover every partition."""

    def __init__(self, queue: PartitionedQueue):
        self.queue = queue

    def _drive(self, op: Op) -> Any:
        return self.queue._drive(op)

    def _call(self, method: str, name: str, *args: Any, **kwargs: Any) -> Op:
        yield from self.queue._layout()
        part = self.queue.partition_queues[self.queue.partition_for(name)]
        own = part.schedules
        return (yield from getattr(type(own), method).op(own, name, *args, **kwargs))

    def _each(self, method: str, *args: Any) -> Op:
        yield from self.queue._layout(False)
        out = []
        for part in self.queue.partition_queues:
            own = part.schedules
            out.append((yield from getattr(type(own), method).op(own, *args)))
        return out

    @operation
    def upsert(self, name: str, /, **spec: Any) -> Returns[Any]:
        """Create or update schedule ``name`` (the options of
        :meth:`emqfast.facade.schedules.Schedules.upsert`) in its partition."""
        got = yield from self._call("upsert", name, **spec)
        return got

    @operation
    def get(self, name: str) -> Returns[Any]:
        """Schedule ``name``, or None."""
        got = yield from self._call("get", name)
        return got

    @operation
    def remove(self, name: str) -> Returns[bool]:
        """Delete schedule ``name``; False if it did not exist."""
        got: bool = yield from self._call("remove", name)
        return got

    @operation
    def list(self) -> Returns[List[Any]]:
        """Every schedule of every partition, soonest next run first."""
        found = [x for each in (yield from self._each("list")) for x in each]
        return sorted(found, key=lambda x: (x.next_run_ms is None, x.next_run_ms or 0))

    @operation
    def count(self) -> Returns[int]:
        """Number of schedules over all partitions."""
        return sum((yield from self._each("count")))

    def __len__(self) -> int:
        if getattr(self.queue, "is_async", False):
            raise TypeError("len() cannot await: use `await queue.schedules.count()`")
        return int(self.count())

    @operation
    def pump(self, limit: int = 100) -> Returns[int]:
        """Mint the due occurrences of every partition's schedules (``limit`` each)."""
        return sum((yield from self._each("pump", limit)))


def _exists(part: Queue, job_id: str) -> Op:
    found = yield Cmd.of("EXISTS", part.keys.job(job_id))
    return bool(int(found))


def _position(stream_id: str) -> Tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _event_order(event: events_mod.Event) -> Tuple[int, int]:
    return _position(event.id)
