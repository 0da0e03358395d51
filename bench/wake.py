"""Wake latency: an idle worker, jobs becoming due at spread instants; how long
after its run-at does each job's handler start? Target: p99 <= 5 ms, no polling.

Also measures how late Redis fires a BZPOPMIN timeout (it checks blocked
clients' timeouts on its ``hz`` tick), the reason the worker keeps its own timer.
"""
from __future__ import annotations

import random
import threading
import time
from typing import List, Tuple

import emqfast

from .common import Ctx, Result, check, fresh_queue, server_now_ms, wait_until

TARGET_P99_MS = 5.0
GAP_MS = 5  # mean spacing of the due instants


def clock_offset_ms(client) -> float:
    """server clock - local wall clock, in ms (midpoint of a TIME round trip)."""
    best = None
    for _ in range(5):
        before = time.time() * 1000
        server = server_now_ms(client)
        after = time.time() * 1000
        if best is None or after - before < best[0]:
            best = (after - before, server - (before + after) / 2)
    return best[1]  # type: ignore[index]


def percentile(values: List[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def bzpopmin_overshoot_ms(client, timeout_s: float = 0.01, tries: int = 5) -> float:
    """Median of how much later than asked an empty-key BZPOPMIN returns."""
    over = []
    key = f"bench-wake-probe-{random.getrandbits(32)}"
    for _ in range(tries):
        start = time.perf_counter()
        client.bzpopmin(key, timeout=timeout_s)
        over.append((time.perf_counter() - start - timeout_s) * 1000)
    return sorted(over)[len(over) // 2]


def measure(ctx: Ctx, n: int) -> Tuple[List[float], int]:
    """Latencies (ms) of ``n`` jobs due ~GAP_MS apart, handled by one idle worker."""
    with fresh_queue(ctx, "wake") as q:
        offset = clock_offset_ms(q.redis)
        started: List[Tuple[str, float, int]] = []

        def handler(job: emqfast.Job) -> None:
            started.append((job.id, time.time() * 1000 + offset, job.payload["run_at"]))

        w = emqfast.Worker(q, handler, keep_completed=n + 1)
        thread = threading.Thread(target=w.run, name="bench-wake-worker", daemon=True)
        thread.start()
        try:
            rng = random.Random(7)
            base = server_now_ms(q.redis) + 500  # every enqueue lands before the first is due
            pipe_ids = []
            for i in range(n):
                run_at = base + i * GAP_MS + rng.randrange(GAP_MS)
                pipe_ids.append(q.enqueue_at({"run_at": run_at}, run_at).id)
            check(server_now_ms(q.redis) < base, "enqueueing took longer than the head start")
            wait_until(lambda: len(started) >= n, timeout_s=30 + n * GAP_MS / 1000,
                       what=f"{n} wake-ups")
        finally:
            w.stop()
            thread.join(30)
        check(len(started) == n and {s[0] for s in started} == set(pipe_ids),
              f"handler ran {len(started)} times for {n} jobs (not exactly once each)")
        return [start - run_at for _, start, run_at in started], n


def run(ctx: Ctx) -> List[Result]:
    """p50/p99/max latency rows and the BZPOPMIN timeout precision."""
    n = ctx.n(1_000, 100)
    ctx.progress("wake: BZPOPMIN timeout precision")
    overshoot = bzpopmin_overshoot_ms(ctx.client())
    ctx.progress(f"wake: {n} jobs due {GAP_MS} ms apart")
    lat, _ = measure(ctx, n)
    p50, p99, worst = percentile(lat, 50), percentile(lat, 99), max(lat)
    return [
        Result(workload="wake", name=f"wake latency p99 ({n} due jobs, idle worker)",
               value=p99, unit="ms", reference=TARGET_P99_MS, reference_label="target",
               ratio=p99 / TARGET_P99_MS, target="<= 5 ms", ok=p99 <= TARGET_P99_MS,
               verified=f"{n}/{n} started exactly once",
               details={"p50_ms": p50, "p99_ms": p99, "max_ms": worst, "n": n,
                        "min_ms": min(lat)}),
        Result(workload="wake", name="wake latency p50", value=p50, unit="ms",
               verified=f"{n}/{n}", details={}),
        Result(workload="wake", name="Redis BZPOPMIN 10 ms timeout fires late by", value=overshoot,
               unit="ms", details={"why": "Redis checks blocking timeouts on its hz tick; "
                                          "the worker times due instants itself"}),
    ]
