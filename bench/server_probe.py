"""One measured workload of the ``server`` benchmark, run in its own process so the same
driver can time any checkout of emqfast (``PYTHONPATH`` picks the tree: the working tree,
or a ``git worktree`` of an earlier commit for ``--compare``). Uses only public API an
earlier commit has too (``Queue.enqueue_many``, ``Worker``, ``Queue.promote``).

    python bench/server_probe.py URL WORKLOAD N     # prints one JSON line

WORKLOAD: ``enqueue`` (enqueue_many of N 100-byte payloads, due now), ``enqueue_quiet``
(the same with the queue's events off: the events' cost by difference), ``lifecycle`` (a
Worker drains N pending jobs with a no-op handler: claim + start + complete), ``promote``
(N due delayed jobs moved to pending by ``Queue.promote``), ``promote_due`` (the same, N
jobs due at one instant, as ``bench.promote``'s 1M workload times it). The JSON holds the timed
region's wall seconds, this process's CPU seconds and the server's CPU deltas
(``INFO cpu`` and ``INFO commandstats``), measured here around that region only.
"""
from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any, Callable, Dict, List

import redis

PAYLOAD = 100


def server_cpu(client: redis.Redis) -> Dict[str, float]:
    """The server process's CPU seconds and the commandstats µs of scripts / all commands."""
    cpu = client.info("cpu")
    stats = client.info("commandstats")
    script_us = sum(float(v["usec"]) for k, v in stats.items()
                    if k in ("cmdstat_evalsha", "cmdstat_eval"))
    return {"process_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            "script_us": script_us,
            "script_calls": sum(float(v["calls"]) for k, v in stats.items()
                                if k in ("cmdstat_evalsha", "cmdstat_eval"))}


def measured(client: redis.Redis, body: Callable[[], Any]) -> Dict[str, float]:
    """Run ``body`` once; wall/client CPU seconds and the server's deltas over it."""
    before, p0, t0 = server_cpu(client), time.process_time(), time.perf_counter()
    body()
    wall, proc = time.perf_counter() - t0, time.process_time() - p0
    after = server_cpu(client)
    return {"wall_s": wall, "client_cpu_s": proc,
            **{k: after[k] - before[k] for k in before}}


def data(n: int) -> List[bytes]:
    return [f"{i:0{PAYLOAD}d}".encode()[-PAYLOAD:] for i in range(n)]


def enqueue(q: Any, n: int) -> Dict[str, float]:
    payloads = data(n)
    out = measured(q.redis, lambda: q.enqueue_many(payloads))
    assert q.redis.zcard(q.keys.pending) == n, "not every job landed"
    return out


def enqueue_quiet(q: Any, n: int) -> Dict[str, float]:
    """enqueue with the queue's events turned off: what the events cost, by difference."""
    q.configure_events(0)
    return enqueue(q, n)


def lifecycle(q: Any, n: int) -> Dict[str, float]:
    import emqfast
    q.enqueue_many(data(n))
    w = emqfast.Worker(q, lambda job: None, keep_completed=n + 1)
    out = measured(q.redis, lambda: w.run_until_idle(timeout_s=max(60.0, n / 500)))
    assert q.redis.zcard(q.keys.completed) == n, "not every job completed"
    return out


def promote(q: Any, n: int) -> Dict[str, float]:
    q.enqueue_many(data(n), delay_ms=50)
    time.sleep(0.1)  # every job due: what is timed is the move, not the wait
    return _promote_every_job(q, n, limit=min(100_000, n))


def _promote_every_job(q: Any, n: int, limit: int) -> Dict[str, float]:
    """Server cost of ``Queue.promote(limit=limit)`` calls until none moves a job; checks
    that all ``n`` parked jobs were released."""
    moved = [0]

    def body() -> None:
        while True:
            got = q.promote(limit=limit)
            if not got:
                break
            moved[0] += got
    out = measured(q.redis, body)
    assert moved[0] == n and q.redis.zcard(q.keys.pending) == n, "not every job promoted"
    return out


def promote_due(q: Any, n: int) -> Dict[str, float]:
    """``bench.promote``'s big workload: N jobs parked due at one instant (as a backlog of
    one schedule falls due), released by ``Queue.promote`` 10,000 per call."""
    def now_ms() -> int:
        seconds, micros = q.redis.time()
        return seconds * 1000 + micros // 1000
    run_at = now_ms() + 2_000 + n // 20  # every job parked before the first is due
    payloads = data(min(n, 50_000))
    for start in range(0, n, 50_000):
        q.enqueue_many(payloads[:min(50_000, n - start)], run_at_ms=run_at)
    assert q.redis.zcard(q.keys.delayed) == n, "jobs fell due while parking"
    while now_ms() <= run_at:
        time.sleep(0.05)
    return _promote_every_job(q, n, limit=10_000)


WORKLOADS = {"enqueue": enqueue, "enqueue_quiet": enqueue_quiet, "lifecycle": lifecycle,
             "promote": promote, "promote_due": promote_due}


def main(argv: List[str]) -> None:
    import emqfast
    url, workload, n = argv[0], argv[1], int(argv[2])
    client = redis.Redis.from_url(url)
    q = emqfast.Queue(f"bench-server-{uuid.uuid4().hex[:8]}", client)
    try:
        out = WORKLOADS[workload](q, n)
    finally:
        q.obliterate()
    out["backend"] = emqfast.backend()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
