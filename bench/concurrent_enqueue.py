"""Concurrent single enqueues (group commit): many producers each calling ``q.enqueue``
for one job at a time, against ``enqueue_many`` of the same jobs, in one run.

- 16 threads x ``q.enqueue`` vs one sync ``enqueue_many`` of the same jobs;
- 100 asyncio tasks x ``await q.enqueue`` vs one ``emqfast.aio`` ``enqueue_many``;
- one thread alone: ``q.enqueue`` p50 latency with group commit on vs off
  (``Queue(..., group_commit=False)`` sends exactly what enqueue sent before it).

The contenders alternate round by round; figures are medians over the rounds
(``--reps``). Every job is verified in Redis, exactly once, before a number counts.

    python -m bench.concurrent_enqueue [--n 16000] [--reps 3] [--url redis://...]
    emqfast bench --only concurrent
"""
from __future__ import annotations

import argparse
import asyncio
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

import emqfast

from .common import Ctx, Result, check, fresh_queue, median, rate, stopwatch

THREADS = 16
TASKS = 100
PAYLOAD = b"x" * 100
THROUGHPUT_TARGET = 0.5
LATENCY_TARGET = 1.1
BLOCK = 250  # lone enqueues per block; on and off alternate block by block


def _verify(q: emqfast.Queue, refs: Sequence[Any], n: int, what: str) -> None:
    check(len(refs) == n and len({r.id for r in refs}) == n
          and all(r.status == "pending" for r in refs), f"{what}: {n} distinct pending refs")
    pending = {m.decode() for m in q.redis.zrange(q.keys.pending, 0, -1)}
    check(len(pending) == n + 1 and {r.id for r in refs} <= pending,
          f"{what}: every job in pending exactly once ({len(pending) - 1} of {n})")


def sync_many(ctx: Ctx, n: int) -> float:
    with fresh_queue(ctx, "cc-many") as q:
        q.enqueue(b"warm")
        with stopwatch() as t:
            refs = q.enqueue_many([PAYLOAD] * n)
        _verify(q, refs, n, "enqueue_many")
        return rate(n, t[0])


def sync_threads(ctx: Ctx, n: int, threads: int = THREADS) -> float:
    with fresh_queue(ctx, "cc-threads") as q:
        q.enqueue(b"warm")
        per = n // threads
        refs: List[List[Any]] = [[] for _ in range(threads)]
        start = threading.Barrier(threads + 1)

        def producer(i: int) -> None:
            q.enqueue(b"warm")  # this thread's connection made before the clock starts
            start.wait()
            mine = refs[i]
            for _ in range(per):
                mine.append(q.enqueue(PAYLOAD))

        pool = [threading.Thread(target=producer, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        start.wait()
        began = time.perf_counter()
        for t in pool:
            t.join()
        seconds = time.perf_counter() - began
        done = [r for mine in refs for r in mine]
        check(len(done) == per * threads, "every thread enqueued its jobs")
        # (each thread's warm-up job is pending too)
        pending = q.redis.zcard(q.keys.pending)
        check(pending == per * threads + threads + 1,
              f"threads: {pending} pending, want {per * threads + threads + 1}")
        check(len({r.id for r in done}) == len(done), "threads: distinct refs")
        return rate(per * threads, seconds)


def _aio(ctx: Ctx, body: Callable[[Any], Any]) -> Tuple[float, float, int]:
    import emqfast.aio as emq_aio

    with fresh_queue(ctx, "cc-aio") as sync_q:
        async def main() -> Tuple[float, float, int]:
            q = emq_aio.Queue(sync_q.name, emq_aio.connect(ctx.server.url))
            await q.enqueue(b"warm")
            await q.enqueue_many([b"warm"])
            try:
                return await body(q)
            finally:
                await q.aclose()
        seconds, cpu, n = asyncio.run(main())
        pending = sync_q.redis.zcard(sync_q.keys.pending)
        check(pending == n + 2, f"aio: {pending} pending, want {n + 2}")
        return seconds, cpu, n


def aio_many(ctx: Ctx, n: int) -> Tuple[float, float]:
    """jobs/s of one ``emqfast.aio`` enqueue_many, and this process's CPU µs per job."""
    async def body(q: Any) -> Tuple[float, float, int]:
        cpu = time.process_time()
        with stopwatch() as t:
            refs = await q.enqueue_many([PAYLOAD] * n)
        cpu = time.process_time() - cpu
        check(len({r.id for r in refs}) == n, "aio enqueue_many: distinct refs")
        return t[0], cpu, n
    seconds, cpu, n = _aio(ctx, body)
    return rate(n, seconds), cpu / n * 1e6


def aio_tasks(ctx: Ctx, n: int, tasks: int = TASKS) -> Tuple[float, float]:
    """jobs/s of ``tasks`` asyncio tasks each awaiting ``q.enqueue`` one job at a time,
    and the event loop's CPU µs per job (this process's: the loop is its only thread)."""
    per = n // tasks

    async def body(q: Any) -> Tuple[float, float, int]:
        async def producer() -> List[Any]:
            return [await q.enqueue(PAYLOAD) for _ in range(per)]
        cpu = time.process_time()
        with stopwatch() as t:
            got = await asyncio.gather(*(producer() for _ in range(tasks)))
        cpu = time.process_time() - cpu
        refs = [r for mine in got for r in mine]
        check(len({r.id for r in refs}) == per * tasks and all(r.status == "pending"
                                                              for r in refs),
              "aio tasks: distinct pending refs")
        return t[0], cpu, per * tasks
    seconds, cpu, n = _aio(ctx, body)
    return rate(n, seconds), cpu / n * 1e6


def lone_latency(ctx: Ctx, n: int) -> Tuple[float, float]:
    """p50 seconds of one thread's ``q.enqueue`` with group commit on and off."""
    got: dict = {True: [], False: []}
    with fresh_queue(ctx, "cc-lone") as on, fresh_queue(ctx, "cc-lone-off",
                                                         group_commit=False) as off:
        clock = time.perf_counter
        for q in (on, off):
            for _ in range(200):
                q.enqueue({"warm": 1})
        for _ in range(0, n, BLOCK):
            for q in (on, off):
                out = got[q.group_commit]
                for _ in range(BLOCK):
                    began = clock()
                    q.enqueue({"user": 42})
                    out.append(clock() - began)
        for q in (on, off):
            check(q.redis.zcard(q.keys.pending) == 200 + len(got[q.group_commit]),
                  "lone: every enqueue landed")
    p50 = [sorted(got[k])[len(got[k]) // 2] for k in (True, False)]
    return p50[0], p50[1]


def run(ctx: Ctx) -> List[Result]:
    """The three ratios, each a median over ``ctx.reps`` rounds."""
    n = ctx.n(16_000, 1_600)
    lone_n = ctx.n(5_000, 500)
    rows: dict = {k: [] for k in ("many", "threads", "aio_many", "tasks", "on", "off",
                                  "aio_many_cpu", "tasks_cpu")}
    for rep in range(ctx.reps):
        ctx.progress(f"concurrent enqueue: rep {rep + 1}/{ctx.reps}")
        rows["many"].append(sync_many(ctx, n))
        rows["threads"].append(sync_threads(ctx, n))
        for key, (jobs_s, cpu_us) in (("aio_many", aio_many(ctx, n)),
                                      ("tasks", aio_tasks(ctx, n))):
            rows[key].append(jobs_s)
            rows[f"{key}_cpu"].append(cpu_us)
        on, off = lone_latency(ctx, lone_n)
        rows["on"].append(on)
        rows["off"].append(off)
    thread_ratios = [a / b for a, b in zip(rows["threads"], rows["many"])]
    task_ratios = [a / b for a, b in zip(rows["tasks"], rows["aio_many"])]
    lone_ratios = [a / b for a, b in zip(rows["on"], rows["off"])]
    backend = emqfast.backend()
    runs = {k: [round(v, 1) for v in vs] for k, vs in rows.items()
            if k not in ("on", "off", "aio_many_cpu", "tasks_cpu")}
    us = 1e6
    return [
        Result(workload="concurrent", name=f"{THREADS} threads x q.enqueue ({backend})",
               value=median(rows["threads"]), unit="jobs/s", reference=median(rows["many"]),
               reference_label="enqueue_many, same jobs", ratio=median(thread_ratios),
               target=f">= {THROUGHPUT_TARGET}x", ok=median(thread_ratios) >= THROUGHPUT_TARGET,
               verified=f"{n}/{n} pending, once",
               details={"ratios": [round(r, 3) for r in thread_ratios], "runs": runs}),
        Result(workload="concurrent", name=f"{TASKS} asyncio tasks x await q.enqueue",
               value=median(rows["tasks"]), unit="jobs/s", reference=median(rows["aio_many"]),
               reference_label="emqfast.aio enqueue_many, same jobs", ratio=median(task_ratios),
               target=f">= {THROUGHPUT_TARGET}x", ok=median(task_ratios) >= THROUGHPUT_TARGET,
               verified=f"{n}/{n} pending, once",
               details={"ratios": [round(r, 3) for r in task_ratios],
                        "cpu_us_per_job": {k: round(median(rows[f"{k}_cpu"]), 2)
                                           for k in ("tasks", "aio_many")}}),
        Result(workload="concurrent", name=f"one thread: q.enqueue p50, group commit on "
               f"vs off ({backend})", value=median(rows["on"]) * us, unit="us",
               reference=median(rows["off"]) * us, reference_label="group_commit=False",
               ratio=median(lone_ratios), target=f"<= {LATENCY_TARGET}x",
               ok=median(lone_ratios) <= LATENCY_TARGET, verified=f"{lone_n} x 2 pending",
               details={"ratios": [round(r, 3) for r in lone_ratios]}),
    ]


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Print the figures of one run."""
    from . import server

    p = argparse.ArgumentParser(prog="python -m bench.concurrent_enqueue",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=16_000, help="jobs per contender per round")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--url", help="a Redis to use (default: a private redis-server)")
    args = p.parse_args(argv)
    srv = server.start(args.url, private=args.url is None)
    try:
        ctx = Ctx(server=srv, reps=args.reps)
        ctx.n = lambda full, quick: args.n if full == 16_000 else 5_000  # type: ignore[method-assign]
        for res in run(ctx):
            print(f"{res.name}: {res.value:,.1f} {res.unit} vs {res.reference:,.1f} "
                  f"({res.reference_label}) -> {res.ratio:.3f}x (target {res.target}); "
                  f"per round {res.details['ratios']}"
                  + (f"; process CPU us/job (median) {res.details['cpu_us_per_job']}"
                     if "cpu_us_per_job" in res.details else ""))
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
