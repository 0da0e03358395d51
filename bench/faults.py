"""A longer fault soak than CI runs, from a source checkout:

    .venv/bin/python bench/faults.py                       # 4 variants x 1 run x 50,000 jobs
    .venv/bin/python bench/faults.py --jobs 100000 --runs 3 --variants sync-c,aio-python

Each variant is tests/test_fault_soak.py's soak (producers with own ids and one
Worker, all through tests/fault_proxy.py cutting a random live connection every
50-200 ms at a random byte, or resetting it) against a private redis-server this
script starts. It prints the closing table: fault, runs, jobs, lost, run twice,
stalls (plus stuck active, attempts != 1 and untyped producer errors), one row per
variant summed over its runs. Exit status 1 when any run broke an invariant.
Not a timing benchmark: it reports counts, never rates.

    .venv/bin/python bench/faults.py --network              # 20,000 jobs, 10 s blackhole
    .venv/bin/python bench/faults.py --network --jobs 5000 --blackhole 5 --kinds aio

``--network`` runs tests/network_soak.py's soak instead, once per Worker kind: one Worker
process per backend (thread, then asyncio), all through the fault proxy, through a
half-open blip, a blackhole, a BUSY script and a CLIENT KILL loop in turn, reconciled
from a ledger outside Redis. It prints one row per fault and kind: fault, Workers, jobs,
lost, run twice, re-runs after a lapsed lease, recovery time and its bound (twice the
fault's length). Exit status 1 when a run broke an invariant or a recovery its bound.
"""
from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path
from typing import Dict, List

TESTS = Path(__file__).resolve().parent.parent / "tests"


def _load_soak():  # type: ignore[no-untyped-def]
    """tests/ holds the harness (a source checkout, not an installed wheel)."""
    if not TESTS.is_dir():
        raise SystemExit("bench/faults.py needs a source checkout (tests/ holds the harness)")
    sys.path.insert(0, str(TESTS))
    import test_fault_soak  # noqa: E402
    from conftest import start_redis_server  # noqa: E402
    return test_fault_soak, start_redis_server


def run_variant(soak, port: int, variant: str, jobs: int, seed: int):  # type: ignore[no-untyped-def]
    """One soak run of ``variant`` ('sync-c', 'aio-python', ...) on a fresh queue."""
    import importlib

    facade, backend = variant.split("-")
    backend_mod = importlib.import_module("emqfast.backend")
    backend_mod.use(backend)
    run = soak.soak_sync if facade == "sync" else soak.soak_aio
    return run(port, f"bench-faults-{uuid.uuid4().hex[:8]}", n_jobs=jobs, seed=seed,
               fault=f"proxy cuts ({facade}, {backend})")


_FAULTS = ("c2s", "s2c", "rst", "any")  # ChaosRun's fault names (cuts also holds tallies)


def table(rows: Dict[str, List]) -> str:  # type: ignore[type-arg]
    head = ("fault", "runs", "jobs", "lost", "run twice", "stalls", "stuck active",
            "attempts!=1", "untyped errors", "cuts")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for variant, results in rows.items():
        lines.append(" | ".join(str(x) for x in (
            results[0].fault, len(results), sum(r.jobs for r in results),
            sum(r.lost for r in results), sum(r.run_twice for r in results),
            sum(r.stalls for r in results), sum(r.stuck_active for r in results),
            sum(r.attempts_not_1 for r in results),
            sum(sum(r.untyped_errors.values()) for r in results),
            sum(n for r in results for k, n in r.cuts.items() if k in _FAULTS))))
    return "\n".join(lines)


def network(args: argparse.Namespace) -> int:
    """The network soak (``--network``): one run per Worker kind, its table printed."""
    soak, _ = _load_soak()
    import network_soak  # noqa: E402 - tests/ is on the path now
    from conftest import start_redis_server  # noqa: E402

    proc, port, _ = start_redis_server()
    rows, bad = [], []
    try:
        for kind in args.kinds.split(","):
            result = network_soak.network_soak(
                port, f"bench-network-{kind}-{uuid.uuid4().hex[:8]}", kind,
                backends=tuple(args.backends.split(",")), n_jobs=args.jobs or 20_000,
                blackhole_s=args.blackhole, busy_s=args.busy, kill_s=args.kill,
                seed=args.seed)
            soak.report(result)
            print(f"\n{kind}: {result.jobs} jobs in {result.seconds}s, problems: "
                  f"{result.problems() or 'none'}", flush=True)
            rows += result.rows
            bad += [result] if result.problems() else []
            bad += [row for row in result.rows if not row.within()]
    finally:
        proc.terminate()
        proc.wait(10)
    print(network_soak.table(rows))
    return 1 if bad else 0


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=0, help="default 50,000 (--network: 20,000)")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--variants", default="sync-python,sync-c,aio-python,aio-c")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--network", action="store_true",
                    help="the network soak: blip, blackhole, BUSY, CLIENT KILL")
    ap.add_argument("--kinds", default="thread,aio", help="--network: Worker kinds")
    ap.add_argument("--backends", default="c,python", help="--network: one Worker each")
    ap.add_argument("--blackhole", type=float, default=10.0, help="--network: seconds")
    ap.add_argument("--busy", type=float, default=5.0, help="--network: seconds")
    ap.add_argument("--kill", type=float, default=5.0, help="--network: seconds")
    args = ap.parse_args(argv)
    if args.network:
        return network(args)
    args.jobs = args.jobs or 50_000
    soak, start_redis_server = _load_soak()
    soak.BUDGET_S = max(soak.BUDGET_S, args.jobs / 200)  # bounded, scaled to the size
    proc, port, _ = start_redis_server()
    rows: Dict[str, List] = {}  # type: ignore[type-arg]
    try:
        for variant in args.variants.split(","):
            for run in range(args.runs):
                result = run_variant(soak, port, variant, args.jobs, args.seed + run)
                soak.report(result)
                rows.setdefault(variant, []).append(result)
    finally:
        proc.terminate()
        proc.wait(10)
    print(table(rows))
    bad = [r for results in rows.values() for r in results if r.problems()]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
