"""Moves that keep one queue healthy, on the server clock and in bounded calls: promote
due jobs, reap expired leases, trim finished jobs, obliterate the queue. A mixin of
:class:`~emqfast.Queue` (the Workers run promote, reap and trim on their beat)."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from emqfast.backends.scripts import load
from emqfast.core.batching import REAP_BATCH, TRIM_BATCH, batches, chunks
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, Scan, operation
from emqfast.core.scores import MAX_RUN_AT_MS
from emqfast.core.validation import check_int
from emqfast.core.times import Delay, delay_ms
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import lanes
from emqfast.facade.due import expired_leases, parse_due
from emqfast.facade.promote import promote_op

_REAP = load("reap")
_TRIM = load("trim")

MAX_MOVE_LIMIT = 1_000_000  # the most jobs one promote/reap/trim call may handle in all
TRIM_LIMIT = 50_000  # trim's default per finished set: bounds one Worker beat too


class QueueMaintenance:
    """Housekeeping moves of :class:`~emqfast.Queue` (``keys`` and ``_drive`` are the
    Queue's)."""

    keys: QueueKeys
    _drive: Callable[[Op], Any]

    @operation
    def promote(self, limit: int = 1000) -> Returns[int]:
        """Release up to ``limit`` due delayed jobs to pending (server clock); returns how
        many moved. Reads the due ids :data:`DUE_BATCH` at a time and moves them in script
        calls of at most :data:`PROMOTE_BATCH` jobs (bounded work per call)."""
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
        """Delete every key of this queue (jobs, schedules, meta). Returns keys deleted."""
        n = 0
        for batch in chunks(list((yield Scan(self.keys.glob(), 1000))), 500):
            n += int((yield Cmd.of("UNLINK", *batch)))
        return n
