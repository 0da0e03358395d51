"""Where a partitioned queue's Worker drain spends, per job, against one plain queue.

    python -m bench.partition_costs [--n 20000] [--reps 3]

One Worker (default settings, no-op handler) drains n jobs, alternating, in three setups:

- ``standalone``: one unpartitioned queue on a private standalone server;
- ``cluster P=1``: a partitioned queue of one partition on the tests' 3-master Cluster
  (the Cluster client's cost, and the many-queue crew's, without partitioning);
- ``standalone P=3``: three partitions on that one server (the partitioning's cost in
  the client, with one server's CPU as for the plain queue);
- ``cluster P=3``: three partitions over the three masters (the target's setup).

Per job it prints the client's CPU (this process: every thread), its context switches
per 1000 jobs (voluntary: blocking on I/O or a lock; involuntary: preempted), the Redis
CPU summed over the servers (``INFO cpu``) and the script calls per 1000 jobs (``INFO
commandstats``: claim, start, complete, metrics...), and the Worker's peak thread count,
medians of the repetitions.
Unlike jobs/s these are per-job costs, so they say the same on a loaded machine; what
this machine's two cores can run is their sum.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import threading
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
MEASURES = ("jobs/s", "client CPU µs", "voluntary cs /1k", "involuntary cs /1k",
            "Redis CPU µs", "script calls /1k", "threads")


def _server(port: int) -> Tuple[float, float]:
    """``(CPU seconds, script calls)`` of the redis-server on ``port`` so far."""
    with redis.Redis(port=port) as r:
        cpu = r.info("cpu")
        stats = r.info("commandstats")
    calls = sum(float(v["calls"]) for k, v in stats.items()
                if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), calls


class PeakThreads:
    """The most threads alive at once while it runs (sampled every 20 ms)."""

    def __init__(self) -> None:
        self.peak = threading.active_count()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, threading.active_count() - 1)  # (not itself)

    def __enter__(self) -> "PeakThreads":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


def drain_costs(q: Any, n: int, ports: List[int]) -> Dict[str, float]:
    """One Worker drains the ``n`` jobs of ``q`` (on the servers at ``ports``): what
    each job cost (see the module docstring); checks each job ran once."""
    seen: List[str] = []
    worker = emqfast.Worker(q, lambda job: seen.append(job.id), keep_completed=n)
    before = [_server(p) for p in ports]
    use0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, start = time.process_time(), time.perf_counter()
    with PeakThreads() as threads:
        stats = worker.run_until_idle(timeout_s=max(60.0, n / 500))
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
    use1 = resource.getrusage(resource.RUSAGE_SELF)
    after = [_server(p) for p in ports]
    if stats.completed != n or len(set(seen)) != n or len(seen) != n:
        raise RuntimeError(f"drain ran {len(seen)} handlers for {n} jobs")
    return {"jobs/s": n / seconds, "client CPU µs": cpu * 1e6 / n,
            "voluntary cs /1k": (use1.ru_nvcsw - use0.ru_nvcsw) * 1000 / n,
            "involuntary cs /1k": (use1.ru_nivcsw - use0.ru_nivcsw) * 1000 / n,
            "Redis CPU µs": sum(a[0] - b[0] for a, b in zip(after, before)) * 1e6 / n,
            "script calls /1k": sum(a[1] - b[1] for a, b in zip(after, before)) * 1000 / n,
            "threads": float(threads.peak)}


def measure(cluster: Any, single: Any, n: int, reps: int) -> Dict[str, Dict[str, float]]:
    """setup -> measure -> median over ``reps`` alternating runs."""
    cc = emqfast.connect(cluster.url)
    sc = single.client()
    setups = [("standalone", sc, None, [single.port]),
              ("cluster P=1", cc, 1, list(cluster.ports)),
              ("standalone P=3", sc, 3, [single.port]),
              ("cluster P=3", cc, 3, list(cluster.ports))]
    runs: Dict[str, List[Dict[str, float]]] = {}
    for rep in range(reps):
        for name, client, parts, ports in (setups if rep % 2 == 0 else setups[::-1]):
            qname = f"bench-pc-{uuid.uuid4().hex[:6]}"
            q = emqfast.Queue(qname, client, partitions=parts) if parts \
                else emqfast.Queue(qname, client)
            q.enqueue_many([b"warm"] * 3 * (parts or 1))  # every partition's scripts loaded
            drain_costs(q, 3 * (parts or 1), ports)
            q.enqueue_many(data(n))
            runs.setdefault(name, []).append(drain_costs(q, n, ports))
            q.obliterate()
    return {name: {m: statistics.median(r[m] for r in rs) for m in MEASURES}
            for name, rs in runs.items()}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.partition_costs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000, help="jobs per run")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    from cluster_util import start_cluster  # the tests' real cluster

    cluster, single = start_cluster(3), server.start(private=True)
    try:
        got = measure(cluster, single, args.n, args.reps)
    finally:
        single.stop()
        cluster.stop()
    print(f"one Worker's drain of {args.n} jobs x 100 B, per job, medians of {args.reps}")
    print("| setup | " + " | ".join(MEASURES) + " |")
    print("|---|" + "---|" * len(MEASURES))
    for name, row in got.items():
        cells = [f"{row[m]:,.0f}" if m in ("jobs/s", "threads") else f"{row[m]:.1f}"
                 for m in MEASURES]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
