"""Control of one queue and its jobs: cancel or retry a job, pause and resume, and the
queue-wide settings (events cap, rate limit). A mixin of :class:`~emqfast.Queue`."""
from __future__ import annotations

from typing import Any, Callable

from emqfast.backends.scripts import load
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, operation
from emqfast.core.scores import MAX_OFFSET_MS
from emqfast.core.validation import check_int, check_job_id
from emqfast.core.times import Delay, delay_ms
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import events as events_mod, lanes

_CANCEL = load("cancel")
_RETRY = load("retry")
_PAUSE = load("pause")
_CONFIGURE = load("configure")


class QueueControl:
    """Writes that steer :class:`~emqfast.Queue` (``keys`` and ``_drive`` are the Queue's)."""

    keys: QueueKeys
    _drive: Callable[[Op], Any]

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
        lanes.combine_moves(calls, (yield Batch(calls)), lambda _: None)

    @operation
    def pause(self) -> None:
        """Stop workers from claiming jobs (enqueues still succeed)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [1, KEYSPACE_VERSION])

    @operation
    def resume(self) -> None:
        """Let workers claim again (wakes a blocked worker)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [0, KEYSPACE_VERSION])

    @operation
    def configure_events(self, maxlen: int = events_mod.DEFAULT_EVENTS_CAP) -> None:
        """Cap the events stream at about ``maxlen`` entries; 0 turns events off.

        Stored in the queue's meta hash, so it applies to every producer and worker.
        """
        check_int(maxlen, "maxlen", 0, 1 << 40)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "events", maxlen])

    @operation
    def set_rate_limit(self, max_jobs: int, window_ms: Delay) -> None:
        """Let workers start at most ``max_jobs`` jobs of this queue in any ``window_ms``
        (ms or a ``timedelta``; a sliding window on the Redis server clock, enforced in
        claim.lua)."""
        check_int(max_jobs, "max_jobs", 1, 1 << 31)
        window_ms = delay_ms(window_ms, "window_ms", 1, MAX_OFFSET_MS)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", max_jobs, "rate_window", window_ms])

    @operation
    def clear_rate_limit(self) -> None:
        """Remove the queue's rate limit (wakes a worker waiting on it)."""
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", 0, "rate_window", 0])
