"""Scheduling promises under load: the figures behind tests/test_scheduling_load.py.

- due: a job delayed 800 ms (and a retry with 100 ms backoff) behind a 6,000-job backlog at
  the same priority: how many runs started after it was due before it ran.
- lanes: 200 ungrouped + 3 x 20 grouped jobs at concurrency 1: the first grouped job's run #.
- spin: one idle worker beside 40 rate-limited groups whose windows are all full: claim
  calls/s (the worker's own count) and Redis evalsha calls/s (INFO commandstats).
- caps: 2 ms jobs in one group at cap 1 and cap 4 vs the same jobs uncapped at concurrency
  1 and 4: jobs/s and the ratio.
- discovery: a new group's job behind 1,000 capped groups: claims and ms until it is claimed.

Opt-in: ``emqfast bench --only scheduling``.
"""
from __future__ import annotations

import threading
import time
from typing import List, Tuple

import emqfast
from emqfast.worker import calls as worker_core
from emqfast.facade.options import Backoff

from .common import Ctx, Result, check, fresh_queue, wait_until

BACKLOG = 6_000


def due_behind_backlog(ctx: Ctx, retry: bool) -> Tuple[int, int]:
    """(runs started after the job was due and before it ran, its run #)."""
    with fresh_queue(ctx, "sched-due") as q:
        if retry:
            job_id = q.enqueue("flaky", attempts=2, backoff=Backoff.fixed(100)).id
        else:
            job_id = q.enqueue("late", delay_ms=800).id
        due = [time.monotonic() + 0.8]
        q.enqueue_many(["x"] * BACKLOG)
        runs: List[Tuple[str, float]] = []
        lock = threading.Lock()

        def handler(job: emqfast.Job) -> None:
            with lock:
                runs.append((job.id, time.monotonic()))
            if retry and job.id == job_id and job.attempts == 1:
                due[0] = time.monotonic() + 0.1
                raise RuntimeError("first attempt fails")
            time.sleep(0.001)
        emqfast.Worker(q, handler, concurrency=4, prefetch=8,
                       batch_size=16).run_until_idle(timeout_s=300)
        at = max(i for i, (jid, _) in enumerate(runs) if jid == job_id)
        late = sum(1 for _, t in runs[:at] if t >= due[0])
        return late, at + 1


def first_grouped_run(ctx: Ctx) -> int:
    """Run # of the first grouped job (200 flat + 3 x 20 grouped, concurrency 1)."""
    with fresh_queue(ctx, "sched-lanes") as q:
        q.enqueue_many(["flat"] * 200)
        for g in "abc":
            q.enqueue_many([g] * 20, group=g)
        order: List[object] = []
        emqfast.Worker(q, lambda job: order.append(job.extra.get("g")), concurrency=1,
                       prefetch=0).run_until_idle(timeout_s=120)
        check(len(order) == 260, f"lanes: {len(order)}/260 ran")
        return next(i for i, g in enumerate(order) if g is not None) + 1


def _evalsha_calls(client) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


def idle_spin(ctx: Ctx, seconds: float = 1.0) -> Tuple[float, float]:
    """(claim calls/s, Redis evalsha calls/s) of one idle worker, 40 full group windows."""
    with fresh_queue(ctx, "sched-spin") as q:
        for i in range(40):
            q.groups.set_rate_limit(f"rl{i}", 1, 60_000)
            q.enqueue_many(["x", "x"], group=f"rl{i}")
        claims = [0]
        real = worker_core.claim_call

        def counted(*args, **kwargs):
            claims[0] += 1
            return real(*args, **kwargs)
        worker_core.claim_call = counted
        w = emqfast.Worker(q, lambda job: None, concurrency=4)
        t = threading.Thread(target=w.run, daemon=True)
        try:
            t.start()
            wait_until(lambda: q.counts()["completed"] == 40, 30, "one job per group")
            time.sleep(0.2)
            c0, e0, t0 = claims[0], _evalsha_calls(q.redis), time.perf_counter()
            time.sleep(seconds)
            c1, e1, t1 = claims[0], _evalsha_calls(q.redis), time.perf_counter()
        finally:
            w.stop()
            t.join(30)
            worker_core.claim_call = real
        return (c1 - c0) / (t1 - t0), (e1 - e0) / (t1 - t0)


def _throughput(ctx: Ctx, jobs: int, cap: int, concurrency: int) -> float:
    with fresh_queue(ctx, "sched-cap") as q:
        if cap:
            q.groups.set_concurrency("g", cap)
        q.enqueue_many(list(range(jobs)), group="g")
        w = emqfast.Worker(q, lambda job: time.sleep(0.002), concurrency=concurrency)
        t = threading.Thread(target=w.run, daemon=True)
        start = time.perf_counter()
        t.start()
        try:
            wait_until(lambda: q.counts()["completed"] == jobs, 120, "capped jobs")
            return jobs / (time.perf_counter() - start)
        finally:
            w.stop()
            t.join(30)


def discovery(ctx: Ctx, groups: int = 1_000) -> Tuple[int, float]:
    """(claims, ms) until a new group's job is claimed behind ``groups`` capped groups."""
    def claim(q: emqfast.Queue, who: str, names: List[str]):
        call = worker_core.claim_call(q.keys, 1000, 60_000, who, names)
        reply = call.script(q.redis, call.keys, call.args)
        return worker_core.parse_claim(reply)[3], worker_core.claim_groups(reply)
    with fresh_queue(ctx, "sched-find") as q:
        for i in range(groups):
            q.groups.set_concurrency(f"c{i}", 1)
            q.enqueue_many(["x", "x"], group=f"c{i}")
        held, names = 0, []
        for _ in range(groups):
            pairs, names = claim(q, "holder", names)
            held += len(pairs)
            if held >= groups and not names:
                break
        q.enqueue("new", group="fresh")
        names, claims, start = [], 0, time.perf_counter()
        while claims < 10 * groups:
            claims += 1
            pairs, names = claim(q, "finder", names)
            if pairs:
                break
        return claims, (time.perf_counter() - start) * 1000


def run(ctx: Ctx) -> List[Result]:
    """The scheduling rows."""
    out: List[Result] = []
    for retry in (False, True):
        what = "retry (100 ms backoff)" if retry else "delayed job (800 ms)"
        ctx.progress(f"scheduling: {what} behind {BACKLOG} jobs")
        late, at = due_behind_backlog(ctx, retry)
        out.append(Result(workload="scheduling", name=f"{what}: runs after due, before it",
                          value=late, unit="runs", verified=f"ran as #{at} of {BACKLOG + 1}",
                          details={"position": at}))
    ctx.progress("scheduling: first grouped run behind 200 ungrouped")
    out.append(Result(workload="scheduling", name="first grouped job's run # (200 flat + 3x20)",
                      value=first_grouped_run(ctx), unit="#", verified="260/260 ran"))
    ctx.progress("scheduling: idle worker, 40 full group windows")
    claims_s, evalsha_s = idle_spin(ctx)
    out.append(Result(workload="scheduling", name="idle claim calls/s (40 full group windows)",
                      value=claims_s, unit="calls/s", details={"evalsha_per_s": evalsha_s}))
    for cap, conc in ((1, 1), (4, 4)):
        ctx.progress(f"scheduling: 2 ms jobs at cap {cap}")
        capped = _throughput(ctx, ctx.n(200, 60), cap, 4)
        free = _throughput(ctx, ctx.n(200, 60), 0, conc)
        out.append(Result(workload="scheduling", name=f"2 ms jobs at cap {cap}", value=capped,
                          unit="jobs/s", reference=free,
                          reference_label=f"uncapped, concurrency {conc}",
                          ratio=capped / free))
    ctx.progress("scheduling: a new group behind 1,000 capped groups")
    claims, ms = discovery(ctx)
    out.append(Result(workload="scheduling", name="new group behind 1,000 capped: claims",
                      value=claims, unit="claims", details={"ms": ms}))
    return out
