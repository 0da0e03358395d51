"""Drain: one worker process, a no-op handler, N pending jobs. Target: >= 25,000
jobs/s, every job completed exactly once (each with its own lease and token)."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import emqfast

from .common import (Ctx, CpuUse, Result, check, cpu_use, fresh_queue, median, payloads,
    rate, stopwatch)

TARGET_JOBS_S = 25_000.0

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


def run(ctx: Ctx) -> List[Result]:
    """Median jobs/s of a full drain."""
    n = ctx.n(100_000, 3_000)
    data = payloads(n, 100)
    times, cpus = [], []
    for rep in range(ctx.reps):
        ctx.progress(f"drain: rep {rep + 1}/{ctx.reps}")
        seconds, cpu = drain_once(ctx, n, data, WORKER_OPTS)
        times.append(seconds)
        cpus.append(cpu)
    jobs_s = median(rate(n, t) for t in times)
    return [Result(workload="drain", name=f"drain, 1 worker, no-op ({emqfast.backend()})",
                   value=jobs_s, unit="jobs/s", reference=TARGET_JOBS_S,
                   reference_label="target", ratio=jobs_s / TARGET_JOBS_S,
                   target=">= 25,000 jobs/s", ok=jobs_s >= TARGET_JOBS_S,
                   verified=f"{n}/{n} completed exactly once",
                   details={"n": n, "worker_opts": dict(WORKER_OPTS),
                            "runs_jobs_s": [rate(n, t) for t in times],
                            **cpus[len(cpus) // 2].per_job_us(n)})]
