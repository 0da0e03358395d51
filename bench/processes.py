"""Handlers in processes (``Worker(processes=N)``) against the thread Worker, in one run:

- CPU-bound handlers (~5 ms of pure Python each): ``processes=2`` vs the thread Worker's
  jobs/s. Target >= 1.7x on a 2-core machine (the ceiling is the core count).
- No-op drain: ``processes=2`` vs the thread Worker. Target >= 0.5x (the IPC cost is
  bounded: dispatches and outcomes travel in bundles).
- Kill latency: handlers that ignore their timeout; from the timeout to the child gone
  (a watcher polls ``/proc`` every 0.5 ms). Target p99 <= cancel_grace_ms + 50 ms.

    python -m bench.processes [redis://localhost:6379/0] [--rounds 3]

Ratios are medians over rounds, each pair measured back to back.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
import uuid
from typing import Any, Dict, List, Optional

import emqfast

CPU_MS = 5.0
GRACE_MS = 100
TIMEOUT_MS = 100


def cpu(job: Any) -> int:
    """A fixed amount of pure-Python work (~5 ms alone on this machine: ``job.payload["n"]``
    iterations, calibrated by :func:`calibrate`): it holds the GIL throughout, so threads
    of one process take turns."""
    return _spin(job.payload["n"])


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i * i
    return total % 7


def calibrate() -> int:
    """Iterations of :func:`_spin` taking about ``CPU_MS`` here."""
    n = 20_000
    while True:
        started = time.perf_counter()
        _spin(n)
        took = time.perf_counter() - started
        if took > 0.02:
            return int(n * CPU_MS / 1000.0 / took)
        n *= 2


def noop(job: Any) -> None:
    """Nothing: what the Worker costs per job."""


def spin(job: Any) -> None:
    """Ignores its stop; notes when it began (for the kill latency)."""
    with open(job.payload["ledger"], "a") as f:
        f.write(f"{os.getpid()} {time.time():.6f}\n")
    while True:
        pass


def _drain(url: str, handler: Any, n: int, processes: Optional[int], work: int = 0) -> float:
    """Jobs/s of a running Worker draining ``n`` jobs: timed from the enqueue to the last
    completion, once its children (if any) are up; a Worker's start is not part of it."""
    q = emqfast.Queue("bench-proc-" + uuid.uuid4().hex[:8], emqfast.connect(url))
    options: Dict[str, Any] = {"processes": processes} if processes else {"concurrency": 8}
    w = emqfast.Worker(q, handler, keep_completed=n, **options)
    runner = threading.Thread(target=w.run, daemon=True)
    runner.start()
    while processes and len((w._children_report() or {}).get("children", [])) < processes:
        time.sleep(0.01)
    started = time.perf_counter()
    q.enqueue_many([{"i": i, "n": work} for i in range(n)])
    while q.counts().get("completed", 0) < n:  # (a light poll: it shares this process)
        time.sleep(0.05)
    took = time.perf_counter() - started
    w.stop()
    runner.join(60)
    return n / took


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def kill_latencies(url: str, n: int, ledger: str) -> List[float]:
    """ms from each spinning job's timeout (its start + timeout_ms) to its child gone."""
    q = emqfast.Queue("bench-kill-" + uuid.uuid4().hex[:8], emqfast.connect(url))
    for _ in range(n):
        q.enqueue({"ledger": ledger}, timeout_ms=TIMEOUT_MS, attempts=1)
    w = emqfast.Worker(q, spin, processes=2, cancel_grace_ms=GRACE_MS)
    gone: Dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            report = w._children_report() or {"children": []}
            for child in report["children"]:
                gone.setdefault(-child["pid"], 0.0)  # seen alive
            for key in [k for k in gone if k < 0]:
                if not _alive(-key):
                    gone[-key] = time.time()
                    del gone[key]
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        w.run_until_idle(timeout_s=600)
    finally:
        time.sleep(0.05)
        done.set()
        watcher.join()
    out = []
    with open(ledger) as f:
        for line in f:
            pid, began = line.split()
            if int(pid) in gone:
                out.append((gone[int(pid)] - float(began)) * 1000.0 - TIMEOUT_MS)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default="redis://localhost:6379/0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cpu-jobs", type=int, default=1500)
    parser.add_argument("--noop-jobs", type=int, default=20_000)
    parser.add_argument("--kills", type=int, default=40)
    args = parser.parse_args(argv)
    cpu_ratio, noop_ratio = [], []
    work = calibrate()
    for r in range(args.rounds):
        t_cpu = _drain(args.url, cpu, args.cpu_jobs, None, work)
        p_cpu = _drain(args.url, cpu, args.cpu_jobs, 2, work)
        t_noop = _drain(args.url, noop, args.noop_jobs, None)
        p_noop = _drain(args.url, noop, args.noop_jobs, 2)
        cpu_ratio.append(p_cpu / t_cpu)
        noop_ratio.append(p_noop / t_noop)
        print(f"round {r + 1}: cpu-bound threads {t_cpu:,.0f}/s, processes=2 {p_cpu:,.0f}/s "
              f"({p_cpu / t_cpu:.2f}x); no-op threads {t_noop:,.0f}/s, processes=2 "
              f"{p_noop:,.0f}/s ({p_noop / t_noop:.2f}x)", flush=True)
    ledger = f"/tmp/emq-bench-kills-{uuid.uuid4().hex[:8]}"
    lat = sorted(kill_latencies(args.url, args.kills, ledger))
    os.unlink(ledger)
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"cpu-bound (~{CPU_MS:.0f} ms/job), processes=2 vs threads: median "
          f"{statistics.median(cpu_ratio):.2f}x (target >= 1.7x)")
    print(f"no-op drain, processes=2 vs threads: median {statistics.median(noop_ratio):.2f}x "
          f"(target >= 0.5x)")
    print(f"kill latency, timeout -> child gone ({len(lat)} kills, grace {GRACE_MS} ms): "
          f"p50 {statistics.median(lat):.1f} ms, p99 {p99:.1f} ms "
          f"(target <= {GRACE_MS + 50} ms)")


if __name__ == "__main__":
    sys.exit(main())
