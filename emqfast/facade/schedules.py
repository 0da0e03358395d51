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
  day (at the first 02:30). See :mod:`emqfast.cadence`.
- **Server clock.** "Now" is Redis ``TIME`` read inside the scripts.
- **Wake marker.** Each mint sets the queue's wake marker to the next run, so a
  blocked worker wakes then rather than on a polling tick.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from emqfast.core import codec
from emqfast.facade import options
from emqfast.core.scores import MAX_OFFSET_MS, MAX_RUN_AT_MS
from emqfast.facade.backoff import Backoff
from emqfast.core.cadence import Cadence, Cron, Interval, plan
from emqfast.core.errors import EmqError, InvalidInput, VersionMismatch
from emqfast.core.validation import check_schedule_name
from emqfast.core.ops import Batch, Call, Cmd, Op, operation
from emqfast.facade.queue import Queue
from emqfast.core.batching import batches
from emqfast.core.validation import check_int
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION

log = logging.getLogger("emqfast.schedules")

_UPSERT = load("schedule_upsert")
_MINT = load("schedule_mint")
_REMOVE = load("schedule_remove")
_DUE = load("due")

MISSED_POLICIES = ("skip", "catch_up")
DEFAULT_CATCH_UP_LIMIT = 100
MAX_CATCH_UP_LIMIT = 10_000
_UPSERT_TRIES = 8
SWEEP_BATCH = 1000  # due schedule names read per due.lua call (it refuses more than 4,000)
MINT_BATCH = 1000   # schedule_mint.lua calls per pipelined round trip


def occurrence_job_id(name: str, occurrence_ms: int) -> str:
    """The job id of schedule ``name``'s occurrence at ``occurrence_ms`` (epoch ms).

    ``"JOB"`` + 12 hex digits of the occurrence instant + ``"R"`` + 16 hex digits
    of BLAKE2b(name): ids carry the ``JOB`` brand, sort by occurrence time, and
    are the same in every process, which is what makes minting idempotent.
    """
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).hexdigest().upper()
    return f"JOB{occurrence_ms:012X}R{digest}"


def occurrence_of(job_id: str) -> Optional[int]:
    """The occurrence instant (epoch ms) of a job minted by a schedule, else None."""
    if len(job_id) != 32 or not job_id.startswith("JOB") or job_id[15] != "R":
        return None
    try:
        return int(job_id[3:15], 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class Schedule:
    """One schedule as stored (instants are epoch ms on the Redis server clock)."""

    name: str
    cron: Optional[str]
    tz: Optional[str]
    every_ms: Optional[int]
    start_at_ms: Optional[int]
    anchor_ms: Optional[int]        # interval slots are anchor + k * every_ms
    next_run_ms: Optional[int]      # the registry score; None once a cron is exhausted
    last_occurrence_ms: Optional[int]
    last_job_id: Optional[str]
    missed: str
    catch_up_limit: int
    payload: Any
    priority: int
    attempts: int
    backoff: Optional[Backoff]
    generation: int                 # bumped on every cadence change

    @property
    def cadence(self) -> str:
        """Human-readable cadence, e.g. ``cron '0 9 * * 1' Europe/Paris`` or ``every 900000 ms``."""
        if self.cron is not None:
            return f"cron {self.cron!r} {self.tz}"
        return f"every {self.every_ms} ms"

    @classmethod
    def from_record(cls, name: str, h: Dict[bytes, bytes], score: Optional[float]) -> "Schedule":
        """Build from the record's HGETALL and the registry score."""
        def text(field: str) -> str:
            return h.get(field.encode(), b"").decode("utf-8")

        def opt_int(field: str) -> Optional[int]:
            raw = text(field)
            return int(raw) if raw not in ("", "-") else None

        opts = options.decode(h.get(b"opts"))  # empty: the library defaults
        is_cron = text("kind") == "cron"
        next_run = None if score is None or score == float("inf") else int(score)
        return cls(
            name=name, cron=text("cron") if is_cron else None, tz=text("tz") if is_cron else None,
            every_ms=None if is_cron else opt_int("every"), start_at_ms=opt_int("start"),
            anchor_ms=opt_int("anchor"), next_run_ms=next_run,
            last_occurrence_ms=opt_int("last"), last_job_id=text("last_job") or None,
            missed=text("missed") or "skip",
            catch_up_limit=opt_int("limit") or DEFAULT_CATCH_UP_LIMIT,
            payload=codec.decode(h.get(b"payload"), h.get(b"enc")),
            priority=opts.priority, attempts=opts.max_attempts, backoff=opts.backoff,
            generation=opt_int("gen") or 0,
        )

    def cadence_obj(self) -> Cadence:
        """The :mod:`emqfast.cadence` object computing this schedule's slots."""
        if self.cron is not None:
            return Cron(self.cron, self.tz or "UTC")
        assert self.every_ms is not None and self.anchor_ms is not None
        return Interval(self.every_ms, self.anchor_ms)


@dataclass(frozen=True)
class Sweep:
    """What one pump pass did, for callers that schedule their own next pass."""

    minted: int                   # jobs created
    now_ms: int                   # server clock when the pass read the registry
    next_run_ms: Optional[int]    # earliest registry entry afterwards (None: no schedules)
    more: bool                    # more schedules were due than ``limit``


@dataclass
class _Spec:
    """One validated upsert, ready for schedule_upsert.lua."""

    name: str
    keys: List[str]
    sig: str
    fields: List[Any]
    cron: Optional[Cron]
    every_ms: Optional[int]
    start_at_ms: Optional[int]

    def args(self, mode: str, gen: str = "", next_run: Any = "", anchor: Any = "") -> List[Any]:
        return [self.name, self.sig, mode, gen, next_run, anchor, KEYSPACE_VERSION, *self.fields]


class Schedules:
    """The repeatable schedules of one queue (``queue.schedules``)."""

    def __init__(self, queue: "Queue"):
        self.queue = queue
        self._keys = queue.keys

    def _drive(self, op: Op) -> Any:
        # the queue's driver: blocking for emqfast.Queue, a coroutine for emqfast.aio.Queue
        return self.queue._drive(op)

    # --- registration --------------------------------------------------------------
    @operation
    def upsert(self, name: str, *, cron: Optional[str] = None, tz: Optional[str] = None,
               every_ms: Optional[int] = None, start_at_ms: Optional[int] = None,
               payload: Any = None, missed: str = "skip",
               catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT, priority: int = 0,
               attempts: Optional[int] = None, backoff: Optional[Backoff] = None) -> Schedule:
        """Create or update schedule ``name``; returns it as stored.

        Give exactly one cadence: ``cron`` (a cron expression, evaluated in ``tz``,
        an IANA zone, default UTC) or ``every_ms`` (a fixed gap, start to start).
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
    def upsert_many(self, specs: Iterable[Mapping[str, Any]]) -> List[Schedule]:
        """:meth:`upsert` for many schedules (each a dict of its arguments, with ``name``).

        Everything is validated before anything is sent, so one bad spec writes
        nothing. Schedules whose cadence is unchanged (a service boot) are updated
        in a single pipelined round trip; new or changed ones then take the
        two-phase path of :meth:`upsert`.
        """
        prepared = []
        now = yield from Queue.server_time_ms.op(self.queue)
        for spec in specs:
            spec = dict(spec)
            if "name" not in spec:
                raise InvalidInput("every schedule spec needs a name")
            p = self._prepare(spec.pop("name"), **spec)
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

    def _prepare(self, name: str, *, cron: Optional[str] = None, tz: Optional[str] = None,
                 every_ms: Optional[int] = None, start_at_ms: Optional[int] = None,
                 payload: Any = None, missed: str = "skip",
                 catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT, priority: int = 0,
                 attempts: Optional[int] = None, backoff: Optional[Backoff] = None) -> "_Spec":
        """Validate one upsert completely (nothing is sent) and encode its record."""
        check_schedule_name(name)
        if (cron is None) == (every_ms is None):
            raise InvalidInput("give exactly one of cron= or every_ms=")
        if start_at_ms is not None:
            check_int(start_at_ms, "start_at_ms", 0, MAX_RUN_AT_MS)
        cron_cadence: Optional[Cron] = None
        if cron is not None:
            cron_cadence = Cron(cron, "UTC" if tz is None else tz)  # validates both
            kind, cron_text, tz_text, every_text = "cron", cron_cadence.expr, cron_cadence.tz, ""
        else:
            if tz is not None:
                raise InvalidInput("tz applies to cron schedules only")
            check_int(every_ms, "every_ms", 1, MAX_OFFSET_MS)
            kind, cron_text, tz_text, every_text = "every", "", "", str(every_ms)
        if missed not in MISSED_POLICIES:
            raise InvalidInput(f"missed must be one of {MISSED_POLICIES}, not {missed!r}")
        check_int(catch_up_limit, "catch_up_limit", 1, MAX_CATCH_UP_LIMIT)
        data, enc = codec.encode(payload, self.queue.max_payload_bytes)
        opts = self.queue._options(priority, attempts, backoff)
        start_text = "-" if start_at_ms is None else str(start_at_ms)
        # Equal signature = same timing: a boot re-registering it keeps the schedule as is.
        sig = "|".join((kind, cron_text, tz_text, every_text, start_text))
        fields = ["name", name, "kind", kind, "cron", cron_text, "tz", tz_text,
                  "every", every_text, "start", start_text, "missed", missed,
                  "limit", str(catch_up_limit), "payload", data, "enc", enc, "opts", opts,
                  "prio", str(priority)]
        k = self._keys
        return _Spec(name, [k.repeat, k.schedule(name), k.meta, k.marker, k.counter], sig,
                     fields, cron_cadence, every_ms, start_at_ms)

    def _finish(self, spec: "_Spec", reply: List[Any]) -> Op:
        """Complete an upsert from its 'keep' reply: plan and 'set' a new or changed cadence."""
        for _ in range(_UPSERT_TRIES):
            status, _, gen, last, now = _parse_upsert(reply)
            if status:
                return self._stored(spec.name, spec.fields, reply)
            # New or changed cadence: plan its first run from the server clock.
            anchor = spec.start_at_ms if spec.start_at_ms is not None else now
            cadence: Cadence = spec.cron or Interval(int(spec.every_ms or 0), anchor)
            lower = spec.start_at_ms if spec.start_at_ms is not None else now + 1
            if last is not None:
                lower = max(lower, last + 1)  # never re-run an occurrence already minted
            first = cadence.next_after(lower - 1)
            if first is None:
                raise InvalidInput(f"{spec.name!r}: the cron never fires after {lower} (epoch ms)")
            check_int(first, "next run", 0, MAX_RUN_AT_MS)
            reply = yield Call(_UPSERT, spec.keys,
                               spec.args("set", "" if gen is None else str(gen), first,
                                         "" if spec.cron else anchor))
        raise EmqError(f"schedule {spec.name!r}: upsert lost {_UPSERT_TRIES} races in a row")

    @staticmethod
    def _stored(name: str, fields: List[Any], reply: List[Any]) -> Schedule:
        """The Schedule as written: our option fields plus what the script echoed."""
        _, next_run, gen, last, _ = _parse_upsert(reply)
        h = {str(f).encode(): v if isinstance(v, bytes) else str(v).encode()
             for f, v in zip(fields[::2], fields[1::2])}
        h[b"gen"] = str(gen or 0).encode()
        if last is not None:
            h[b"last"] = str(last).encode()
        h[b"anchor"], h[b"last_job"] = _bytes(reply[5]), _bytes(reply[6])
        return Schedule.from_record(name, h, None if next_run is None else float(next_run))

    # --- inspection -------------------------------------------------------------------
    @operation
    def get(self, name: str) -> Optional[Schedule]:
        """Schedule ``name`` (next run, cadence, last minted occurrence...), or None."""
        check_schedule_name(name)
        h, score = yield Batch([Cmd.of("HGETALL", self._keys.schedule(name)),
                                Cmd.of("ZSCORE", self._keys.repeat, name)])
        return Schedule.from_record(name, h, score) if h else None

    @operation
    def list(self) -> List[Schedule]:
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
    def count(self) -> int:
        """Number of schedules (``len(schedules)`` in the sync facade)."""
        return int((yield Cmd.of("ZCARD", self._keys.repeat)))

    @operation
    def remove(self, name: str) -> bool:
        """Delete schedule ``name``; False if it did not exist. Minted jobs stay."""
        check_schedule_name(name)
        k = self._keys
        return bool((yield Call(_REMOVE, [k.repeat, k.schedule(name), k.meta],
                                [name, KEYSPACE_VERSION])))

    # --- the pump ----------------------------------------------------------------------
    @operation
    def pump(self, limit: int = 100) -> int:
        """Mint the jobs of every due occurrence (at most ``limit`` schedules); returns
        how many jobs were created. Safe to run from any number of processes at once."""
        return (yield from Schedules.sweep.op(self, limit)).minted

    @operation
    def sweep(self, limit: int = 100) -> Sweep:
        """:meth:`pump`, also reporting the server clock and the next registry instant
        (the Worker uses it to wake for the next run). Due names are read
        :data:`SWEEP_BATCH` at a time and mints sent :data:`MINT_BATCH` calls per round
        trip, so a huge backlog of schedules never makes one long call (issue 11)."""
        check_int(limit, "limit", 1, 100_000)
        k = self._keys
        minted = seen = 0
        now = 0
        for asked in batches(limit, SWEEP_BATCH):
            reply = yield Call(_DUE, [k.repeat], [asked, 0])
            now = int(reply[0])
            names = [n.decode() for n in reply[1:]]
            seen += len(names)
            if names:
                minted += yield from Schedules._mint_due.op(self, names, now)
            if len(names) < asked:  # nothing more is due
                break
        head = yield Cmd.of("ZRANGE", k.repeat, 0, 0, "WITHSCORES", withscores=True)
        next_run = None
        if head and head[0][1] != float("inf"):
            next_run = int(head[0][1])
        return Sweep(minted, now, next_run, seen >= limit)

    @operation
    def _mint_due(self, names: List[str], now: int) -> int:
        """Mint the due occurrences of ``names`` (read their records, then the CAS chains)."""
        k = self._keys
        rows = yield Batch([cmd for name in names for cmd in
                            (Cmd.of("HGETALL", k.schedule(name)),
                             Cmd.of("ZSCORE", k.repeat, name))])
        calls = []
        for i, name in enumerate(names):
            calls += self._mint_calls(name, rows[2 * i], rows[2 * i + 1], now)
        minted = 0
        for start in range(0, len(calls), MINT_BATCH):  # in order: a chain stays in sequence
            minted += yield from Schedules._run_mints.op(self, calls[start:start + MINT_BATCH])
        return minted

    def _mint_calls(self, name: str, h: Dict[bytes, bytes], score: Optional[float],
                    now: int) -> List[Call]:
        """The CAS chain minting ``name``'s due occurrence(s), per its missed policy."""
        if not h or score is None or score == float("inf"):
            if not h:
                log.warning("emqfast: schedule %r has a registry entry but no record", name)
            return []
        try:
            sched = Schedule.from_record(name, h, score)
            steps = plan(sched.cadence_obj(), int(score), now, sched.missed, sched.catch_up_limit)
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            # one damaged record must not stop the pump (or the worker beat) for the rest
            log.error("emqfast: schedule %r cannot be planned: %s", name, exc)
            return []
        k = self._keys
        gen = h.get(b"gen", b"").decode()
        calls = []
        for expected, occ, nxt in steps:
            job_id = occurrence_job_id(name, occ)
            calls.append(Call(_MINT, [k.repeat, k.schedule(name), k.job(job_id), k.pending,
                                      k.delayed, k.marker, k.meta, k.counter, k.events],
                              [name, expected, gen, occ, -1 if nxt is None else nxt, job_id,
                               KEYSPACE_VERSION]))
        return calls

    @operation
    def _run_mints(self, calls: List[Call]) -> int:
        minted = 0
        for reply in (yield Batch(calls)):
            if isinstance(reply, VersionMismatch):
                raise reply
            if isinstance(reply, Exception):
                log.error("emqfast: minting a schedule occurrence failed: %s", reply)
            elif reply == 1:
                minted += 1
        return minted


def _bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def _parse_upsert(reply: List[Any]) -> Tuple[int, Optional[int], Optional[int], Optional[int], int]:
    """``(status, next_run, generation, last, now)`` from schedule_upsert.lua (None = absent)."""
    def num(v: Any) -> Optional[int]:
        v = v.decode() if isinstance(v, bytes) else v
        return None if v in ("", None) or int(v) < 0 else int(v)
    status, next_run, gen, last, now = reply[:5]
    return int(status), num(next_run), num(gen), num(last), int(now)
