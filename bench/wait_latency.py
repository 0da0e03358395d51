"""What ``ref.wait()`` costs against polling for a result, in one run.

    python bench/wait_latency.py [redis://localhost:6379/0] [--n 200] [--work-ms 20]

A thread Worker in another process answers each job after ``--work-ms`` (default 20 ms:
a short handler). This process enqueues one
job at a time and waits for its result three ways: ``ref.wait()`` (woken on the job's
done channel), and a loop of ``q.get(id)`` every 1 ms and every 10 ms. For each: the
round trip (enqueue -> result in hand; median and p99, ms) and the Redis commands the
waiting itself cost per job (INFO ``total_commands_processed``, script internals included,
less a baseline that sleeps past the work and reads once: the worker's and the enqueue's
share). Then
``wait_all`` over 1,000 refs: one pub/sub connection, the time to subscribe and register
them. Figures are reported as ratios to ref.wait's, measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

import emqfast  # noqa: E402

WORKER = ("import sys, time, emqfast\n"
          "q = emqfast.Queue(sys.argv[2], emqfast.connect(sys.argv[1]))\n"
          "work_s = float(sys.argv[3]) / 1000\n"
          "def handler(job):\n"
          "    time.sleep(work_s)\n"
          "    return job.payload\n"
          "emqfast.Worker(q, handler).run()\n")


def _poller(every_s: float, first: float = 0.0) -> Callable[[emqfast.Queue, emqfast.JobRef],
                                                              Any]:
    def wait(q: emqfast.Queue, ref: emqfast.JobRef) -> Any:
        time.sleep(first)
        while True:
            job = q.get(ref.id)
            if job is not None and job.state == "completed":
                return job.result
            time.sleep(every_s)
    return wait


def _by_wait(q: emqfast.Queue, ref: emqfast.JobRef) -> Any:
    return ref.wait(timeout_s=30)


def _sleeper(work_s: float) -> Callable[[emqfast.Queue, emqfast.JobRef], Any]:
    """The baseline: sleep past the job's work, then one read (rarely two): what the
    worker and the enqueue cost, for the waiters' own commands by difference."""
    return _poller(work_s + 0.02, first=work_s + 0.02)


def measure(q: emqfast.Queue, admin: redis.Redis, how: Callable[..., Any],
            n: int) -> Dict[str, float]:
    """Round trips (ms) and server commands per job for ``n`` jobs, one at a time."""
    how(q, q.enqueue(-1))  # warm: connections, scripts, the pub/sub reader
    before = int(admin.info("stats")["total_commands_processed"])
    trips: List[float] = []
    for i in range(n):
        start = time.perf_counter()
        assert how(q, q.enqueue(i)) == i
        trips.append((time.perf_counter() - start) * 1000)
    used = int(admin.info("stats")["total_commands_processed"]) - before
    trips.sort()
    return {"median_ms": statistics.median(trips), "p99_ms": trips[int(0.99 * n) - 1],
            "commands_per_job": used / n}


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("url", nargs="?", default=os.environ.get("EMQ_REDIS_URL"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--work-ms", type=float, default=20.0)
    args = ap.parse_args(argv)
    url = emqfast.server.connection.target_url(args.url)
    name = f"bench-wait-{uuid.uuid4().hex[:8]}"
    q, admin = emqfast.Queue(name, url), redis.Redis.from_url(url)
    worker = subprocess.Popen([sys.executable, "-c", WORKER, url, name, str(args.work_ms)])
    try:
        rows = {"baseline": measure(q, admin, _sleeper(args.work_ms / 1000), args.n),
                "ref.wait": measure(q, admin, _by_wait, args.n),
                "poll 1 ms": measure(q, admin, _poller(0.001), args.n),
                "poll 10 ms": measure(q, admin, _poller(0.010), args.n)}
        refs = q.enqueue_many(list(range(1000)))
        start = time.perf_counter()
        assert emqfast.wait_all(refs, timeout_s=60) == list(range(1000))
        many_ms = (time.perf_counter() - start) * 1000
    finally:
        worker.terminate()
        worker.wait(10)
        q.obliterate()
    floor = rows.pop("baseline")["commands_per_job"]
    base = rows["ref.wait"]
    own = {label: max(row["commands_per_job"] - floor, 0.1) for label, row in rows.items()}
    print(f"backend {emqfast.backend()}, n={args.n} jobs one at a time, each "
          f"{args.work_ms:g} ms of work, worker in another process; server commands per "
          f"job without any waiting (worker, enqueue, one read): {floor:.1f}")
    for label, row in rows.items():
        print(f"  {label:10s} round trip median {row['median_ms']:6.2f} ms "
              f"({row['median_ms'] / base['median_ms']:.2f}x)  p99 {row['p99_ms']:6.2f} ms  "
              f"waiting's own commands/job {own[label]:5.1f} "
              f"({own[label] / own['ref.wait']:.1f}x)")
    print(f"  wait_all over 1,000 fresh refs (drained meanwhile): {many_ms:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
