"""Read-only views of one queue: jobs, counts and ids per state, the server clock,
settings, the events stream and metrics. A mixin of :class:`~emqfast.Queue`."""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

from emqfast.backends import select as backend
from emqfast.core.errors import InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Cmd, Op, Returns, operation
from emqfast.core.validation import check_int, check_job_id
from emqfast.facade import events as events_mod, metrics as metrics_mod
from emqfast.facade.job import Job

_INT64 = (-(1 << 63), (1 << 63) - 1)  # ZRANGE's indexes are signed 64-bit


class QueueInspection:
    """Reads of :class:`~emqfast.Queue` (``keys``, ``name``, ``redis`` and ``_drive`` are
    the Queue's)."""

    keys: QueueKeys
    name: str
    redis: Any
    _drive: Callable[[Op], Any]

    @operation
    def get(self, job_id: str) -> Returns[Optional[Job]]:
        """The job's state and data, or None if this queue holds no such job (never
        enqueued here, or trimmed). The missing-id rule: reading answers None, acting on
        a missing id (cancel, retry) raises :class:`~emqfast.errors.JobNotFound`, and an
        id without the ``JOB`` brand is a :class:`~emqfast.errors.KindError` for all."""
        check_job_id(job_id)
        h, delayed, active = yield Batch([Cmd.of("HGETALL", self.keys.job(job_id)),
                                          Cmd.of("ZSCORE", self.keys.delayed, job_id),
                                          Cmd.of("ZSCORE", self.keys.active, job_id)])
        return Job.from_hash(self.name, job_id, h, delayed, active) if h else None

    @operation
    def counts(self) -> Returns[Dict[str, int]]:
        """Number of jobs per state (``cancelled``: the records kept of cancelled jobs;
        ``waiting_deps``: jobs waiting for their dependencies; ``expired``: the records kept
        of jobs discarded unstarted past their ``expires_ms``).
        ``pending`` includes the jobs waiting in group lanes;
        ``grouped`` is how many of them do (one round trip without groups, two with)."""
        k = self.keys
        s, p, a, c, f, x, w, e, ring = yield Batch(
            [Cmd.of("ZCARD", key) for key in (k.delayed, k.pending, k.active, k.completed,
                                              k.failed, k.cancelled, k.waitdeps, k.expired)]
            + [Cmd.of("ZRANGE", k.groups, 0, -1)])
        grouped = 0
        if ring:  # a lane holding jobs keeps its group on the ring, so these are all of them
            lanes = yield Batch([Cmd.of("ZCARD", k.group_pending(g.decode())) for g in ring])
            grouped = sum(int(n) for n in lanes)
        return {"scheduled": s, "pending": p + grouped, "grouped": grouped, "active": a,
                "completed": c, "failed": f, "cancelled": x, "waiting_deps": w,
                "expired": e}

    @operation
    def job_ids(self, state: str, start: int = 0, stop: int = -1) -> Returns[List[str]]:
        """Ids in one state, in the order they will run (or finished or were cancelled,
        newest first);
        ``start``/``stop`` index them as ZRANGE does (inclusive, negative from the end).

        ``pending`` holds every job :meth:`counts` counts as pending: the flat pending set
        in run order, then each group's lane (in run order within it) in the ring's order.
        Lanes take turns, so across lanes this is not the exact order jobs will start."""
        key = {"scheduled": self.keys.delayed, "pending": self.keys.pending,
               "active": self.keys.active, "completed": self.keys.completed,
               "failed": self.keys.failed, "cancelled": self.keys.cancelled,
               "waiting_deps": self.keys.waitdeps, "expired": self.keys.expired,
               }.get(state) if isinstance(state, str) else None
        if key is None:
            raise InvalidInput(f"unknown state {state!r}: one of scheduled, pending, active, "
                               "completed, failed, cancelled, waiting_deps, expired")
        check_int(start, "start", *_INT64)
        check_int(stop, "stop", *_INT64)
        if state in ("completed", "failed", "cancelled", "expired"):
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
        reads = _slice_reads(keys, sizes, start, stop)
        if not reads:
            return []
        return [i for part in (yield Batch(reads)) for i in part]

    @operation
    def next_due_ms(self) -> Returns[Optional[int]]:
        """Run-at (epoch ms) of the earliest delayed job, or None."""
        head = yield Cmd.of("ZRANGE", self.keys.delayed, 0, 0, "WITHSCORES", withscores=True)
        return backend.impl().unpack_delayed(int(head[0][1]))[0] if head else None

    @operation
    def server_time_ms(self) -> Returns[int]:
        """The Redis server's clock, epoch ms (the clock every schedule is measured on)."""
        sec, usec = yield Cmd.of("TIME")
        return int(sec) * 1000 + int(usec) // 1000

    @operation
    def is_paused(self) -> Returns[bool]:
        """True while the queue is paused."""
        paused: Optional[bytes] = yield Cmd.of("HGET", self.keys.meta, "paused")
        return paused == b"1"

    @operation
    def rate_limit(self) -> Returns[Optional[Tuple[int, int]]]:
        """``(max_jobs, window_ms)``, or None when the queue has no rate limit."""
        got = yield Cmd.of("HMGET", self.keys.meta, "rate_max", "rate_window")
        limit = tuple(int(v) if v is not None else 0 for v in got)
        return cast(Tuple[int, int], limit) if all(limit) else None  # HMGET of two fields

    # --- observability ---------------------------------------------------------------
    @operation
    def read_events(self, since: str = "0-0", *, count: int = 100,
                    block_ms: Optional[int] = None) -> Returns[List[events_mod.Event]]:
        """The events of up to ``count`` stream entries after position ``since`` (one XREAD;
        a batched entry brings one event per job of its batch);
        ``block_ms`` waits that long for the first one (0: forever)."""
        since = events_mod.check_position(since)
        check_int(count, "count", 1, 1_000_000)
        if block_ms is not None:
            check_int(block_ms, "block_ms", 0, 1 << 40)
        got: List[events_mod.Event] = yield from events_mod.read_op(self.keys, since, count,
                                                                     block_ms)
        return got

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
    def last_event_id(self) -> Returns[str]:
        """Id of the newest event in the stream (``"0-0"`` when empty)."""
        last: str = yield from events_mod.last_id_op(self.keys)
        return last

    @operation
    def metrics(self) -> Returns[metrics_mod.QueueMetrics]:
        """Counters and latency histograms of this queue (cluster-wide, from Redis)."""
        snapshot: metrics_mod.QueueMetrics = yield from metrics_mod.snapshot_op(self.keys)
        return snapshot


def _slice_reads(keys: List[str], sizes: List[int], start: int, stop: int) -> List[Cmd]:
    """The ZRANGEs reading items ``start..stop`` (ZRANGE indexing) of ``keys`` laid end to
    end, ``sizes`` their lengths."""
    total = sum(sizes)
    first = max(start + total if start < 0 else start, 0)
    last = min(stop + total if stop < 0 else stop, total - 1)
    reads, offset = [], 0
    for key, size in zip(keys, sizes):
        lo, hi = max(first - offset, 0), min(last - offset, size - 1)
        if lo <= hi:
            reads.append(Cmd.of("ZRANGE", key, lo, hi))
        offset += size
    return reads
