"""What dependencies cost, as ratios measured in one run.

    python bench/deps.py [redis://localhost:6379/0] [--n 500] [--rounds 5]

Per round, alternating so load drifts hit both sides alike:

- ``enqueue``: N plain enqueues vs N enqueues depending on a job of another queue
  (existence check, write, cross-slot link, mark cleared: four round trips);
- ``flow``: a flow of N roots, N dependents (two roots each) and N leaves, admitted round
  by round in pipelines, per job vs a plain enqueue;
- ``release``: N dependents of one job released by the outbox drain (one settle call after
  the job completed), per dependent vs a plain enqueue.

Prints the medians (us per job) and their ratios to the plain enqueue. Uses queues named
``bench-deps-*`` and deletes them afterwards.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import emqfast  # noqa: E402
from emqfast.backends.scripts import load  # noqa: E402
from emqfast.core.version import KEYSPACE_VERSION  # noqa: E402


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _complete_bare(q: emqfast.Queue, job_id: str) -> None:
    """Complete ``job_id`` as a Worker would, without a Worker's own drain."""
    k = q.keys
    claim = load("claim")(q.redis, [k.pending, k.active, k.leases, k.meta, k.marker, k.delayed,
                                    k.counter, k.rate], [1, 30_000, "bench", KEYSPACE_VERSION])
    token = claim[4]
    load("complete")(q.redis, [k.active, k.leases, k.completed, k.meta, k.events, k.metrics,
                               k.waiters, k.dependents, k.outbox, k.job(job_id)],
                     [KEYSPACE_VERSION, job_id, token, b"1", ""])


def one_round(conn: object, n: int, tag: str) -> Dict[str, float]:
    a = emqfast.Queue(f"bench-deps-{tag}-a", conn)
    b = emqfast.Queue(f"bench-deps-{tag}-b", conn)
    root = a.enqueue("root")
    out = {"plain": _timed(lambda: [b.enqueue(i) for i in range(n)]) / n}
    out["enqueue"] = _timed(lambda: [b.enqueue(i, depends_on=[(a.name, root.id)])
                                     for i in range(n)]) / n
    flow = emqfast.Flow(conn)
    roots = [flow.add(a, i) for i in range(n)]
    mids = [flow.add(b, i, after=[roots[i], roots[(i + 1) % n]]) for i in range(n)]
    for i in range(n):
        flow.add(a, i, after=[mids[i]])
    out["flow"] = _timed(flow.enqueue) / (3 * n)
    _complete_bare(a, root.id)
    out["release"] = _timed(a.settle_dependencies) / n
    a.obliterate()
    b.obliterate()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url", nargs="?", default=None)
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    conn = emqfast.connect(args.url)
    rounds: List[Dict[str, float]] = [one_round(conn, args.n, uuid.uuid4().hex[:6])
                                      for _ in range(args.rounds)]
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    for key in ("plain", "enqueue", "flow", "release"):
        print(f"{key:8s} {med[key] * 1e6:8.0f} us/job   x{med[key] / med['plain']:.2f} plain")


if __name__ == "__main__":
    main()
