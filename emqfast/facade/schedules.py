"""Repeatable schedules: named cadences that mint one ordinary job per occurrence.

A schedule is one member of the queue's repeat registry (``emq:{q}:repeat``, a
sorted set: name -> next run, epoch ms) plus a record hash
(``emq:{q}:repeat:<name>``) holding its cadence and job options. Nothing loops in
memory: a *pump* (:meth:`Schedules.pump`, also run by every Worker) reads the due
names on the Redis server clock and, for each, mints the occurrence's job and
moves the registry entry to the next run in one Lua script.

Guarantees:

- **Upsert.** Registering an existing name rewrites its one registry entry and
  record, never adds a second. Re-registering the same cadence (a service boot)
  keeps its timing; a changed cadence takes effect from its next slot and bumps
  the record's generation, so no pump can still mint under the old cadence.
- **Exactly one job per occurrence.** The job id is derived from the schedule
  name and the occurrence's scheduled instant (:func:`occurrence_job_id`), and
  minting is a compare-and-set on (registry score, generation): any number of
  racing pumps, in any number of processes, mint each occurrence once.
- **Start to start.** The next run is computed from the occurrence's scheduled
  instant, never from when a pump ran or a job finished, so a slow job does not
  drift the cadence.
- **Missed runs** (every pump down for a while) follow the schedule's ``missed``
  policy. ``"skip"`` (the default) runs once now (the most recent missed slot)
  and realigns to the cadence: after an outage you usually want the report once,
  not fifty times. ``"catch_up"`` mints every missed occurrence in order, at most
  ``catch_up_limit`` of them (the most recent; older ones are dropped), for
  cadences where each occurrence matters (billing periods, per-hour rollups).
- **DST.** Cron cadences are evaluated in their IANA zone by croniter on
  zoneinfo datetimes: an appointment such as ``30 2 * * *`` runs once on the
  spring-forward day (at 03:00, the end of the gap) and once on the fall-back
  day (at the first 02:30). See :mod:`emqfast.core.cadence`.
- **Server clock.** "Now" is Redis ``TIME`` read inside the scripts.
- **Wake marker.** Each mint sets the queue's wake marker to the next run, so a
  blocked worker wakes then rather than on a polling tick.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional

from emqfast.backends.scripts import load
from emqfast.core.ops import batches
from emqfast.core.errors import EmqError, InvalidInput
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.core.times import Delay, RunAt
from emqfast.core.validation import check_int, check_schedule_name
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.options import Backoff
from emqfast.facade.promote import due_schedules, parse_due
from emqfast.facade.schedule_spec import (DEFAULT_CATCH_UP_LIMIT, MAX_CATCH_UP_LIMIT,
                                          MISSED_POLICIES, Schedule, UpsertReply, UpsertSpec,
                                          occurrence_job_id, occurrence_of, prepare)
from emqfast.facade.schedule_sweep import (MINT_BATCH, SWEEP_BATCH, Sweep, count_minted,
                                           mint_calls)


__all__ = ["DEFAULT_CATCH_UP_LIMIT", "MAX_CATCH_UP_LIMIT", "MINT_BATCH", "MISSED_POLICIES",
           "SWEEP_BATCH", "Schedule", "Schedules", "Sweep", "occurrence_job_id",
           "occurrence_of"]

_UPSERT = load("schedule_upsert")
_REMOVE = load("schedule_remove")
_UPSERT_TRIES = 8


class Schedules:
    """The repeatable schedules of one queue (``queue.schedules``)."""

    def __init__(self, queue: Any):  # the Queue owning this part (it imports this module)
        self.queue = queue
        self._keys = queue.keys

    def _drive(self, op: Op) -> Any:
        # the queue's driver: blocking for emqfast.Queue, a coroutine for emqfast.aio.Queue
        return self.queue._drive(op)

    # --- registration --------------------------------------------------------------
    @operation
    def upsert(self, name: str, *, cron: Optional[str] = None, tz: Optional[str] = None,
               every_ms: Optional[Delay] = None, start_at_ms: Optional[RunAt] = None,
               payload: Any = None, missed: str = "skip",
               catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT, priority: int = 0,
               attempts: Optional[int] = None, backoff: Optional[Backoff] = None
               ) -> Returns[Schedule]:
        """Create or update schedule ``name``; returns it as stored.

        Give exactly one cadence: ``cron`` (a cron expression, evaluated in ``tz``,
        an IANA zone, default UTC) or ``every_ms`` (a fixed gap, start to start; ms or
        a ``timedelta``). ``start_at_ms`` is epoch ms or an aware ``datetime`` (a naive
        one, or an int that looks like epoch seconds, is refused as in ``enqueue_at``).
        Interval slots are ``start_at_ms + k * every_ms``; without ``start_at_ms``
        they are anchored at registration and the first run is one gap later.
        A cron's first run is its first slot at or after ``start_at_ms`` (default:
        after now). A ``start_at_ms`` in the past makes the missed slots due at once
        (``missed`` decides how many run). ``payload``, ``priority``, ``attempts``
        and ``backoff`` are those of every minted job.

        Re-registering the same cadence keeps the schedule's timing and only
        rewrites its options; a different cadence replaces the timing from its next
        slot. Bad input raises a typed :class:`~emqfast.errors.InvalidInput` and
        writes nothing.
        """
        spec = self._prepare(name, cron=cron, tz=tz, every_ms=every_ms,
                             start_at_ms=start_at_ms, payload=payload, missed=missed,
                             catch_up_limit=catch_up_limit, priority=priority,
                             attempts=attempts, backoff=backoff)
        reply = yield Call(_UPSERT, spec.keys, spec.args("keep"))
        return (yield from self._finish(spec, reply))

    @operation
    def upsert_many(self, specs: Iterable[Mapping[str, Any]]) -> Returns[List[Schedule]]:
        """:meth:`upsert` for many schedules (each a dict of its arguments, with ``name``).

        Everything is validated before anything is sent, so one bad spec writes
        nothing. Schedules whose cadence is unchanged (a service boot) are updated
        in a single pipelined round trip; new or changed ones then take the
        two-phase path of :meth:`upsert`.
        """
        prepared = []
        if isinstance(specs, (str, bytes, Mapping)) or not hasattr(specs, "__iter__"):
            raise InvalidInput("upsert_many takes a list of dicts (each upsert's arguments "
                               f"with 'name'), not {type(specs).__name__}")
        now = yield from type(self.queue).server_time_ms.op(self.queue)
        for spec in specs:
            if not isinstance(spec, Mapping) or "name" not in spec:
                raise InvalidInput("every schedule spec is a dict of upsert's arguments "
                                   f"with a 'name' (got {type(spec).__name__})")
            spec = dict(spec)
            try:
                p = self._prepare(spec.pop("name"), **spec)
            except TypeError as exc:  # an argument upsert does not take
                raise InvalidInput(f"schedule spec: {exc} (see Schedules.upsert)") from None
            # a cron that never fires again is refused here, before any write
            # (upsert() finds out in its first phase, which writes nothing either)
            if p.cron is not None and not p.cron.fires_after(max(now, p.start_at_ms or 0)):
                raise InvalidInput(f"{p.name!r}: the cron never fires after now")
            prepared.append(p)
        names = [p.name for p in prepared]
        if len(set(names)) != len(names):
            raise InvalidInput("upsert_many got the same schedule name twice")
        replies = yield Batch([Call(_UPSERT, p.keys, p.args("keep")) for p in prepared])
        out = []
        for p, reply in zip(prepared, replies):
            if isinstance(reply, Exception):
                raise reply
            out.append((yield from self._finish(p, reply)))
        return out

    def _prepare(self, name: str, **upsert: Any) -> UpsertSpec:
        """Validate one upsert (the arguments of :meth:`upsert`) with this queue's limits."""
        return prepare(self._keys, name, self.queue.max_payload_bytes, self.queue._options,
                       **upsert)

    def _finish(self, spec: UpsertSpec, reply: List[Any]) -> Returns[Schedule]:
        """Complete an upsert from its 'keep' reply: plan and 'set' a new or changed cadence
        (again, while racing upserts move the generation under it)."""
        for _ in range(_UPSERT_TRIES):
            seen = UpsertReply.parse(reply)
            if seen.status:
                return spec.stored(reply)
            reply = yield Call(_UPSERT, spec.keys, spec.set_args(seen))
        raise EmqError(f"schedule {spec.name!r}: upsert lost {_UPSERT_TRIES} races in a row")

    # --- inspection -------------------------------------------------------------------
    @operation
    def get(self, name: str) -> Returns[Optional[Schedule]]:
        """Schedule ``name`` (next run, cadence, last minted occurrence...), or None."""
        check_schedule_name(name)
        h, score = yield Batch([Cmd.of("HGETALL", self._keys.schedule(name)),
                                Cmd.of("ZSCORE", self._keys.repeat, name)])
        return Schedule.from_record(name, h, score) if h else None

    @operation
    def list(self) -> Returns[List[Schedule]]:
        """Every schedule, soonest next run first."""
        entries = yield Cmd.of("ZRANGE", self._keys.repeat, 0, -1, "WITHSCORES", withscores=True)
        out: List[Schedule] = []
        for start in range(0, len(entries), 500):
            chunk = entries[start:start + 500]
            rows = yield Batch([Cmd.of("HGETALL", self._keys.schedule(member.decode()))
                                for member, _ in chunk])
            for (member, score), h in zip(chunk, rows):
                if h:
                    out.append(Schedule.from_record(member.decode(), h, score))
        return out

    def __len__(self) -> int:
        if getattr(self.queue, "is_async", False):
            raise TypeError("len() cannot await: use `await queue.schedules.count()`")
        return int(self.count())

    @operation
    def count(self) -> Returns[int]:
        """Number of schedules (``len(schedules)`` in the sync facade)."""
        return int((yield Cmd.of("ZCARD", self._keys.repeat)))

    @operation
    def remove(self, name: str) -> Returns[bool]:
        """Delete schedule ``name``; False if it did not exist. Minted jobs stay."""
        check_schedule_name(name)
        k = self._keys
        return bool((yield Call(_REMOVE, [k.repeat, k.schedule(name), k.meta],
                                [name, KEYSPACE_VERSION])))

    # --- the pump ----------------------------------------------------------------------
    @operation
    def pump(self, limit: int = 100) -> Returns[int]:
        """Mint the jobs of every due occurrence (at most ``limit`` schedules); returns
        how many jobs were created. Safe to run from any number of processes at once."""
        return (yield from Schedules.sweep.op(self, limit)).minted

    @operation
    def sweep(self, limit: int = 100) -> Returns[Sweep]:
        """:meth:`pump`, also reporting the server clock and the next registry instant
        (the Worker uses it to wake for the next run). Due names are read
        :data:`SWEEP_BATCH` at a time and mints sent :data:`MINT_BATCH` calls per round
        trip, so a huge backlog of schedules never makes one long call."""
        check_int(limit, "limit", 1, 100_000)
        k = self._keys
        minted = seen = 0
        now = 0
        for asked in batches(limit, SWEEP_BATCH):
            due = parse_due((yield due_schedules(k, asked)), with_meta=False)
            now = due.now_ms
            seen += len(due.ids)
            if due.ids:
                minted += yield from Schedules._mint_due.op(self, due.ids, now)
            if len(due.ids) < asked:  # nothing more is due
                break
        head = yield Cmd.of("ZRANGE", k.repeat, 0, 0, "WITHSCORES", withscores=True)
        next_run = None
        if head and head[0][1] != float("inf"):
            next_run = int(head[0][1])
        return Sweep(minted, now, next_run, seen >= limit)

    @operation
    def _mint_due(self, names: List[str], now: int) -> Returns[int]:
        """Mint the due occurrences of ``names`` (read their records, then the CAS chains)."""
        k = self._keys
        rows = yield Batch([cmd for name in names for cmd in
                            (Cmd.of("HGETALL", k.schedule(name)),
                             Cmd.of("ZSCORE", k.repeat, name))])
        records, scores = rows[0::2], rows[1::2]  # the two reads per name, interleaved
        calls = []
        for name, record, score in zip(names, records, scores):
            calls += self._mint_calls(name, record, score, now)
        minted = 0
        for start in range(0, len(calls), MINT_BATCH):  # in order: a chain stays in sequence
            minted += yield from Schedules._run_mints.op(self, calls[start:start + MINT_BATCH])
        return minted

    def _mint_calls(self, name: str, h: Dict[bytes, bytes], score: Optional[float],
                    now: int) -> List[Call]:
        """The CAS chain minting ``name``'s due occurrence(s), per its missed policy."""
        return mint_calls(self._keys, name, h, score, now)

    @operation
    def _run_mints(self, calls: List[Call]) -> Returns[int]:
        """Send mint calls in one round trip; how many minted a job."""
        return count_minted((yield Batch(calls)))
