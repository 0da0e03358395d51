"""Per-queue metrics kept in Redis, exported in Prometheus text format.

The queue's metrics hash (``emq:{q}:metrics``) holds ``completed`` / ``failed`` /
``retried`` / ``stalled`` / ``expired`` counters, which the Lua moves count exactly, and two latency
histograms, ``wait`` (due -> started) and ``run`` (started -> finished), as
per-bucket counts ``<name>:le:<bound ms>`` plus ``<name>:sum`` (ms). complete.lua and
fail.lua only return each run's times: Workers bucket an ack batch with
:class:`Observations` and add it in one ``metrics_add.lua`` call (bucketing per job in
Lua cost ~40% of Redis CPU on the drain path), so scripts called directly record no
histograms. Because
the numbers live in Redis, any process sees the cluster-wide totals: the
:class:`Collector` reads them at scrape time (``prometheus_client`` custom
collector), and ``emqfast metrics`` prints or serves them.

A process Worker's handler processes are counted by the Worker itself and said in its
heartbeat record (:mod:`emqfast.facade.workers`): the collector exports each live
process Worker's child restarts, crashes, kills by reason and recycles by reason as
counters (they start at 0 with the Worker, as a process's own counters do), and its
children and their resident memory as gauges.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from functools import partial
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from emqfast.core.keys import QueueKeys, partition_names, queue_meta_glob, queue_names_of
from emqfast.core.ops import Batch, Cmd, Op
from emqfast.backends.drive import run
from emqfast.facade.workers import WorkerInfo, live_workers_op

# Upper bounds (ms) of the histogram buckets (non-cumulative fields in Redis).
BUCKETS_MS: Tuple[int, ...] = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000,
                               60000, 300000, 1800000)
COUNTERS = ("completed", "failed", "retried", "stalled", "expired")
HISTOGRAMS = ("wait", "run")
STATES = ("scheduled", "pending", "active", "completed", "failed")
# A process Worker's child events (heartbeat ``child_events`` names) by family and label
KILLS = {"timeout": "kill:timeout", "cancel": "kill:cancel", "shutdown": "kill:shutdown"}
RECYCLES = {"jobs": "recycled:jobs", "memory": "recycled:memory"}


def bucket_field(name: str, ms: int) -> str:
    """The metrics-hash field counting an observation of ``ms`` in histogram ``name``:
    ``<name>:le:<first bound >= ms>``, or ``<name>:le:+Inf`` above the last bound."""
    i = bisect_left(BUCKETS_MS, ms)
    return f"{name}:le:{BUCKETS_MS[i] if i < len(BUCKETS_MS) else '+Inf'}"


class Observations:
    """Histogram observations of one ack batch, summed as the metrics hash keeps them,
    so a whole batch is written with one ``metrics_add.lua`` call."""

    def __init__(self) -> None:
        self.fields: Dict[str, int] = {}

    def observe(self, name: str, ms: int) -> None:
        """Count ``ms`` into histogram ``name`` ("wait" or "run"); a negative time means
        "not known" (the script could not time the run) and is skipped."""
        self.observe_many(name, (ms,))

    def observe_many(self, name: str, times: Iterable[int]) -> None:
        """:meth:`observe` each of ``times`` (one pass: this runs per ack batch on the
        drain path, so it avoids per-job formatting)."""
        known = [ms for ms in times if ms >= 0]
        if not known:
            return
        f = self.fields
        for i, n in Counter(map(partial(bisect_left, BUCKETS_MS), known)).items():
            key = f"{name}:le:{BUCKETS_MS[i] if i < len(BUCKETS_MS) else '+Inf'}"
            f[key] = f.get(key, 0) + n
        f[name + ":sum"] = f.get(name + ":sum", 0) + sum(known)

    def __bool__(self) -> bool:
        return bool(self.fields)

    def pairs(self) -> List[Any]:
        """``[field, increment, ...]`` for metrics_add.lua."""
        return [x for item in self.fields.items() for x in item]


@dataclass
class Histogram:
    """One latency histogram: cumulative ``(bound ms, count)`` pairs (last bound ``inf``)."""

    buckets: List[Tuple[float, int]]
    sum_ms: int

    @property
    def count(self) -> int:
        """Observations in total."""
        return self.buckets[-1][1]


@dataclass
class QueueMetrics:
    """A snapshot of one queue's counters, histograms and current state sizes."""

    queue: str
    counters: Dict[str, int]
    wait: Histogram
    run: Histogram
    states: Dict[str, int] = field(default_factory=dict)


def _histogram(fields: Dict[str, int], name: str) -> Histogram:
    running, out = 0, []
    for bound in BUCKETS_MS:
        running += fields.get(f"{name}:le:{bound}", 0)
        out.append((float(bound), running))
    running += fields.get(f"{name}:le:+Inf", 0)
    out.append((float("inf"), running))
    return Histogram(out, fields.get(f"{name}:sum", 0))


def parse(queue: str, raw: Dict[Any, Any], sizes: Sequence[int] = ()) -> QueueMetrics:
    """A :class:`QueueMetrics` from the metrics hash (HGETALL) and the state sizes."""
    fields = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
    return QueueMetrics(queue, {c: fields.get(c, 0) for c in COUNTERS},
                        _histogram(fields, "wait"), _histogram(fields, "run"),
                        dict(zip(STATES, (int(s) for s in sizes))))


def combine(queue: str, parts: Sequence[QueueMetrics]) -> QueueMetrics:
    """One snapshot summing ``parts`` (a partitioned queue's partitions) under ``queue``."""
    def total(maps: Iterable[Dict[str, int]]) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for m in maps:
            for k, v in m.items():
                out[k] = out.get(k, 0) + v
        return out

    def merged(hists: List[Histogram]) -> Histogram:
        return Histogram([(bound, sum(h.buckets[i][1] for h in hists))
                          for i, (bound, _) in enumerate(hists[0].buckets)],
                         sum(h.sum_ms for h in hists))
    return QueueMetrics(queue, total(p.counters for p in parts),
                        merged([p.wait for p in parts]), merged([p.run for p in parts]),
                        total(p.states for p in parts))


def physical_keys(client: Any, name: str) -> List[QueueKeys]:
    """The keys holding queue ``name``'s jobs: its partitions' when its meta records a
    partitioned layout (one read), else its own."""
    partitions = client.hget(QueueKeys(name).meta, "partitions")
    if partitions is None:
        return [QueueKeys(name)]
    return [QueueKeys(part) for part in partition_names(name, int(partitions))]


def snapshot_op(keys: QueueKeys) -> Op:
    """Read one queue's metrics and state sizes in one round trip."""
    raw, *sizes = yield Batch([Cmd.of("HGETALL", keys.metrics),
                               *(Cmd.of("ZCARD", k) for k in
                                 (keys.delayed, keys.pending, keys.active, keys.completed,
                                  keys.failed))])
    return parse(keys.name, raw, sizes)


class Collector:
    """A ``prometheus_client`` collector reading queues' metrics from Redis at scrape time.

    ``queues`` names the queues to export; None discovers every queue on the
    server at each scrape (SCAN of the meta hashes).
    """

    def __init__(self, conn: Any, queues: Optional[Iterable[str]] = None):
        from emqfast.server.connection import resolve

        self.redis = resolve(conn)
        self.queues = None if queues is None else [QueueKeys(q).name for q in queues]

    def _names(self) -> List[str]:
        if self.queues is not None:
            return self.queues
        return queue_names_of(self.redis.scan_iter(match=queue_meta_glob(), count=1000))

    def snapshots(self) -> List[QueueMetrics]:
        """The current metrics of every exported queue (a partitioned one: its partitions
        summed under its name)."""
        return [combine(name, [run(self.redis, snapshot_op(keys))
                               for keys in physical_keys(self.redis, name)])
                for name in self._names()]

    def process_workers(self) -> List[Tuple[str, WorkerInfo]]:
        """``(queue, worker)`` for every live process Worker of the exported queues, as
        its heartbeat says."""
        out = []
        for name in self._names():
            for keys in physical_keys(self.redis, name):
                for info in run(self.redis, live_workers_op(keys)):
                    if info.kind == "process":
                        out.append((name, info))
        return out

    def collect(self) -> Iterator[Any]:
        """Metric families for ``prometheus_client`` (called on every scrape)."""
        yield from self._queue_families()
        yield from child_families(self.process_workers())

    def _queue_families(self) -> Iterator[Any]:
        """The queues' counters, state sizes and latency histograms."""
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        jobs = CounterMetricFamily("emqfast_jobs", "Job outcomes written, by queue and outcome "
                                   "(completed, failed, retried, stalled, expired)",
                                   labels=["queue", "outcome"])
        states = GaugeMetricFamily("emqfast_queue_jobs", "Jobs currently in each state",
                                   labels=["queue", "state"])
        hists = {name: HistogramMetricFamily(
            f"emqfast_job_{name}_seconds",
            "Time from due to start" if name == "wait" else "Time from start to finish",
            labels=["queue"]) for name in HISTOGRAMS}
        for snap in self.snapshots():
            for outcome, value in snap.counters.items():
                jobs.add_metric([snap.queue, outcome], value)
            for state, value in snap.states.items():
                states.add_metric([snap.queue, state], value)
            for name in HISTOGRAMS:
                h: Histogram = getattr(snap, name)
                hists[name].add_metric(
                    [snap.queue],
                    [("+Inf" if b == float("inf") else repr(b / 1000), n) for b, n in h.buckets],
                    sum_value=h.sum_ms / 1000)
        yield jobs
        yield states
        yield from hists.values()


def child_families(workers: Iterable[Tuple[str, WorkerInfo]]) -> List[Any]:
    """The families of process Workers' handler processes, one series per live Worker
    (label ``worker``: its name) and reason; every known reason is exported from 0."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    labels = ["queue", "worker"]
    restarts = CounterMetricFamily(
        "emqfast_worker_child_restarts", "Handler processes started to replace one "
        "(crashed, killed or recycled)", labels=labels)
    crashes = CounterMetricFamily(
        "emqfast_worker_child_crashes", "Runs ended by their handler process dying by "
        "itself (a signal, an exit, the OOM killer), each failed with WorkerCrashed",
        labels=labels)
    kills = CounterMetricFamily(
        "emqfast_worker_child_kills", "Handler processes the Worker killed, by reason: "
        "timeout or cancel (not stopped within cancel_grace_ms), shutdown (running "
        "past shutdown_timeout_s)", labels=labels + ["reason"])
    recycles = CounterMetricFamily(
        "emqfast_worker_child_recycles", "Handler processes replaced between jobs, by "
        "reason: jobs (max_jobs_per_child) or memory (max_memory_per_child_mb)",
        labels=labels + ["reason"])
    children = GaugeMetricFamily("emqfast_worker_children", "Live handler processes",
                                 labels=labels)
    rss = GaugeMetricFamily("emqfast_worker_children_rss_bytes", "Resident memory of the "
                            "handler processes, summed (where the platform says it)",
                            labels=labels)
    for queue, w in workers:
        ev, who = w.child_events, [queue, w.token]
        restarts.add_metric(who, ev.get("restarts", 0))
        crashes.add_metric(who, ev.get("crash", 0))
        for reason, key in KILLS.items():
            kills.add_metric(who + [reason], ev.get(key, 0))
        for reason, key in RECYCLES.items():
            recycles.add_metric(who + [reason], ev.get(key, 0))
        children.add_metric(who, len(w.children))
        rss.add_metric(who, sum(c.rss_kb or 0 for c in w.children) * 1024)
    return [restarts, crashes, kills, recycles, children, rss]


def registry_for(conn: Any, queues: Optional[Iterable[str]] = None) -> Any:
    """A fresh ``prometheus_client`` registry holding only a :class:`Collector`."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector(conn, queues))
    return registry


def exposition(conn: Any, queues: Optional[Iterable[str]] = None) -> str:
    """The Prometheus text exposition of the queues' metrics."""
    from prometheus_client import generate_latest

    return generate_latest(registry_for(conn, queues)).decode()
