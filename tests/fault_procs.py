"""Processes the fault tests start, kill, freeze and restart (run as scripts).

    python tests/fault_procs.py count-worker URL QUEUE NAME LEASE_MS COUNTS_KEY
    python tests/fault_procs.py stall-worker URL QUEUE NAME LEASE_MS LOG_KEY GO_KEY
    python tests/fault_procs.py pump URL QUEUE

``count-worker`` runs an ordinary :class:`emqfast.Worker` whose handler counts
each execution of a job in a hash (``HINCRBY COUNTS_KEY <id> 1``), so the test
can tell a re-run from a first run. ``stall-worker`` runs a job that waits for
``GO_KEY`` (the test freezes the process meanwhile), then tries to extend its
lease and records what happened in ``LOG_KEY``. Both print their WorkerStats
as one JSON line when they stop (SIGTERM: graceful). ``pump`` runs the queue's
schedule pump in a tight loop until killed.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict

if __name__ == "__main__" and sys.argv[1:2] == ["count-worker"]:
    # before the slow imports: see _defer_sigterm_until_serving
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

import emqfast  # noqa: E402
from emqfast import LeaseLost, Queue, Worker  # noqa: E402
from waiting import wait_until  # noqa: E402 (tests/, this script's own folder)


def _defer_sigterm_until_serving(w: Worker) -> None:
    """A SIGTERM that arrives before ``w.run()`` installed its graceful handler would kill
    the process outright (exit -15): it is blocked from the top of this script until the first beat, which runs in the main thread inside run(),
    and delivered then (a graceful stop)."""
    def unblock() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    w.beat_hooks.append(unblock)


def count_worker(url: str, queue: str, name: str, lease_ms: str, counts_key: str) -> None:
    conn = emqfast.connect(url)
    q = Queue(queue, conn)

    def handler(job):
        conn.hincrby(counts_key, job.id, 1)
        return job.payload

    w = Worker(q, handler, concurrency=4, lease_ms=int(lease_ms), name=name,
               keep_completed=10**9, max_stalled=1000, shutdown_timeout_s=5)
    _defer_sigterm_until_serving(w)
    print(json.dumps(asdict(w.run())), flush=True)


def stall_worker(url: str, queue: str, name: str, lease_ms: str, log_key: str,
                 go_key: str) -> None:
    conn = emqfast.connect(url)
    q = Queue(queue, conn)

    def handler(job):
        conn.rpush(log_key, f"started:{name}:{job.attempts}")
        # the test SIGSTOPs us in here
        wait_until(lambda: conn.exists(go_key), 60, "the test to set the go key",
                   interval=0.01)
        try:
            job.extend_lease(10_000)
            conn.rpush(log_key, "extend:ok")
        except LeaseLost as exc:
            conn.rpush(log_key, f"extend:{type(exc).__name__}")
        return {"by": name}

    w = Worker(q, handler, concurrency=1, lease_ms=int(lease_ms), name=name, max_stalled=5,
               shutdown_timeout_s=5)
    # returns once its one job is done with (its outcome written or refused)
    print(json.dumps(asdict(w.run_until_idle(timeout_s=120))), flush=True)


def pump(url: str, queue: str) -> None:
    q = Queue(queue, emqfast.connect(url))
    while True:  # the test SIGKILLs us, mid-pass or between passes
        q.schedules.pump()
        time.sleep(0.005)  # the pump's own cadence, a few ms between passes


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    try:
        {"count-worker": count_worker, "stall-worker": stall_worker, "pump": pump}[mode](*args)
    except redis.RedisError as exc:  # pragma: no cover - surfaced through the test
        print(json.dumps({"error": repr(exc)}), flush=True)
        raise
