"""What an enqueue sends: validated job options and run time, the enqueue.lua /
enqueue_group.lua call of one job, and the columnar framing of a bulk of them.

Sans-IO helpers of :class:`~emqfast.Queue`'s enqueue paths (and the schedules, which
encode their jobs' options the same way); nothing here sends anything.
"""
from __future__ import annotations

from typing import AbstractSet, Any, List, NamedTuple, Optional, Sequence, Tuple

from emqfast.backends.scripts import load
from emqfast.core.errors import InvalidInput, NotReplicated
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call, Columns, Slot
from emqfast.core.scores import MAX_OFFSET_MS, MAX_RUN_AT_MS, PRIORITY_MAX
from emqfast.core.times import Delay, RunAt, delay_ms as check_delay, run_at_ms as check_run_at
from emqfast.core.validation import check_group_name, check_int
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import dedupe, options
from emqfast.facade.options import Backoff
from emqfast.facade.job import JobRef

ENQUEUE = load("enqueue")
ENQUEUE_GROUP = load("enqueue_group")

MAX_ATTEMPTS = 1_000_000
# enqueue.lua's reply -> JobRef.status (0 = the id already existed; 3 and 4 name the job
# holding the dedupe key: facade/dedupe.py)
ADMITTED = {1: "pending", 2: "scheduled"}
STATUS = {**ADMITTED, 0: "duplicate", **dedupe.STATUSES}

Wait = Optional[Tuple[int, int]]  # (replicas, timeout_ms) for WAIT after the writes, or None


class When(NamedTuple):
    """When a job becomes pending, as enqueue.lua takes it (ARGV mode and value)."""

    mode: bytes   # b"now", b"at" (value = run-at, epoch ms) or b"in" (value = delay ms)
    value: int    # 0 for b"now"


NOW = When(b"now", 0)  # due at once (the default)


def when(delay_ms: Optional[Delay], run_at_ms: Optional[RunAt]) -> When:
    """Validate ``delay_ms`` (ms or timedelta) / ``run_at_ms`` (epoch ms or aware
    datetime; seconds-looking ints refused), at most one of them."""
    if delay_ms is not None and run_at_ms is not None:
        raise InvalidInput("give delay_ms or run_at_ms, not both")
    if run_at_ms is not None:
        return When(b"at", check_run_at(run_at_ms, "run_at_ms", MAX_RUN_AT_MS))
    if delay_ms is not None:
        return When(b"in", check_delay(delay_ms, "delay_ms", 0, MAX_OFFSET_MS))
    return NOW


def check_backoff(backoff: Any) -> Backoff:
    """``backoff`` itself, when it is an :class:`~emqfast.Backoff`."""
    if not isinstance(backoff, Backoff):
        raise InvalidInput("backoff must be an emqfast.Backoff")
    return backoff


def job_options(priority: int, attempts: Optional[int], backoff: Optional[Backoff],
                group: Optional[str], *, default_attempts: int,
                default_backoff: Backoff) -> bytes:
    """A job's encoded options (b"" for the library defaults: the scripts then store no
    ``opts`` field); the queue's defaults stand in for ``attempts`` / ``backoff`` not given."""
    check_int(priority, "priority", 0, PRIORITY_MAX)
    extra = {} if group is None else {"g": check_group_name(group)}  # the worker reads it
    attempts = default_attempts if attempts is None else \
        check_int(attempts, "attempts", 1, MAX_ATTEMPTS)
    backoff = default_backoff if backoff is None else check_backoff(backoff)
    return options.encode(attempts, priority, backoff, extra)


def fixed_keys(k: QueueKeys) -> List[str]:
    """enqueue.lua's KEYS[2..7]: the queue keys every enqueue declares after the job hash."""
    return [k.pending, k.delayed, k.marker, k.meta, k.counter, k.events]


class Job(NamedTuple):
    """One job as an enqueue call carries it."""

    id: str
    data: bytes
    enc: Any      # the payload encoding (codec.encode's second value)


class Shared(NamedTuple):
    """What every job of one enqueue shares (all validated)."""

    opts: bytes
    priority: int
    when: When
    group: Optional[str]
    extras: Optional[dedupe.Extras] = None  # expiry / dedupe options, if any


def enqueue_call(k: QueueKeys, job: Job, shared: Shared, check_acl: bool = True,
                 key: Optional[str] = None, holder: Optional[str] = None) -> Call:
    """The call admitting ``job``: enqueue.lua, or enqueue_group.lua into its group's lane.
    ``check_acl=False`` skips the script's ACL check (see
    :func:`emqfast.facade.enqueue_batch.sends`). With a dedupe ``key``, ``holder`` is the
    job the caller read in the dedupe hash for it (None: no entry)."""
    acl = 1 if check_acl else 0
    head = [job.id, job.data, job.enc, shared.opts, shared.priority, shared.when.mode,
            shared.when.value, KEYSPACE_VERSION]
    more_keys, more = dedupe.extra_keys_args(k, job.id, shared.extras, key, holder)
    if shared.group is None:
        return Call(ENQUEUE, [k.job(job.id), *fixed_keys(k), *more_keys], [*head, acl, *more])
    return Call(ENQUEUE_GROUP, [k.job(job.id), k.group_pending(shared.group), k.delayed,
                                k.marker, k.meta, k.counter, k.events, k.groups, *more_keys],
                [*head, shared.group, acl, *more])


# --- a bulk of enqueue.lua calls, framed as columns ------------------------------------------
# Only the job key, id, payload and (when they differ) encoding change between the jobs of
# one bulk: they travel as columns, every other argument once (the C Batcher frames and
# streams each call from these). The columns of an enqueue bulk:
ID_COLUMN = 0        # job ids (KEYS[1] is the job hash prefix + id, ARGV[1] the id)
PAYLOAD_COLUMN = 1   # encoded payloads (ARGV[2])
ENCODING_COLUMN = 2  # payload encodings (ARGV[3]), only when the jobs' encodings differ


def enqueue_columns(k: QueueKeys, jobs: Sequence[Job], shared: Shared, check_acl: bool,
                    wait: Wait) -> Columns:
    """enqueue.lua for every job of ``jobs`` (ungrouped) as one columnar bulk."""
    key_slots = [Slot(k.job(""), ID_COLUMN), *(Slot(key) for key in fixed_keys(k))]
    columns: List[List[Any]] = [[job.id.encode() for job in jobs], [job.data for job in jobs]]
    encodings = {job.enc for job in jobs}
    if len(encodings) == 1:
        encoding = Slot(encodings.pop())
    else:
        encoding = Slot(b"", ENCODING_COLUMN)
        columns.append([job.enc for job in jobs])
    arg_slots = [Slot(b"", ID_COLUMN), Slot(b"", PAYLOAD_COLUMN), encoding,
                 *(Slot(value) for value in _shared_args(shared, check_acl))]
    return Columns(ENQUEUE, len(key_slots), key_slots + arg_slots, columns, wait=wait)


def _shared_args(shared: Shared, check_acl: bool) -> List[bytes]:
    """enqueue.lua's ARGV[4..9], the same for every job of a bulk."""
    return [shared.opts, str(shared.priority).encode(), shared.when.mode,
            str(shared.when.value).encode(), KEYSPACE_VERSION.encode(),
            b"1" if check_acl else b"0"]


def check_replicated(landed: List[JobRef], acked: Optional[int], wait: Wait) -> None:
    """Raise NotReplicated when WAIT saw fewer replicas than ``wait`` asked for."""
    if wait is None:
        return
    replicas, timeout_ms = wait
    if (acked or 0) < replicas:
        raise NotReplicated(
            f"{len(landed)} job(s) written to the master but acknowledged by "
            f"{acked or 0} of {replicas} replica(s) within {timeout_ms} ms: "
            "they are lost if the master fails before replicating them",
            landed, acked or 0, replicas)


def status_of(reply: Any, recovering: AbstractSet[str], job_id: str) -> str:
    """A landed job's JobRef status; a re-sent id of unknown fate found existing is
    ``"recovered"`` (the first send wrote it), not ``"duplicate"``."""
    status = STATUS.get(reply, "duplicate")
    return "recovered" if status == "duplicate" and job_id in recovering else status
