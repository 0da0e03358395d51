"""What a Worker's claims and starts cost the client per job, by the path they take.

    python -m bench.worker_call_paths [--rounds 60]

Each round claims 256 jobs (claim.lua) and starts them in two calls of 128 (start.lua),
the calls a draining Worker makes, alternating between three paths in one process:

- ``standalone redis-py``: a private standalone server, through emqfast's transport on a
  redis-py connection (hiredis-py packs the command and parses the reply in C): what a
  Worker does there;
- ``cluster redis-py``: the tests' 3-master Cluster, the same transport with its slot
  routing: what a Worker does on a Cluster;
- ``cluster C core``: the same calls as one-call batches over the C Batcher to the slot's
  master (``ClusterBatcher.evalsha_many``, as a Worker's outcome writes go).

It prints the client CPU per job (``time.process_time``) of each path, median and
quartiles over the rounds. Per-job CPU says the same on a loaded machine; compare the
rows of one run, not runs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

import emqfast
from emqfast.backends import select as backend
from emqfast.backends.drive import run_calls
from emqfast.core.ops import Call
from emqfast.worker import calls

from . import server

TESTS = Path(__file__).resolve().parent.parent / "tests"
CLAIM, START = 256, 128  # a Worker's default claim and start.lua chunk


def one_round(q: Any, request: str, batcher: Optional[Any]) -> float:
    """Claim ``CLAIM`` jobs of ``q`` and start them; the client CPU µs per job."""
    send: Callable[[Call], Any]
    if batcher is None:
        def send(call: Call) -> Any:
            return call.script(q.redis, call.keys, call.args)
    else:
        def send(call: Call) -> Any:
            [reply] = run_calls(batcher, [call])
            return reply
    claim = calls.claim_call(q.keys, CLAIM, 30_000, "bench", (), request)
    cpu = time.process_time()
    pairs = calls.parse_claim(send(claim))[3]
    for at in range(0, len(pairs), START):
        send(calls.start_call(q.keys, pairs[at:at + START]))
    cpu = time.process_time() - cpu
    if len(pairs) != CLAIM:
        raise RuntimeError(f"claimed {len(pairs)} jobs, not {CLAIM}")
    return cpu * 1e6 / CLAIM


def measure(cluster_url: str, single: Any, rounds: int) -> Dict[str, List[float]]:
    """Per path, the client CPU µs per job of each round (paths alternate each round)."""
    cc = emqfast.connect(cluster_url)
    on_cluster = emqfast.Queue(f"bench-wcp-{uuid.uuid4().hex[:6]}", cc)
    alone = emqfast.Queue(f"bench-wcp-{uuid.uuid4().hex[:6]}", single.client())
    batcher = backend.batcher_for(cc)
    paths = [("standalone redis-py", alone, None), ("cluster redis-py", on_cluster, None),
             ("cluster C core", on_cluster, batcher)]
    got: Dict[str, List[float]] = {name: [] for name, _, _ in paths}
    try:
        for n in range(rounds + 1):  # round 0 loads the scripts and warms the connections
            alone.enqueue_many([b"x" * 100] * CLAIM)
            on_cluster.enqueue_many([b"x" * 100] * 2 * CLAIM)
            for name, q, via in (paths if n % 2 else paths[::-1]):
                cost = one_round(q, f"r{n}", via)
                if n:
                    got[name].append(cost)
    finally:
        on_cluster.obliterate()
        alone.obliterate()
        cc.close()
    return got


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.worker_call_paths", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=60, help="rounds per path (median)")
    args = p.parse_args(argv)
    if backend.current() != "c":
        raise SystemExit("the C core is not built (or EMQFAST_BACKEND=python)")
    sys.path.insert(0, str(TESTS))
    from cluster_util import start_cluster  # the tests' real cluster

    cluster, single = start_cluster(3), server.start(private=True)
    try:
        got = measure(cluster.url, single, args.rounds)
    finally:
        single.stop()
        cluster.stop()
    print(f"claim {CLAIM} + start {CLAIM // START} x {START}: client CPU per job, "
          f"{args.rounds} alternating rounds")
    print("| path | median µs | quartiles µs |")
    print("|---|---|---|")
    for name, costs in got.items():
        q1, _, q3 = statistics.quantiles(costs, n=4)
        print(f"| {name} | {statistics.median(costs):.2f} | {q1:.2f}–{q3:.2f} |")


if __name__ == "__main__":
    main()
