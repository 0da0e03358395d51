"""Control of one queue and its jobs: cancel or retry a job, pause and resume, and the
queue-wide settings (events cap, rate limit). A mixin of :class:`~emqfast.Queue`."""
from __future__ import annotations

import json
from enum import Enum
from typing import Any, Callable, Union

from emqfast.backends.scripts import load
from emqfast.core.errors import DependencyFailed, JobNotFound, JobStateError
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.core.scores import MAX_OFFSET_MS
from emqfast.core.validation import check_int, check_job_id
from emqfast.core.times import Delay, delay_ms
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import deps, events as events_mod, lanes

_CANCEL = load("cancel")
_RETRY = load("retry")
_PROMOTE_ONE = load("promote_one")
_DELETE = load("delete")
_PAUSE = load("pause")
_CONFIGURE = load("configure")


def _dependency_failed(job_id: str, opts: Any) -> Returns[DependencyFailed]:
    """The refusal to retry ``job_id``, naming its dependencies that did not complete."""
    listed = deps.deps_of(json.loads(opts)) if opts else []
    states = (yield Batch([Cmd.of("HGET", QueueKeys(q).job(j), "state")
                           for q, j in listed])) if listed else []
    unmet = [dep for dep, st in zip(listed, states) if st != b"completed"]
    named = ", ".join(f"{q}/{j}" for q, j in unmet[:5]) or "a dependency"
    return DependencyFailed(
        f"cannot retry {job_id}: it failed because {named} did not complete, so run again "
        "it would get no result for it. Retry the dependency, then enqueue this job again "
        "with depends_on (nothing was written)", unmet)


class CancelResult(str, Enum):
    """What ``Queue.cancel`` answers for a running job: its worker was asked to stop it
    (``"requested"``; a waiting job answers a bool). The job then ends ``cancelled``."""

    REQUESTED = "requested"  # its worker was asked to stop it; it ends cancelled


class QueueControl:
    """Writes that steer :class:`~emqfast.Queue` (``keys``, ``name`` and ``_drive`` are the
    Queue's). By-id writes follow one missing-id rule: an id the queue does not hold raises
    :class:`~emqfast.errors.JobNotFound` (reads answer None, see ``Queue.get``)."""

    keys: QueueKeys
    name: str
    _drive: Callable[[Op], Any]

    def _not_found(self, job_id: str) -> JobNotFound:
        """The one error of every by-id write on an id this queue does not hold."""
        return JobNotFound(f"no job {job_id} in queue {self.name!r}: never enqueued here, "
                           "or deleted since (trim, obliterate); check the id and the queue")

    def _state_of(self, job_id: str) -> Op:
        """``job_id``'s state (``None``: no such job), for messages. A waiting job stores
        no state: the delayed set holding it means scheduled, else it is pending."""
        state, delayed, exists = yield Batch([Cmd.of("HGET", self.keys.job(job_id), "state"),
                                              Cmd.of("ZSCORE", self.keys.delayed, job_id),
                                              Cmd.of("EXISTS", self.keys.job(job_id))])
        if not exists:
            return None
        if state is not None:
            return state.decode()
        return "scheduled" if delayed is not None else "pending"

    @operation
    def cancel(self, job_id: str) -> Returns[Union[bool, "CancelResult"]]:
        """Cancel a job atomically.

        - a scheduled, pending or ``waiting_deps`` job: cancelled at once, ``True``; it
          keeps a record (state ``cancelled``, listed by ``job_ids("cancelled")``, trimmed like finished
          jobs), and its waiters and dependents are told (outcome ``cancelled``);
        - a job a Worker claimed but whose handler has not started (held for a free
          handler slot): cancelled at once, ``True``; its handler never runs (a grouped
          one answers ``"requested"``: its Worker ends it as it starts, unrun);
        - an active job: ``CancelResult.REQUESTED`` (the string ``"requested"``, truthy):
          the job is marked and the Worker running it is told at once (pub/sub, any
          process). An async handler's task is cancelled; a sync handler sees
          ``job.cancelled`` turn True (``job.raise_if_cancelled()`` raises
          :class:`~emqfast.Cancelled`). The job then ends ``cancelled`` (never retried,
          whatever the handler does next) unless the handler had already finished;
        - ``False`` when it finished or was cancelled already (``q.get(job_id).state``
          says which; nothing is written).

        Raises :class:`~emqfast.errors.JobNotFound` when the queue holds no such job."""
        check_job_id(job_id)
        k = self.keys
        group, exists, state = yield Batch([Cmd.of("HGET", k.job(job_id), "group"),  # lane
                                            Cmd.of("EXISTS", k.job(job_id)),
                                            Cmd.of("HGET", k.job(job_id), "state")])
        if not exists:
            raise self._not_found(job_id)
        if state == b"waiting_deps":  # not on any run set yet: its own move
            return int((yield deps.cancel_waiting_call(k, job_id))) == 1
        pending = k.pending if group is None else k.group_pending(group.decode())
        reply = yield Call(_CANCEL, [k.job(job_id), pending, k.delayed, k.meta, k.events,
                                     k.cancelled, k.active, k.waiters, k.dependents, k.outbox,
                                     k.leases, k.metrics],
                           [job_id, KEYSPACE_VERSION, k.cancel_channel])
        return CancelResult.REQUESTED if int(reply) == 2 else int(reply) == 1

    @operation
    def retry(self, job_id: str) -> Returns[None]:
        """Send a failed job back to pending with a fresh set of attempts. Raises
        :class:`~emqfast.errors.JobNotFound` for an id the queue does not hold,
        :class:`~emqfast.errors.JobStateError` naming the state of a job that is not failed,
        and :class:`~emqfast.errors.DependencyFailed` (nothing written) for a job failed
        because a dependency did not complete: run again, it would get no result for it."""
        check_job_id(job_id)
        k = self.keys
        group, failed, error, opts = yield Batch([
            Cmd.of("HGET", k.job(job_id), "group"), Cmd.of("ZSCORE", k.failed, job_id),
            Cmd.of("HGET", k.job(job_id), "error"), Cmd.of("HGET", k.job(job_id), "opts")])
        if failed is None:  # refused: say why (retry.lua would refuse too, writing nothing)
            state = yield from self._state_of(job_id)
            if state is None:
                raise self._not_found(job_id)
            if state != "failed":
                raise JobStateError(f"cannot retry {job_id}: it is {state}, and only failed "
                                    "jobs can be retried (q.get(job_id) shows it)")
        if error == b"dependency failed":  # retry.lua refuses it too
            raise (yield from _dependency_failed(job_id, opts))
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
    def promote_job(self, job_id: str) -> Returns[bool]:
        """Make one job waiting on the delayed set (scheduled, or a retry waiting out its
        backoff) due now: it joins pending, or its group lane, with its priority score kept,
        as :meth:`promote <emqfast.Queue.promote>` moves a due job; True. Raises
        :class:`~emqfast.errors.JobStateError` naming the state of a job that is not
        waiting there and :class:`~emqfast.errors.JobNotFound` for an id the queue does
        not hold (nothing written either way)."""
        check_job_id(job_id)
        k = self.keys
        group, delayed = yield Batch([Cmd.of("HGET", k.job(job_id), "group"),
                                      Cmd.of("ZSCORE", k.delayed, job_id)])
        if delayed is None:  # refused: say why, writing nothing
            state = yield from self._state_of(job_id)
            if state is None:
                raise self._not_found(job_id)
            raise JobStateError(f"cannot promote {job_id}: it is {state}, and only a "
                                "scheduled job (or a retry waiting on its backoff) can be "
                                "promoted now")
        g = "" if group is None else group.decode()
        lane = k.pending if group is None else k.group_pending(g)
        call = Call(_PROMOTE_ONE, [k.job(job_id), k.delayed, lane, k.marker, k.meta,
                                   k.events], [job_id, KEYSPACE_VERSION, g])
        if group is None:
            yield call
        else:  # a grouped job joins its lane, its group on the ring first
            calls = [lanes.join_call(k, [g]), call]
            lanes.combine_moves(calls, (yield Batch(calls)), lambda _: None)
        return True

    @operation
    def delete(self, job_id: str) -> Returns[bool]:
        """Delete one job that is not active, atomically: its hash and its place in
        whichever set holds it (pending or its group lane, scheduled, completed, failed,
        cancelled); True. Raises :class:`~emqfast.errors.JobStateError` for an active job
        (cancel it, or wait for it to finish) and :class:`~emqfast.errors.JobNotFound` for
        an id the queue does not hold (nothing written either way)."""
        check_job_id(job_id)
        k = self.keys
        group, exists, active = yield Batch([Cmd.of("HGET", k.job(job_id), "group"),
                                             Cmd.of("EXISTS", k.job(job_id)),
                                             Cmd.of("ZSCORE", k.active, job_id)])
        if not exists:
            raise self._not_found(job_id)
        if active is not None:
            raise JobStateError(f"cannot delete {job_id}: it is active (a worker runs it); "
                                "cancel it or wait until it finishes")
        g = "" if group is None else group.decode()
        lane = k.pending if group is None else k.group_pending(g)
        yield Call(_DELETE, [k.job(job_id), lane, k.delayed, k.completed, k.failed,
                             k.cancelled, k.active, k.meta, k.events, k.waitdeps,
                             deps.deplink_key(k), k.expired, k.job_deps(job_id), k.waiters,
                             k.dependents, k.outbox],
                   [job_id, KEYSPACE_VERSION, g])
        return True

    @operation
    def pause(self) -> Returns[None]:
        """Stop workers from claiming jobs (enqueues still succeed)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [1, KEYSPACE_VERSION])

    @operation
    def resume(self) -> Returns[None]:
        """Let workers claim again (wakes a blocked worker)."""
        yield Call(_PAUSE, [self.keys.meta, self.keys.marker], [0, KEYSPACE_VERSION])

    @operation
    def configure_events(self, maxlen: int = events_mod.DEFAULT_EVENTS_CAP) -> Returns[None]:
        """Cap the events stream at about ``maxlen`` entries; 0 turns events off.

        Stored in the queue's meta hash, so it applies to every producer and worker.
        """
        check_int(maxlen, "maxlen", 0, 1 << 40)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "events", maxlen])

    @operation
    def set_rate_limit(self, max_jobs: int, window_ms: Delay) -> Returns[None]:
        """Let workers start at most ``max_jobs`` jobs of this queue in any ``window_ms``
        (ms or a ``timedelta``; a sliding window on the Redis server clock, enforced in
        claim.lua)."""
        check_int(max_jobs, "max_jobs", 1, 1 << 31)
        window_ms = delay_ms(window_ms, "window_ms", 1, MAX_OFFSET_MS)
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", max_jobs, "rate_window", window_ms])

    @operation
    def clear_rate_limit(self) -> Returns[None]:
        """Remove the queue's rate limit (wakes a worker waiting on it)."""
        yield Call(_CONFIGURE, [self.keys.meta, self.keys.marker],
                   [KEYSPACE_VERSION, "rate_max", 0, "rate_window", 0])
