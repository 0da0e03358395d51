"""Bulk enqueue: ``Queue.enqueue_many`` of 100-byte payloads (now, delayed,
prioritized) against redis-benchmark running the same script with the same
arguments, in the same run. Target: >= 80 % of that ceiling."""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

import emqfast

from . import ceiling
from .common import (Ctx, CpuUse, Result, check, cpu_use, fresh_queue, median, payloads,
    rate, stopwatch, verify_members)

TARGET = 0.80
PAYLOAD = 100

# name -> (enqueue_many keyword arguments, ceiling script arguments, set the jobs land in)
MODES: Dict[str, tuple] = {
    "now": ({}, {"mode": "now", "value": 0}, "pending"),
    "delayed": ({"delay_ms": 3_600_000}, {"mode": "in", "value": 3_600_000}, "delayed"),
    "prioritized": ({"priority": 7}, {"mode": "now", "value": 0, "priority": 7}, "pending"),
}


def enqueue_once(ctx: Ctx, n: int, data: List[bytes], kwargs: Dict[str, Any],
                 where: str) -> Tuple[float, CpuUse]:
    """Time one ``enqueue_many`` of ``data`` on a fresh queue; verify all ``n`` landed."""
    with fresh_queue(ctx, "enqueue") as q:
        with cpu_use(q.redis) as cpu, stopwatch() as t:
            refs = q.enqueue_many(data, **kwargs)
        want = "pending" if where == "pending" else "scheduled"
        check(len(refs) == n and all(r.status == want for r in refs),
              f"enqueue_many returned {len(refs)} refs, not {n} x {want}")
        key = getattr(q.keys, where)
        check(q.redis.zcard(key) == n, f"{where} holds {q.redis.zcard(key)} jobs, not {n}")
        present = verify_members(q.redis, key, [r.id for r in refs])
        check(present == n, f"only {present} of {n} enqueued ids are in {where}")
        return t[0], cpu


def run(ctx: Ctx) -> List[Result]:
    """One result per mode: median jobs/s, the ceiling, their ratio."""
    n = ctx.n(100_000, 5_000)
    data = payloads(n, PAYLOAD)
    results = []
    for mode, (kwargs, ceiling_args, where) in MODES.items():
        times, ceilings, cpus = [], [], []
        for rep in range(ctx.reps):
            ctx.progress(f"enqueue {mode}: rep {rep + 1}/{ctx.reps}")
            # Alternate ceiling and emqfast runs so drift on a shared machine hits both.
            if ceiling.available():
                ceilings.append(ceiling.measure_enqueue(ctx, n, payload_size=PAYLOAD,
                                                        **ceiling_args))
            seconds, cpu = enqueue_once(ctx, n, data, kwargs, where)
            times.append(seconds)
            cpus.append(cpu)
        jobs_s = median(rate(n, t) for t in times)
        res = Result(workload="enqueue", name=f"enqueue_many {mode} ({emqfast.backend()})",
                     value=jobs_s, unit="jobs/s", target=f">= {TARGET:.0%} of ceiling",
                     verified=f"{n}/{n} in {where}",
                     details={"n": n, "payload_bytes": PAYLOAD, "backend": emqfast.backend(),
                              "runs_jobs_s": [rate(n, t) for t in times],
                              **cpus[len(cpus) // 2].per_job_us(n)})
        if ceilings:
            ceilings.sort(key=lambda c: c.calls_per_s)
            mid = ceilings[len(ceilings) // 2]
            res.reference = mid.calls_per_s
            res.reference_label = f"redis-benchmark -P {mid.pipeline} -c {mid.clients}"
            res.ratio = jobs_s / mid.calls_per_s
            res.ok = res.ratio >= TARGET
            res.details["ceiling_runs"] = [c.calls_per_s for c in ceilings]
            res.details["ceiling_command"] = mid.command
            res.details["ceiling_admitted"] = mid.admitted
        results.append(res)
    return results
