"""C backend vs Python backend vs a raw redis-py pipeline, bulk enqueue.

The same 100k jobs of 100-byte payloads three ways, in one run:

- ``enqueue_many`` under the C backend (hiredis framing, columns streamed);
- ``enqueue_many`` under the pure-Python backend (redis-py pipeline of EVALSHA);
- a raw redis-py pipeline doing what a minimal enqueue does (one HSET of the job
  hash + one ZADD on the pending set per job, no script, no validation): the
  pure-Python client ceiling.

Ratios are C / Python and C / raw pipeline, measured in the same run.
"""
from __future__ import annotations

from typing import List

from emqfast.backends.select import current, native_available, use

from .common import (Ctx, Result, check, fresh_queue, median, payloads, rate, stopwatch,
    verify_members)

PAYLOAD = 100
CHUNK = 10_000  # jobs per raw pipeline execute, as enqueue_many chunks its batches


def _enqueue_many(ctx: Ctx, backend: str, data: List[bytes]) -> float:
    previous = current()
    use(backend)
    try:
        with fresh_queue(ctx, f"backends-{backend}") as q:
            with stopwatch() as t:
                refs = q.enqueue_many(data)
            n = len(data)
            check(len(refs) == n and all(r.status == "pending" for r in refs),
                  f"{backend}: enqueue_many returned {len(refs)} refs, not {n} pending")
            check(verify_members(q.redis, q.keys.pending, [r.id for r in refs]) == n,
                  f"{backend}: not every enqueued id is pending")
            return t[0]
    finally:
        use(previous)


def _raw_pipeline(ctx: Ctx, data: List[bytes]) -> float:
    with fresh_queue(ctx, "backends-raw") as q:
        ids = [f"JOB{i:024d}" for i in range(len(data))]
        client, keys = q.redis, q.keys
        with stopwatch() as t:
            for start in range(0, len(data), CHUNK):
                pipe = client.pipeline(transaction=False)
                for i in range(start, min(start + CHUNK, len(data))):
                    pipe.hset(keys.job(ids[i]), mapping={"state": "pending", "payload": data[i]})
                    pipe.zadd(keys.pending, {ids[i]: i})
                pipe.execute()
        check(verify_members(client, keys.pending, ids) == len(ids),
              "raw pipeline: not every id is in the pending set")
        return t[0]


def run(ctx: Ctx) -> List[Result]:
    """Jobs/s of each way (median of the repetitions) and the ratios."""
    n = ctx.n(100_000, 5_000)
    data = payloads(n, PAYLOAD)
    ways = {"python": [], "raw": []}
    if native_available():
        ways["c"] = []
    for rep in range(ctx.reps):
        ctx.progress(f"backends: rep {rep + 1}/{ctx.reps}")
        for way, times in ways.items():  # interleaved, so drift hits every way alike
            times.append(_raw_pipeline(ctx, data) if way == "raw"
                         else _enqueue_many(ctx, way, data))
    speed = {way: median(rate(n, s) for s in times) for way, times in ways.items()}
    verified = f"{n}/{n} pending"
    results = [
        Result(workload="backends", name="enqueue_many, Python backend", value=speed["python"],
               unit="jobs/s", reference=speed["raw"], reference_label="raw redis-py pipeline",
               ratio=speed["python"] / speed["raw"], verified=verified),
        Result(workload="backends", name="raw redis-py pipeline HSET+ZADD", value=speed["raw"],
               unit="jobs/s", verified=verified),
    ]
    if "c" in speed:
        results.insert(0, Result(
            workload="backends", name="enqueue_many, C backend", value=speed["c"],
            unit="jobs/s", reference=speed["python"], reference_label="Python backend",
            ratio=speed["c"] / speed["python"], verified=verified,
            details={"c_vs_raw_pipeline": speed["c"] / speed["raw"]}))
        results.append(Result(
            workload="backends", name="C backend vs raw redis-py pipeline", value=speed["c"],
            unit="jobs/s", reference=speed["raw"], reference_label="raw redis-py pipeline",
            ratio=speed["c"] / speed["raw"], verified=verified))
    return results
