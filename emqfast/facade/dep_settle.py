"""Settling dependencies: what releases or fails the jobs waiting on a queue's
ended jobs, and what repairs a graph a crash left half-linked. See
:mod:`emqfast.facade.deps` for the protocol; every step here is safe to repeat, from any
number of processes at once.

- **Drain**: each ``outbox`` entry (``"<outcome>\0<id>"``, queued by the finish hook) has
  its dependents (SSCAN of the job's dependents set) resolved in their own slots
  (``dep_resolve.lua``, which copies a completed job's result into each dependent's hash),
  then the entry and the set go. A dependent failed there is
  queued on its own queue's outbox (the cascade), drained in the same call within
  :data:`~emqfast.facade.deps.DRAIN_ROUNDS` reads.
- **Repair**: jobs marked on ``deplink`` for longer than the grace period (a producer that
  died between the write and the links) get their links sent again.
- **Sweep**: the safety net for jobs that ended by a path that did not call the finish
  hook (or vanished): one HSCAN chunk of the ``dependents`` hash per call, checked by
  ``dep_sweep.lua``, which queues them on the outbox as the hook would have.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Set

from emqfast.backends.scripts import load
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.core.validation import check_int
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import deps
from emqfast.facade.deps import (DEP_STALE, DRAIN_ENTRIES, DRAIN_ROUNDS, FAILED, RELEASED,
                                 REPAIR_BATCH, SCAN_COUNT, raise_any, text_of, deplink_key,
                                 link_op, member, resolve_call, split_member)

DEP_SWEEP = load("dep_sweep")
SWEEP_COUNT = 200  # dependents-hash entries checked per settle call

@dataclass
class Settled:
    """What one :func:`settle_op` did."""

    told: int = 0       # outbox entries handled (dependencies that ended)
    released: int = 0   # dependents released to pending
    failed: int = 0     # dependents failed ('dependency failed')
    relinked: int = 0   # waiting jobs whose unsent links the repair sent
    swept: int = 0      # ended jobs the sweep found still owing their dependents a word
    cursor: int = 0     # where the next sweep of the dependents hash resumes (0: the start)
    busy: bool = False  # the queue has dependency links in play (worth draining often)
    unlinked: int = 0   # jobs of the queue marked on deplink (links not all sent)


def settle_op(k: QueueKeys, grace_ms: Optional[int] = None, repair: bool = True,
              cursor: int = 0) -> Returns[Settled]:
    """Drain ``k``'s outbox (and, for the cascade, the outboxes of queues whose jobs it
    failed); with ``repair`` also re-send unsent links older than ``grace_ms`` (default
    :data:`~emqfast.facade.deps.REPAIR_GRACE_MS`) and sweep one chunk of the dependents
    hash from ``cursor``. Bounded by :data:`~emqfast.facade.deps.DRAIN_ROUNDS` reads."""
    grace_ms = deps.REPAIR_GRACE_MS if grace_ms is None else grace_ms
    done = Settled(cursor=cursor)
    yield from _drain(k, done)  # its first read says whether more is worth a round trip
    if repair and done.busy:
        yield from sweep_op(k, done)
        if done.swept:  # drained in this same call
            yield from _drain(k, done)
    if repair and done.unlinked:
        yield from repair_op(k, grace_ms, done)
    return done


def _drain(k: QueueKeys, done: Settled) -> Op:
    todo: List[QueueKeys] = [k]
    rounds = 0
    while todo and rounds < DRAIN_ROUNDS:
        qk = todo.pop(0)
        rounds += 1
        entries, links, unlinked = yield Batch([
            Cmd.of("LRANGE", qk.outbox, 0, DRAIN_ENTRIES - 1), Cmd.of("HLEN", qk.dependents),
            Cmd.of("ZCARD", deplink_key(qk))])
        if qk is k:
            done.busy = done.busy or bool(entries) or bool(int(links))
            done.unlinked = int(unlinked)
        cascaded: Set[str] = set()
        for raw in entries:
            cascaded |= yield from _tell_dependents(qk, raw, done)
        if len(entries) == DRAIN_ENTRIES:
            cascaded.add(qk.name)
        todo += [QueueKeys(name) for name in sorted(cascaded)
                 if name not in {t.name for t in todo}]
    return None


def _tell_dependents(qk: QueueKeys, raw: Any, done: Settled) -> Returns[Set[str]]:
    """Resolve every dependent of one outbox entry, then delete the entry and the set."""
    outcome, _, dep_id = text_of(raw).partition("\0")
    dep = member(qk.name, dep_id)
    key = qk.job_dependents(dep_id)
    # a completed job's result goes along: each dependent keeps a copy, so retention
    # trimming this job before they start loses them nothing
    result = (yield Cmd.of("HGET", qk.job(dep_id), "result")) if outcome == "completed" \
        else None
    cascaded: Set[str] = set()
    cursor: Any = 0
    while True:
        cursor, found = yield Cmd.of("SSCAN", key, cursor, "COUNT", SCAN_COUNT)
        targets = [split_member(m) for m in found]
        if targets:
            replies = yield Batch([resolve_call(QueueKeys(q), j, dep, outcome, result)
                                   for q, j in targets])
            raise_any(replies)
            for (queue, _), reply in zip(targets, replies):
                done.released += int(reply) == RELEASED
                if int(reply) == FAILED:
                    done.failed += 1
                    cascaded.add(queue)
        if int(cursor) == 0:
            break
    yield Batch([Cmd.of("DEL", key), Cmd.of("LREM", qk.outbox, 1, raw)])
    done.told += 1
    return cascaded


def repair_op(k: QueueKeys, grace_ms: int, done: Settled) -> Op:
    """Re-send the links of jobs marked on ``deplink`` for longer than ``grace_ms``."""
    stale = yield Call(DEP_STALE, [deplink_key(k)], [grace_ms, REPAIR_BATCH])
    for raw in stale:
        job_id = text_of(raw)
        state, deps = yield Batch([Cmd.of("HGET", k.job(job_id), "state"),
                                   Cmd.of("SMEMBERS", k.job_deps(job_id))])
        if state == b"waiting_deps" and deps:
            yield from link_op(k, job_id, [split_member(m) for m in deps])
            done.relinked += 1
        else:  # released, failed or gone meanwhile: nothing left to link
            yield Cmd.of("ZREM", deplink_key(k), job_id)
    return None


def sweep_op(k: QueueKeys, done: Settled) -> Op:
    """One HSCAN chunk of the dependents hash from ``done.cursor``, checked by
    dep_sweep.lua; ``done.cursor`` is left where the next sweep resumes."""
    cursor, found = yield Cmd.of("HSCAN", k.dependents, done.cursor, "COUNT", SWEEP_COUNT)
    done.cursor = int(cursor)
    ids: List[str] = [text_of(i) for i in (found.keys() if isinstance(found, dict) else found[::2])]
    if ids:
        done.swept += int((yield Call(DEP_SWEEP, [k.dependents, k.outbox, k.meta, *k.jobs(ids)],
                                      [KEYSPACE_VERSION, *ids])))
    return None


class QueueDependencies:
    """The dependency step of :class:`~emqfast.Queue` (a mixin: ``keys`` and ``_drive``
    are the Queue's)."""

    keys: QueueKeys
    _drive: Callable[[Op], Any]

    @operation
    def settle_dependencies(self, grace_ms: Optional[int] = None) -> Returns[Settled]:
        """Release (or fail) the jobs waiting on dependencies of this queue that ended:
        drain its outbox, and re-send the links a producer that died between its steps
        left unsent for longer than ``grace_ms``. The Workers run it after their acks and
        on their beat; safe to call any time, from anywhere, as often as you like."""
        if grace_ms is not None:
            check_int(grace_ms, "grace_ms", 0, 1 << 40)
        settled: Settled = yield from settle_op(self.keys, grace_ms)
        while settled.cursor:  # by hand: the whole dependents hash is swept
            more: Settled = yield from settle_op(self.keys, grace_ms, cursor=settled.cursor)
            settled = _add(settled, more)
        return settled


def _add(a: Settled, b: Settled) -> Settled:
    return Settled(told=a.told + b.told, released=a.released + b.released,
                   failed=a.failed + b.failed, relinked=a.relinked + b.relinked,
                   swept=a.swept + b.swept, cursor=b.cursor, busy=a.busy or b.busy)
