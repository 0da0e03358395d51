"""Drain: one worker process, a no-op handler, N pending jobs. Target: >= 25,000
jobs/s, every job completed exactly once (each with its own lease and token).

Also the asyncio Worker (``async def`` no-op handler, default settings) against the sync
Worker, the two alternating in one run: target >= 0.8x; and the sync Worker's client CPU
per job (the median run's): target <= 10 µs."""
from __future__ import annotations

import asyncio
from typing import Any, Dict, List, Tuple

import emqfast
import emqfast.aio as emq_aio

from .common import (Ctx, CpuUse, Result, check, cpu_use, fresh_queue, median, payloads,
    rate, stopwatch)

TARGET_JOBS_S = 25_000.0
TARGET_CPU_US = 10.0  # the worker process's CPU per drained job

# The worker as a user would configure it for short jobs; keep_completed only so
# the completed set can be checked against every enqueued id afterwards.
WORKER_OPTS: Dict[str, Any] = {}


def drain_once(ctx: Ctx, n: int, data: List[bytes], opts: Dict[str, Any]) -> Tuple[float, CpuUse]:
    """Seconds for one Worker to run every job of a fresh queue; verifies exactly-once."""
    with fresh_queue(ctx, "drain") as q:
        ids = [r.id for r in q.enqueue_many(data)]
        seen: List[str] = []
        handler = seen.append  # list.append is atomic under the GIL: safe from pool threads

        w = emqfast.Worker(q, lambda job: handler(job.id), keep_completed=n + 1, **opts)
        with cpu_use(q.redis) as cpu, stopwatch() as t:
            stats = w.run_until_idle(timeout_s=max(60.0, n / 1000))
        check(len(seen) == n, f"handler ran {len(seen)} times for {n} jobs")
        check(set(seen) == set(ids), "the handler did not see exactly the enqueued ids")
        check(stats.completed == n, f"worker completed {stats.completed} of {n}")
        counts = q.counts()
        check(counts["completed"] == n and counts["pending"] == 0 and counts["active"] == 0,
              f"queue counts after the drain: {counts}")
        check(q.redis.hlen(q.keys.leases) == 0, "leases left behind after the drain")
        return t[0], cpu


def aio_drain_once(ctx: Ctx, n: int, data: List[bytes]) -> Tuple[float, CpuUse]:
    """(seconds, CPU used) for one asyncio Worker, default settings but for
    ``keep_completed``, to run every job of a fresh queue; verifies exactly-once."""
    with fresh_queue(ctx, "aio-drain") as sync_q:
        ids = [r.id for r in sync_q.enqueue_many(data)]

        async def main() -> Tuple[float, List[str], Any]:
            q = emq_aio.Queue(sync_q.name, emq_aio.connect(ctx.server.url))
            seen: List[str] = []

            async def handler(job: Any) -> None:
                seen.append(job.id)
            w = emq_aio.Worker(q, handler, keep_completed=n + 1)
            with stopwatch() as t:
                stats = await w.run_until_idle(timeout_s=max(60.0, n / 500))
            await q.aclose()
            return t[0], seen, stats
        with cpu_use(sync_q.redis) as cpu:
            took, seen, stats = asyncio.run(main())
        check(len(seen) == n and set(seen) == set(ids), f"aio handler ran {len(seen)} of {n}")
        check(stats.completed == n, f"aio worker completed {stats.completed} of {n}")
        check(sync_q.counts()["completed"] == n, "aio drain: completed set incomplete")
    return took, cpu


def run(ctx: Ctx) -> List[Result]:
    """Median jobs/s of a full drain."""
    n = ctx.n(100_000, 3_000)
    data = payloads(n, 100)
    times, cpus = [], []
    aio_times, aio_cpus = [], []
    for rep in range(ctx.reps):  # sync and asyncio alternate: one run, one machine state
        ctx.progress(f"drain: rep {rep + 1}/{ctx.reps}")
        seconds, cpu = drain_once(ctx, n, data, WORKER_OPTS)
        times.append(seconds)
        cpus.append(cpu)
        ctx.progress(f"drain (asyncio Worker): rep {rep + 1}/{ctx.reps}")
        aio_s, aio_cpu = aio_drain_once(ctx, n, data)
        aio_times.append(aio_s)
        aio_cpus.append(aio_cpu)
    jobs_s = median(rate(n, t) for t in times)
    aio_jobs_s = median(rate(n, t) for t in aio_times)
    cpu = sorted(cpus, key=lambda c: c.process_s)[len(cpus) // 2]  # the median run's
    cpu_us = cpu.process_s / n * 1e6
    return [Result(workload="drain", name=f"drain, 1 worker, no-op ({emqfast.backend()})",
                   value=jobs_s, unit="jobs/s", reference=TARGET_JOBS_S,
                   reference_label="target", ratio=jobs_s / TARGET_JOBS_S,
                   target=">= 25,000 jobs/s", ok=jobs_s >= TARGET_JOBS_S,
                   verified=f"{n}/{n} completed exactly once",
                   details={"n": n, "worker_opts": dict(WORKER_OPTS),
                            "runs_jobs_s": [rate(n, t) for t in times],
                            **cpu.per_job_us(n)}),
            Result(workload="drain", name="drain, client CPU per job (sync Worker, median run)",
                   value=cpu_us, unit="µs/job", reference=TARGET_CPU_US,
                   reference_label="target", ratio=TARGET_CPU_US / cpu_us,  # lower is better
                   target="<= 10 µs/job", ok=cpu_us <= TARGET_CPU_US,
                   verified=f"{n}/{n} completed exactly once",
                   details={"runs_client_cpu_us_per_job": [c.process_s / n * 1e6
                                                           for c in cpus]}),
            Result(workload="drain", name="drain, asyncio Worker, async no-op, defaults",
                   value=aio_jobs_s, unit="jobs/s", reference=jobs_s,
                   reference_label="sync Worker, same run", ratio=aio_jobs_s / jobs_s,
                   target=">= 0.8x the sync Worker", ok=aio_jobs_s >= 0.8 * jobs_s,
                   verified=f"{n}/{n} completed exactly once",
                   details={"n": n, "runs_jobs_s": [rate(n, t) for t in aio_times],
                            **sorted(aio_cpus, key=lambda c: c.process_s)[len(aio_cpus) // 2]
                            .per_job_us(n)})]


def compare(url: str, n: int, reps: int, refs: List[str]) -> List[str]:
    """The drain (``server_probe``'s lifecycle: one Worker, no-op handler, N pending jobs)
    of this tree and of a worktree of each REF, the contenders alternating per
    repetition; one line per contender: medians of jobs/s, client and Redis CPU per job."""
    import statistics

    from .server_cost import ROOT, probe, ref_tree

    trees = {"HEAD": ROOT, **{ref: ref_tree(ref) for ref in refs}}
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in trees}
    for rep in range(reps):
        order = list(trees.items())
        for name, tree in order if rep % 2 == 0 else order[::-1]:
            runs[name].append(probe(tree, url, "lifecycle", n))
    med = statistics.median
    first = med(n / r["wall_s"] for r in runs[refs[0]]) if refs else 0.0
    lines = []
    for name, got in runs.items():
        jobs_s = med(n / r["wall_s"] for r in got)
        lines.append(f"| {name} | {jobs_s:,.0f} | "
                     f"{f'{jobs_s / first:.2f}x' if first else '-'} | "
                     f"{med(r['client_cpu_s'] for r in got) * 1e6 / n:.1f} | "
                     f"{med(r['process_s'] for r in got) * 1e6 / n:.1f} |")
    return lines


def main(argv: Any = None) -> None:
    """``python -m bench.drain --compare 408ab12 [--compare REF ...] [--n N] [--reps R]``
    (a private redis-server): the table of :func:`compare`."""
    import argparse

    from . import server

    p = argparse.ArgumentParser(prog="python -m bench.drain", description=compare.__doc__)
    p.add_argument("--n", type=int, default=20_000, help="jobs per run (default 20,000)")
    p.add_argument("--reps", type=int, default=5, help="repetitions (median; default 5)")
    p.add_argument("--compare", metavar="REF", action="append", default=[],
                   help="also measure commit REF (repeatable; ratios against the first)")
    args = p.parse_args(argv)
    srv = server.start(private=True)
    try:
        lines = compare(srv.url, args.n, args.reps, args.compare)
    finally:
        srv.stop()
    print(f"drain, 1 worker, no-op handler, n={args.n}, medians of {args.reps}")
    print(f"| tree | jobs/s | jobs/s ÷ {args.compare[0] if args.compare else '-'} "
          "| client CPU µs/job | Redis CPU µs/job |\n|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
