"""Single-enqueue latency, the web-request path: one ``q.enqueue(payload)``
per request, one at a time, against a bare ``EVALSHA`` of a script doing only HSET+ZADD
over the same redis-py client, the two alternating in blocks in one run.
Target: ``q.enqueue`` p50 <= 1.2x the bare round trip.

The bare call is the floor a hand-written producer would pay (redis-py's own client
overhead included); ``q.enqueue`` adds validation, an id, options, the admission script's
own server work (fence, TIME, counter, marker, event) and emqfast's transport.

    python -m bench.enqueue_latency [--n 5000] [--reps 5] [--url redis://...]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Optional, Sequence

import emqfast

from .common import Ctx, Result, check, fresh_queue, median

TARGET_RATIO = 1.2
BLOCK = 250  # calls per block; the contenders alternate block by block
FLOOR_SCRIPT = ("redis.call('HSET', KEYS[1], 'payload', ARGV[1]) "
                "redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1]) return 1")
PAYLOAD = {"user": 42, "action": "welcome-email", "lang": "en"}


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def _timed(call: Callable[[int], object], start: int, count: int, out: List[float]) -> None:
    clock = time.perf_counter
    for i in range(start, start + count):
        began = clock()
        call(i)
        out.append(clock() - began)


def measure(q: emqfast.Queue, n: int) -> Dict[str, List[float]]:
    """Per-call seconds of ``n`` enqueues and ``n`` bare EVALSHAs, alternating blocks."""
    client = q.redis
    sha = client.script_load(FLOOR_SCRIPT)
    base = f"emq:{{{q.name}}}:floor"
    zset = base + ":z"

    def bare(i: int) -> object:
        return client.evalsha(sha, 2, f"{base}:{i}", zset, b"x" * 60, i)

    def enqueue(i: int) -> object:
        return q.enqueue(PAYLOAD)

    for i in range(n, n + 200):  # warm both paths: connections, script cache, imports
        bare(i)
        enqueue(i)
    got: Dict[str, List[float]] = {"enqueue": [], "bare": []}
    for start in range(0, n, BLOCK):
        count = min(BLOCK, n - start)
        _timed(enqueue, start, count, got["enqueue"])
        _timed(bare, start, count, got["bare"])
    check(client.zcard(zset) == n + 200, "the floor script did not write every call")
    check(q.counts()["pending"] == n + 200, "not every enqueue landed")
    client.delete(zset)
    return got


def run(ctx: Ctx) -> List[Result]:
    """p50/p99 of ``q.enqueue`` and of the bare round trip; their p50 ratio per rep."""
    n = ctx.n(5_000, 1_000)
    ratios, p50s, floors, p99s = [], [], [], []
    for rep in range(ctx.reps):
        ctx.progress(f"enqueue latency: rep {rep + 1}/{ctx.reps}")
        with fresh_queue(ctx, "latency") as q:
            got = measure(q, n)
            q.redis.eval("for _, k in ipairs(redis.call('KEYS', ARGV[1])) do "
                         "redis.call('UNLINK', k) end", 0, f"emq:{{{q.name}}}:floor:*")
        p50, floor = percentile(got["enqueue"], 50), percentile(got["bare"], 50)
        ratios.append(p50 / floor)
        p50s.append(p50)
        floors.append(floor)
        p99s.append(percentile(got["enqueue"], 99))
    ratio = median(ratios)
    us = 1e6
    return [Result(workload="enqueue-latency",
                   name=f"single q.enqueue p50 ({emqfast.backend()}) vs bare EVALSHA HSET+ZADD",
                   value=median(p50s) * us, unit="us", reference=median(floors) * us,
                   reference_label="bare EVALSHA p50", ratio=ratio,
                   target=f"<= {TARGET_RATIO}x", ok=ratio <= TARGET_RATIO,
                   verified=f"{n} jobs pending per rep",
                   details={"ratios": [round(r, 3) for r in ratios],
                            "enqueue_p99_us": round(median(p99s) * us, 1),
                            "reps": ctx.reps})]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print the figures of one run."""
    from . import server

    p = argparse.ArgumentParser(prog="python -m bench.enqueue_latency",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=5_000, help="enqueues per rep")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--url", help="a Redis to use (default: a private redis-server)")
    args = p.parse_args(argv)
    srv = server.start(args.url, private=args.url is None)
    try:
        ctx = Ctx(server=srv, reps=args.reps)
        ctx.n = lambda full, quick: args.n  # type: ignore[method-assign]
        for res in run(ctx):
            d = res.details
            print(f"{res.name}: {res.value:.1f} us vs {res.reference:.1f} us -> "
                  f"{res.ratio:.2f}x (target <= {TARGET_RATIO}x); per rep {d['ratios']}; "
                  f"enqueue p99 {d['enqueue_p99_us']} us")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
