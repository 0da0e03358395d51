"""enqueue_many and a one-Worker drain on a 3-master Redis Cluster against one standalone
server, in one run (target: >= 0.9x both), under each backend.

    python -m bench.cluster_enqueue [--n 20000] [--reps 3]

The cluster is the test suite's (``tests/cluster_util.py``: real ``redis-server
--cluster-enabled`` nodes on loopback, torn down at the end); the standalone server is a
private one (``bench/server.py``). Repetitions alternate the two; medians are printed.
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

import emqfast

from . import server
from .server_probe import data

TESTS = Path(__file__).resolve().parent.parent / "tests"


def rate(client: Any, payloads: List[bytes]) -> float:
    """jobs/s of one enqueue_many on a fresh queue (warmed: scripts loaded, connected)."""
    q = emqfast.Queue(f"bench-cl-{uuid.uuid4().hex[:8]}", client)
    q.enqueue("warm")
    start = time.perf_counter()
    q.enqueue_many(payloads)
    seconds = time.perf_counter() - start
    q.obliterate()
    return len(payloads) / seconds


def drain_rate(client: Any, payloads: List[bytes]) -> float:
    """jobs/s of one Worker (default settings, no-op handler) running every job of a fresh
    queue; checks each ran exactly once."""
    q = emqfast.Queue(f"bench-cd-{uuid.uuid4().hex[:8]}", client)
    q.enqueue_many(payloads)
    seen: List[str] = []
    worker = emqfast.Worker(q, lambda job: seen.append(job.id), keep_completed=len(payloads))
    start = time.perf_counter()
    stats = worker.run_until_idle(timeout_s=max(60.0, len(payloads) / 500))
    seconds = time.perf_counter() - start
    if stats.completed != len(payloads) or len(seen) != len(payloads) \
            or len(set(seen)) != len(seen):
        raise RuntimeError(f"drain ran {len(seen)} handlers, completed {stats.completed}, "
                           f"for {len(payloads)} jobs")
    q.obliterate()
    return len(payloads) / seconds


def measure(n: int, reps: int) -> Dict[Tuple[str, str, str], float]:
    """(workload, backend, 'cluster' | 'standalone') -> median jobs/s; workload is
    'enqueue_many' or 'drain'."""
    sys.path.insert(0, str(TESTS))
    from cluster_util import start_cluster  # the tests' real cluster

    backend = importlib.import_module("emqfast.backend")
    previous = backend.current()
    payloads = data(n)
    runs: Dict[Tuple[str, str, str], List[float]] = {}
    cluster, single = start_cluster(3), server.start(private=True)
    try:
        targets = {"cluster": emqfast.connect(cluster.url), "standalone": single.client()}
        modes = ["python"] + (["c"] if backend.native_available() else [])
        for rep in range(reps):
            for mode in modes:
                backend.use(mode)
                order = list(targets.items())
                for where, client in (order if rep % 2 == 0 else order[::-1]):
                    runs.setdefault(("enqueue_many", mode, where), []).append(
                        rate(client, payloads))
                    runs.setdefault(("drain", mode, where), []).append(
                        drain_rate(client, payloads))
    finally:
        backend.use(previous)
        single.stop()
        cluster.stop()
    return {key: statistics.median(values) for key, values in runs.items()}


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_enqueue", description=__doc__)
    p.add_argument("--n", type=int, default=20_000, help="jobs per enqueue_many")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median)")
    args = p.parse_args(argv)
    got = measure(args.n, args.reps)
    print(f"{args.n} jobs x 100 B, medians of {args.reps}")
    print("| workload | backend | cluster jobs/s | standalone jobs/s | cluster ÷ standalone |")
    print("|---|---|---|---|---|")
    for work, mode in sorted({(w, m) for w, m, _ in got}):
        c, s = got[(work, mode, "cluster")], got[(work, mode, "standalone")]
        print(f"| {work} | {mode} | {c:,.0f} | {s:,.0f} | {c / s:.2f}× |")


if __name__ == "__main__":
    main()
