"""Memory: Redis bytes per pending job and per delayed job, payload excluded
(``used_memory`` delta over N tiny jobs, minus the payload bytes). With
``--peers`` the run compares them with BullMQ's for the same job."""
from __future__ import annotations

import gc
from typing import List, Tuple


import emqfast

from .common import Ctx, Result, check, queue_name
from .server import isolated

PAYLOAD = {}  # JSON "{}": 2 bytes, the same tiny job the BullMQ peer adds
PAYLOAD_BYTES = 2


def used_memory(client) -> int:
    """The server's ``used_memory`` (bytes)."""
    return int(client.info("memory")["used_memory"])


def bytes_per_job(ctx: Ctx, n: int, delayed: bool) -> Tuple[float, int]:
    """(Δused_memory / n - payload, MEMORY USAGE of one job hash) for ``n`` jobs, on a
    server of their own (see :func:`bench.server.isolated`)."""
    with isolated(ctx.server) as server:
        q = emqfast.Queue(queue_name("memory"), server.client())
        try:
            q.enqueue({"warm": 1})  # meta, counter, marker exist before the baseline
            q.redis.delete(q.keys.pending)
            gc.collect()
            before = used_memory(q.redis)
            kwargs = {"delay_ms": 3_600_000} if delayed else {}
            refs = q.enqueue_many([PAYLOAD] * n, **kwargs)
            after = used_memory(q.redis)
            key = q.keys.delayed if delayed else q.keys.pending
            check(q.redis.zcard(key) == n and len(refs) == n, "not every job was stored")
            sample = q.redis.memory_usage(q.keys.job(refs[0].id)) or 0
            return (after - before) / n - PAYLOAD_BYTES, sample
        finally:
            q.obliterate()


def run(ctx: Ctx) -> List[Result]:
    """One row per state; the reference is filled in by the peers comparison."""
    n = ctx.n(100_000, 5_000)
    out = []
    for state, delayed in (("pending", False), ("delayed", True)):
        ctx.progress(f"memory: {n:,} {state} jobs")
        per_job, sample = bytes_per_job(ctx, n, delayed)
        out.append(Result(workload="memory", name=f"Redis bytes per {state} job (payload excluded)",
                          value=per_job, unit="bytes", target="<= BullMQ",
                          verified=f"{n}/{n} stored",
                          details={"n": n, "job_hash_memory_usage": sample,
                                   "state": state}))
    return out
