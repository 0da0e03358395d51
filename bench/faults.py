"""A longer fault soak than CI runs (issue 11), from a source checkout:

    .venv/bin/python bench/faults.py                       # 4 variants x 1 run x 50,000 jobs
    .venv/bin/python bench/faults.py --jobs 100000 --runs 3 --variants sync-c,aio-python

Each variant is tests/test_fault_soak.py's soak (producers with own ids and one
Worker, all through tests/fault_proxy.py cutting a random live connection every
50-200 ms at a random byte, or resetting it) against a private redis-server this
script starts. It prints the closing table: fault, runs, jobs, lost, run twice,
stalls (plus stuck active, attempts != 1 and untyped producer errors), one row per
variant summed over its runs. Exit status 1 when any run broke an invariant.
Not a timing benchmark: it reports counts, never rates.
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


def main(argv: List[str] = None) -> int:  # type: ignore[assignment]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=50_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--variants", default="sync-python,sync-c,aio-python,aio-c")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
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
