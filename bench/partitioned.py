"""One logical queue over many Cluster masters: how Redis CPU spreads over the masters,
and what the partitioning costs, in one run.

    python -m bench.partitioned [--n 20000] [--reps 3] [--spread-partitions 12]

Two measurements, on the test suite's real 3-master Cluster (``tests/cluster_util.py``)
and a private standalone server (``bench/server.py``):

- **spread**: ``Queue(name, cluster, partitions=P)`` (P = 12) gets n jobs by
  ``enqueue_many`` (placed round robin) and one Worker drains them all; each master's
  share of the Redis CPU used (``INFO cpu``: ``used_cpu_sys + used_cpu_user``, the
  process's own figure, read before and after) is printed beside the share of the
  partitions it holds. Target: each master's share <= 1/3 + 10 % (the issue's bound).
- **overhead**: ``enqueue_many`` and a one-Worker drain of n jobs on a queue of P = 3
  partitions over the 3 masters, against the same on one unpartitioned queue on the
  standalone server, alternating, medians of the repetitions. Target: >= 0.9x both.

On this 2-core machine the client, not Redis, bounds both rates; the spread is what
tells how the design scales (see ``docs/capacity.md``).
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

import redis

import emqfast

from . import server
from .server_probe import data

TESTS = Path(__file__).resolve().parent.parent / "tests"


def _cpu_s(port: int) -> float:
    """The redis-server on ``port``: CPU seconds its process used so far."""
    info = redis.Redis(port=port).info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _drain(q: Any, n: int) -> float:
    """Seconds for one Worker (default settings, no-op handler) to run every job of ``q``;
    checks that each of the ``n`` jobs ran exactly once."""
    seen: List[str] = []
    worker = emqfast.Worker(q, lambda job: seen.append(job.id), keep_completed=n)
    start = time.perf_counter()
    stats = worker.run_until_idle(timeout_s=max(60.0, n / 500))
    seconds = time.perf_counter() - start
    if stats.completed != n or len(seen) != n or len(set(seen)) != n:
        raise RuntimeError(f"drain ran {len(seen)} handlers ({len(set(seen))} distinct), "
                           f"completed {stats.completed}, for {n} jobs")
    return seconds


def _enqueue(q: Any, payloads: List[bytes]) -> float:
    """Seconds for one ``enqueue_many`` of ``payloads`` (the queue warmed first)."""
    q.enqueue(b"warm")
    _drain(q, 1)
    start = time.perf_counter()
    q.enqueue_many(payloads)
    return time.perf_counter() - start


def partition_masters(client: Any, q: Any, ports: List[int]) -> Dict[int, int]:
    """Master port -> how many of ``q``'s partitions live there (by each partition's
    meta key slot)."""
    held = {port: 0 for port in ports}
    for part in q.partition_queues:
        node = client.get_node_from_key(part.keys.meta)
        held[int(node.port)] += 1
    return held


def spread(cluster: Any, n: int, partitions: int) -> Dict[str, Any]:
    """Each master's share of the Redis CPU of enqueueing and draining ``n`` jobs on one
    queue of ``partitions`` partitions, and its share of the partitions."""
    client = emqfast.connect(cluster.url)
    q = emqfast.Queue(f"bench-part-{uuid.uuid4().hex[:6]}", client, partitions=partitions)
    q.enqueue(b"warm")
    _drain(q, 1)
    before = {port: _cpu_s(port) for port in cluster.ports}
    q.enqueue_many(data(n))
    _drain(q, n)
    used = {port: _cpu_s(port) - before[port] for port in cluster.ports}
    total = sum(used.values()) or 1e-9
    held = partition_masters(client, q, list(cluster.ports))
    q.obliterate()
    return {"cpu_share": {p: used[p] / total for p in cluster.ports},
            "partitions": held, "redis_cpu_us_per_job": total * 1e6 / n}


def overhead(cluster: Any, single: Any, n: int, reps: int
             ) -> Dict[Tuple[str, str], float]:
    """(workload, 'partitioned' | 'standalone') -> median jobs/s; workload is
    'enqueue_many' or 'drain'."""
    payloads = data(n)
    targets = {"partitioned": (emqfast.connect(cluster.url), 3),
               "standalone": (single.client(), None)}
    runs: Dict[Tuple[str, str], List[float]] = {}
    for rep in range(reps):
        order = list(targets.items())
        for where, (client, parts) in (order if rep % 2 == 0 else order[::-1]):
            name = f"bench-po-{uuid.uuid4().hex[:6]}"
            q = emqfast.Queue(name, client, partitions=parts) if parts \
                else emqfast.Queue(name, client)
            runs.setdefault(("enqueue_many", where), []).append(n / _enqueue(q, payloads))
            runs.setdefault(("drain", where), []).append(n / _drain(q, n))
            q.obliterate()
    return {key: statistics.median(values) for key, values in runs.items()}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.partitioned", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="jobs per run")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    p.add_argument("--spread-partitions", type=int, default=12,
                   help="partitions of the spread measurement")
    p.add_argument("--backend", choices=("c", "python"), default=None)
    args = p.parse_args(argv)
    if args.backend:
        importlib.import_module("emqfast.backend").use(args.backend)
    sys.path.insert(0, str(TESTS))
    from cluster_util import start_cluster  # the tests' real cluster

    cluster, single = start_cluster(3), server.start(private=True)
    try:
        shares = [spread(cluster, args.n, args.spread_partitions) for _ in range(args.reps)]
        ratios = overhead(cluster, single, args.n, args.reps)
    finally:
        single.stop()
        cluster.stop()
    print(f"spread: {args.n} jobs enqueued and drained on one queue of "
          f"{args.spread_partitions} partitions over 3 masters, medians of {args.reps}")
    print("| master | partitions held | share of Redis CPU | bound |")
    print("|---|---|---|---|")
    for port in sorted(shares[0]["cpu_share"]):
        share = statistics.median(s["cpu_share"][port] for s in shares)
        held = shares[0]["partitions"][port]
        print(f"| :{port} | {held} of {args.spread_partitions} | {share:.1%} | "
              f"<= {1 / 3 + 0.10:.1%} |")
    cost = statistics.median(s["redis_cpu_us_per_job"] for s in shares)
    print(f"Redis CPU per job (all masters): {cost:.1f} us")
    print()
    print(f"overhead: {args.n} jobs x 100 B, medians of {args.reps}")
    print("| workload | P = 3 on 3 masters jobs/s | unpartitioned standalone jobs/s | ratio | target |")
    print("|---|---|---|---|---|")
    for work in ("enqueue_many", "drain"):
        a, b = ratios[(work, "partitioned")], ratios[(work, "standalone")]
        print(f"| {work} | {a:,.0f} | {b:,.0f} | {a / b:.2f}× | >= 0.9× |")


if __name__ == "__main__":
    main()
