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
    results.append(aio_vs_sync(ctx, n, data))
    return results


AIO_TARGET = 0.8


def aio_enqueue_once(ctx: Ctx, n: int, data: List[bytes]) -> float:
    """Seconds for one ``emqfast.aio`` ``enqueue_many`` of ``data`` on a fresh queue."""
    import asyncio

    import emqfast.aio as emq_aio

    with fresh_queue(ctx, "aio-enqueue") as sync_q:
        async def main() -> Tuple[float, int]:
            q = emq_aio.Queue(sync_q.name, emq_aio.connect(ctx.server.url))
            await q.enqueue(b"warm")  # connected, scripts loaded: as the sync run is
            with stopwatch() as t:
                refs = await q.enqueue_many(data)
            await q.aclose()
            return t[0], sum(r.status == "pending" for r in refs)
        seconds, admitted = asyncio.run(main())
        check(admitted == n and sync_q.redis.zcard(sync_q.keys.pending) == n + 1,
              f"aio enqueue_many admitted {admitted} of {n}")
        return seconds


def aio_vs_sync(ctx: Ctx, n: int, data: List[bytes]) -> Result:
    """``emqfast.aio`` enqueue_many against the sync path (the live backend) in one run,
    alternating: target >= 0.8x."""
    aio_times, sync_times = [], []
    for rep in range(ctx.reps):
        ctx.progress(f"enqueue_many asyncio vs sync: rep {rep + 1}/{ctx.reps}")
        aio_times.append(aio_enqueue_once(ctx, n, data))
        sync_times.append(enqueue_once(ctx, n, data, {}, "pending")[0])
    aio_s, sync_s = median(rate(n, t) for t in aio_times), median(rate(n, t) for t in sync_times)
    return Result(workload="enqueue", name="emqfast.aio enqueue_many vs the sync path",
                  value=aio_s, unit="jobs/s", reference=sync_s,
                  reference_label=f"sync enqueue_many ({emqfast.backend()}), same run",
                  ratio=aio_s / sync_s, target=f">= {AIO_TARGET}x the sync path",
                  ok=aio_s / sync_s >= AIO_TARGET, verified=f"{n}/{n} pending",
                  details={"aio_runs_jobs_s": [rate(n, t) for t in aio_times],
                           "sync_runs_jobs_s": [rate(n, t) for t in sync_times]})
