"""Scale: per-job enqueue and promote cost with 1k .. 1M jobs already delayed
(far in the future). Sorted sets are O(log N): target cost(1M) <= 1.5 x cost(1k)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import emqfast

from .common import (Ctx, Result, check, fresh_queue, median, payloads, server_now_ms,
    stopwatch, verify_members, wait_until)
from .promote import promote_all

TARGET_RATIO = 1.5
FAR_MS = 30 * 24 * 3600 * 1000
CHUNK = 50_000


def grow_backlog(q: emqfast.Queue, have: int, want: int) -> int:
    """Top the delayed set up to ``want`` far-future jobs (untimed)."""
    data = payloads(min(CHUNK, max(want - have, 1)), 100)
    run_at = server_now_ms(q.redis) + FAR_MS
    while have < want:
        count = min(CHUNK, want - have)
        q.enqueue_many(data[:count], run_at_ms=run_at)
        have += count
    check(q.redis.zcard(q.keys.delayed) == want, "backlog size is off")
    return have


def clear_pending(q: emqfast.Queue) -> None:
    """Drop the promoted jobs so every round starts with the same pending set."""
    ids = [i.decode() for i in q.redis.zrange(q.keys.pending, 0, -1)]
    pipe = q.redis.pipeline(transaction=False)
    for start in range(0, len(ids), 10_000):
        pipe.unlink(*q.keys.jobs(ids[start:start + 10_000]))
    pipe.delete(q.keys.pending)
    pipe.execute()


def one_round(q: emqfast.Queue, m: int, backlog: int) -> Tuple[float, float]:
    """(enqueue µs/job, promote µs/job) for ``m`` jobs due soon, on top of the backlog."""
    data = payloads(m, 100)
    run_at = server_now_ms(q.redis) + 500 + m // 20
    with stopwatch() as t_enq:
        refs = q.enqueue_many(data, run_at_ms=run_at)
    check(server_now_ms(q.redis) < run_at, "enqueue took longer than the head start")
    wait_until(lambda: server_now_ms(q.redis) > run_at, timeout_s=60, what="due jobs")
    with stopwatch() as t_pro:
        moved = promote_all(q)
    check(moved == m, f"promoted {moved} of {m}")
    check(verify_members(q.redis, q.keys.pending, [r.id for r in refs]) == m,
          "not every promoted job is pending")
    check(q.redis.zcard(q.keys.delayed) == backlog, "the backlog changed")
    clear_pending(q)
    return t_enq[0] / m * 1e6, t_pro[0] / m * 1e6


def run(ctx: Ctx) -> List[Result]:
    """Rows for enqueue and promote: the cost ratio largest/smallest, curve in details."""
    sizes = [1_000, 10_000] if ctx.quick else [1_000, 10_000, 100_000, 1_000_000]
    m = ctx.n(20_000, 2_000)
    curve: Dict[int, Dict[str, float]] = {}
    with fresh_queue(ctx, "scale") as q:
        have = 0
        for size in sizes:
            ctx.progress(f"scale: backlog {size:,}")
            have = grow_backlog(q, have, size)
            rounds = [one_round(q, m, size) for _ in range(ctx.reps)]
            curve[size] = {"enqueue_us": median(r[0] for r in rounds),
                           "promote_us": median(r[1] for r in rounds)}
    lo, hi = curve[sizes[0]], curve[sizes[-1]]
    out = []
    for what in ("enqueue", "promote"):
        ratio = hi[f"{what}_us"] / lo[f"{what}_us"]
        out.append(Result(
            workload="scale",
            name=f"{what} µs/job with {sizes[-1]:,} delayed vs {sizes[0]:,} ({emqfast.backend()})",
            value=hi[f"{what}_us"], unit="µs/job", reference=lo[f"{what}_us"],
            reference_label=f"with {sizes[0]:,} delayed", ratio=ratio,
            target=f"<= {TARGET_RATIO}x", ok=ratio <= TARGET_RATIO,
            verified=f"{m}/{m} per round x {ctx.reps} rounds x {len(sizes)} sizes",
            details={"curve_us_per_job": {str(s): curve[s][f"{what}_us"] for s in sizes},
                     "jobs_per_round": m}))
    return out
