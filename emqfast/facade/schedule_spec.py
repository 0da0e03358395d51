"""One schedule as stored and as registered: the :class:`Schedule` record, the job ids of
its occurrences, and the validation and planning of an upsert (schedule_upsert.lua's
arguments and reply). Sans-IO; :mod:`emqfast.facade.schedules` sends the calls."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional

from emqfast.core import codec
from emqfast.core.cadence import Cadence, Cron, Interval
from emqfast.core.errors import InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.scores import MAX_OFFSET_MS, MAX_RUN_AT_MS
from emqfast.core.times import Delay, RunAt, delay_ms as check_delay, run_at_ms as check_run_at
from emqfast.core.validation import check_int, check_schedule_name
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import options
from emqfast.facade.options import Backoff

MISSED_POLICIES = ("skip", "catch_up")
DEFAULT_CATCH_UP_LIMIT = 100
MAX_CATCH_UP_LIMIT = 10_000


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
        """The :mod:`emqfast.core.cadence` object computing this schedule's slots."""
        if self.cron is not None:
            return Cron(self.cron, self.tz or "UTC")
        assert self.every_ms is not None and self.anchor_ms is not None
        return Interval(self.every_ms, self.anchor_ms)


class UpsertReply(NamedTuple):
    """schedule_upsert.lua's reply (None where the script says "none")."""

    status: int                # 2 cadence set, 1 options updated, 0 nothing written
    next_run_ms: Optional[int]
    generation: Optional[int]
    last_ms: Optional[int]     # the last minted occurrence
    now_ms: int
    anchor: bytes              # as stored ('' none)
    last_job: bytes            # as stored ('' none)

    @classmethod
    def parse(cls, reply: List[Any]) -> "UpsertReply":
        status, next_run, gen, last, now, anchor, last_job = reply[:7]
        return cls(int(status), _num(next_run), _num(gen), _num(last), int(now),
                   _bytes(anchor), _bytes(last_job))


@dataclass
class UpsertSpec:
    """One validated upsert, ready for schedule_upsert.lua."""

    name: str
    keys: List[str]
    sig: str             # cadence signature: equal = same timing
    fields: List[Any]    # the record's option field, value pairs
    cron: Optional[Cron]
    every_ms: Optional[int]
    start_at_ms: Optional[int]

    def args(self, mode: str, gen: str = "", next_run: Any = "", anchor: Any = "") -> List[Any]:
        """schedule_upsert.lua's ARGV for ``mode`` 'keep' or 'set'."""
        return [self.name, self.sig, mode, gen, next_run, anchor, KEYSPACE_VERSION, *self.fields]

    def set_args(self, seen: UpsertReply) -> List[Any]:
        """The 'set' call's ARGV for a new or changed cadence, planned from what the 'keep'
        (or a raced 'set') reply ``seen`` says: its first run after the server's now and
        after the last minted occurrence (never re-run one)."""
        anchor = self.start_at_ms if self.start_at_ms is not None else seen.now_ms
        cadence: Cadence = self.cron or Interval(int(self.every_ms or 0), anchor)
        lower = self.start_at_ms if self.start_at_ms is not None else seen.now_ms + 1
        if seen.last_ms is not None:
            lower = max(lower, seen.last_ms + 1)
        first = cadence.next_after(lower - 1)
        if first is None:
            raise InvalidInput(f"{self.name!r}: the cron never fires after {lower} (epoch ms)")
        check_int(first, "next run", 0, MAX_RUN_AT_MS)
        gen = "" if seen.generation is None else str(seen.generation)
        return self.args("set", gen, first, "" if self.cron else anchor)

    def stored(self, reply: List[Any]) -> Schedule:
        """The Schedule as written: our option fields plus what the script echoed."""
        seen = UpsertReply.parse(reply)
        h = {str(f).encode(): _bytes(v) for f, v in zip(self.fields[::2], self.fields[1::2])}
        h[b"gen"] = str(seen.generation or 0).encode()
        if seen.last_ms is not None:
            h[b"last"] = str(seen.last_ms).encode()
        h[b"anchor"], h[b"last_job"] = seen.anchor, seen.last_job
        next_run = None if seen.next_run_ms is None else float(seen.next_run_ms)
        return Schedule.from_record(self.name, h, next_run)


JobOptions = Callable[[int, Optional[int], Optional[Backoff]], bytes]


def prepare(k: QueueKeys, name: str, max_payload_bytes: int, job_options: JobOptions, *,
            cron: Optional[str] = None, tz: Optional[str] = None,
            every_ms: Optional[Delay] = None, start_at_ms: Optional[RunAt] = None,
            payload: Any = None, missed: str = "skip",
            catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT, priority: int = 0,
            attempts: Optional[int] = None, backoff: Optional[Backoff] = None) -> UpsertSpec:
    """Validate one upsert completely (nothing is sent) and encode its record;
    ``job_options(priority, attempts, backoff)`` encodes the minted jobs' options (the
    queue's, with its defaults). ``every_ms`` may be a timedelta and ``start_at_ms`` an
    aware datetime (both become ms ints here)."""
    check_schedule_name(name)
    if (cron is None) == (every_ms is None):
        raise InvalidInput("give exactly one of cron= or every_ms=")
    start: Optional[int] = None if start_at_ms is None else \
        check_run_at(start_at_ms, "start_at_ms", MAX_RUN_AT_MS)
    cron_cadence: Optional[Cron] = None
    every: Optional[int] = None
    if cron is not None:
        cron_cadence = Cron(cron, "UTC" if tz is None else tz)  # validates both
        kind, cron_text, tz_text, every_text = "cron", cron_cadence.expr, cron_cadence.tz, ""
    else:
        if tz is not None:
            raise InvalidInput("tz applies to cron schedules only")
        every = check_delay(every_ms, "every_ms", 1, MAX_OFFSET_MS)
        kind, cron_text, tz_text, every_text = "every", "", "", str(every)
    if missed not in MISSED_POLICIES:
        raise InvalidInput(f"missed must be one of {MISSED_POLICIES}, not {missed!r}")
    check_int(catch_up_limit, "catch_up_limit", 1, MAX_CATCH_UP_LIMIT)
    data, enc = codec.encode(payload, max_payload_bytes)
    opts = job_options(priority, attempts, backoff)
    start_text = "-" if start is None else str(start)
    # Equal signature = same timing: a boot re-registering it keeps the schedule as is.
    sig = "|".join((kind, cron_text, tz_text, every_text, start_text))
    fields = ["name", name, "kind", kind, "cron", cron_text, "tz", tz_text,
              "every", every_text, "start", start_text, "missed", missed,
              "limit", str(catch_up_limit), "payload", data, "enc", enc, "opts", opts,
              "prio", str(priority)]
    return UpsertSpec(name, [k.repeat, k.schedule(name), k.meta, k.marker, k.counter], sig,
                      fields, cron_cadence, every, start)


def _num(v: Any) -> Optional[int]:
    v = v.decode() if isinstance(v, bytes) else v
    return None if v in ("", None) or int(v) < 0 else int(v)


def _bytes(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()
