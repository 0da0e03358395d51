"""The only place key names are built.

Every key of a queue has the form ``emq:{<queue>}:<suffix>``: the braces are a
Redis Cluster hash tag, so one queue lives in one slot and every script's keys
are co-located. Scripts never build keys; they receive them all in KEYS.
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, List

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
    """The sorted queue names of ``emq:{queue}:meta`` keys found by a SCAN. A queue whose
    name today's rules refuse (blank, control characters: written by an older version) is
    left out, so discovery (``emqfast stats``, the metrics exporter) still lists the rest."""
    names = set()
    for key in meta_keys:
        name = queue_of_key(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)
        try:
            names.add(check_queue_name(name))
        except InvalidInput:
            log.warning("emqfast: skipping queue %r: its name is no longer valid", name)
    return sorted(names)
