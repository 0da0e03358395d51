"""The only place key names are built.

Every key of a queue has the form ``emq:{<queue>}:<suffix>``: the braces are a
Redis Cluster hash tag, so one queue lives in one slot and every script's keys
are co-located. Scripts never build keys; they receive them all in KEYS.
"""
from __future__ import annotations

import binascii
import functools
import logging
import re
import zlib
from typing import Any, Iterable, List, Optional, Tuple

from emqfast.core.errors import InvalidInput
from emqfast.core.validation import check_queue_name

log = logging.getLogger("emqfast")


class QueueKeys:
    """Key names of one queue. Attributes are ``str`` keys; methods build per-id keys."""

    __slots__ = ("name", "base", "meta", "pending", "delayed", "active", "leases",
                 "completed", "failed", "cancelled", "marker", "counter", "repeat", "events", "metrics",
                 "rate", "groups", "gactive", "glimit", "grate", "waitdeps", "dependents",
                 "outbox", "waiters", "dedupe", "expired", "cancel_channel")

    def __init__(self, name: str):
        self.name = check_queue_name(name)
        self.base = f"emq:{{{name}}}:"
        b = self.base
        # hash: keyspace `version`, `paused`, settings from configure.lua (`events` cap,
        # `rate_max` per `rate_window` ms), `grouped` (the queue ever held grouped jobs),
        # `fturn` (the flat pending set's turn on the group ring)
        self.meta = b + "meta"
        self.pending = b + "pending"      # zset: priority * 2**32 + arrival counter
        self.delayed = b + "delayed"      # zset: (run_at - EPOCH) * 4096 + 12-bit seq
        self.active = b + "active"        # zset: lease deadline (server ms)
        self.leases = b + "leases"        # hash: job id -> lease token
        self.completed = b + "completed"  # zset: finish time (server ms)
        self.failed = b + "failed"        # zset: finish time (server ms)
        self.cancelled = b + "cancelled"  # zset: cancel time (server ms); hashes kept
        self.marker = b + "marker"        # zset: wake marker workers BZPOPMIN on
        self.counter = b + "counter"      # string: INCR arrival counter
        self.repeat = b + "repeat"        # zset: schedule name -> next run (epoch ms, server clock)
        self.events = b + "events"        # stream: job events
        self.metrics = b + "metrics"      # hash: counters and latency histogram buckets
        # zset: lease token -> claim instant (start.lua moves it to the start instant),
        # the claims/starts of the last rate window (meta `rate_max` per `rate_window`)
        self.rate = b + "rate"
        self.groups = b + "groups"        # zset: ring of groups with waiting jobs (score = turn)
        self.gactive = b + "gactive"      # zset (lex): "<group>\0<id>" per active job of a capped group
        self.glimit = b + "glimit"        # hash: group -> concurrency cap
        self.grate = b + "grate"          # hash: group -> "max:window" rate limit
        self.waitdeps = b + "waitdeps"    # zset: jobs waiting for their dependencies -> enqueue ms
        self.dependents = b + "dependents"  # hash: job id -> number of dependent links
        # list: "<outcome>\0<id>" per ended job with dependents, until they are told
        self.outbox = b + "outbox"
        self.waiters = b + "waiters"      # hash: job id -> registered waiters (ref.wait)
        self.dedupe = b + "dedupe"        # hash: dedupe key -> job id
        self.expired = b + "expired"      # zset: kept records of expired jobs -> expiry ms
        self.cancel_channel = b + "cancel"  # pubsub channel: ids of active jobs asked to cancel

    def job(self, job_id: str) -> str:
        """Hash holding one job's payload, options and outcome."""
        return self.base + "job:" + job_id

    def jobs(self, job_ids: Iterable[str]) -> List[str]:
        """:meth:`job` for many ids."""
        b = self.base + "job:"
        return [b + j for j in job_ids]

    def job_deps(self, job_id: str) -> str:
        """Set of a waiting job's remaining dependencies, members ``<queue>\0<id>``."""
        return self.base + "job:" + job_id + ":deps"

    def job_dependents(self, job_id: str) -> str:
        """Set of the jobs that depend on this one, members ``<queue>\0<id>``."""
        return self.base + "job:" + job_id + ":dependents"

    def done_channel(self, job_id: str) -> str:
        """Pub/sub channel told the outcome when the job ends for good (a channel, not a key)."""
        return self.base + "done:" + job_id

    def group_pending(self, group: str) -> str:
        """Lane of one group: its waiting jobs (zset, same scores as ``pending``)."""
        return self.base + "g:" + group + ":pending"

    def group_rate(self, group: str) -> str:
        """One group's rate window: lease token -> claim (then start) instant (zset, last
        window only; the grate hash holds the group's limit)."""
        return self.base + "g:" + group + ":rate"

    def worker_record(self, token: str) -> str:
        """One worker's last heartbeat (hash), PEXPIRE'd a few beats after it."""
        return self.base + "worker:" + token

    @property
    def workers(self) -> str:
        """The queue's workers (zset: token -> last beat, server ms)."""
        return self.base + "workers"

    def worker_claim(self, worker: str) -> str:
        """One worker's last claim (hash: request id, ids, counter), so a claim re-sent after
        its reply was lost returns the same leases instead of popping more; expires with them."""
        return self.base + "w:" + worker + ":claim"

    def schedule(self, name: str) -> str:
        """Hash holding one repeatable schedule's options."""
        return self.base + "repeat:" + name

    def glob(self) -> str:
        """SCAN pattern matching every key of this queue (glob metacharacters escaped)."""
        escaped = "".join("\\" + c if c in "*?[]\\" else c for c in self.base)
        return escaped + "*"


def leaderboard_key(name: str) -> str:
    """Sorted set of one leaderboard: ``emq:{lb:<name>}:board`` (names validated like queues)."""
    return f"emq:{{lb:{check_queue_name(name)}}}:board"


def queue_meta_glob() -> str:
    """SCAN pattern matching every queue's meta hash (how tools discover queues)."""
    return "emq:{*}:meta"


def queue_of_key(key: str) -> str:
    """The queue name inside an ``emq:{queue}:...`` key."""
    start = key.index("{") + 1
    return key[start:key.index("}", start)]


def queue_names_of(meta_keys: Iterable[Any]) -> List[str]:
    """The sorted queue names of ``emq:{queue}:meta`` keys found by a SCAN, the partitions of
    a partitioned queue folded into its logical name (its meta records the layout). A queue whose
    name today's rules refuse (blank, control characters: written by an older version) is
    left out, so discovery (``emqfast stats``, the metrics exporter) still lists the rest."""
    names = set()
    for key in meta_keys:
        name = queue_of_key(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)
        try:
            names.add(check_queue_name(name))
        except InvalidInput:
            log.warning("emqfast: skipping queue %r: its name is no longer valid", name)
    return sorted(n for n in names if logical_of(n) not in names)


_PARTITION = re.compile(r"^(.+)#(\d+)~(\d+)(?:~\d+)?$")


def logical_of(name: str) -> Optional[str]:
    """The logical queue whose partition ``name`` is (see :func:`partition_names`), or
    None for a name no partitioned queue gives its partitions."""
    found = _PARTITION.match(name)
    if found is None:
        return None
    logical, i, p = found.group(1), int(found.group(2)), int(found.group(3))
    if not 1 <= p <= MAX_PARTITIONS or i >= p or "#" in logical:
        return None
    try:
        return logical if partition_names(logical, p)[i] == name else None
    except InvalidInput:
        return None


CLUSTER_SLOTS = 16384
MAX_PARTITIONS = 1024
_SLICES_MOST = 128  # partitions aim at this many slot ranges at most (see partition_names)


def key_slot(tag: str) -> int:
    """The Redis Cluster hash slot of hash tag ``tag`` (CRC16-XMODEM mod 16384)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % CLUSTER_SLOTS


@functools.lru_cache(maxsize=256)
def partition_names(name: str, partitions: int) -> Tuple[str, ...]:
    """The queue names of the ``partitions`` partitions of logical queue ``name``.

    Partition ``i`` is ``<name>#<i>~<P>``, or ``<name>#<i>~<P>~<s>`` with the smallest
    ``s`` that puts its hash tag in the ``i``-th of ``min(P, 128)`` equal ranges of the
    16384 Cluster slots: a Cluster's masters hold contiguous slot ranges, so P partitions
    spread over its masters as evenly as P allows (P = 12 on 3 masters: 4 each), and every
    client derives the same names. The number P is in every name, so two layouts never
    share a key."""
    check_queue_name(name)
    slices = min(partitions, _SLICES_MOST)
    names = []
    for i in range(partitions):
        lo = (i % slices) * CLUSTER_SLOTS // slices
        hi = (i % slices + 1) * CLUSTER_SLOTS // slices
        base = f"{name}#{i}~{partitions}"
        candidate, salt = base, 0
        while not lo <= key_slot(candidate) < hi:
            salt += 1
            candidate = f"{base}~{salt}"
        names.append(check_queue_name(candidate))
    return tuple(names)


def partition_of(key: str, partitions: int) -> int:
    """The partition a placement key (``partition_key``, a group, a dedupe key) goes to:
    CRC32 of its UTF-8 bytes mod ``partitions``, the same in every process and language."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions
