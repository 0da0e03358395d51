"""Worker processes for the pause contract (run as a script by tests/test_pause_strict.py).

    python tests/pause_procs.py thread|aio URL QUEUE BEGINS_KEY READY_KEY

Each runs a Worker whose handler records, per job, the server time (ms) its handler
began (``HSET BEGINS_KEY <id> <ms>``) and counts its runs (``HINCRBY BEGINS_KEY:runs``),
then works for 20 ms. ``thread``: concurrency 2 with 20 prefetched jobs; ``aio``:
concurrency 4. The worker stops gracefully on SIGTERM; it sets READY_KEY once serving.
"""
from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

import emqfast  # noqa: E402
import emqfast.aio as emq_aio  # noqa: E402


def _server_ms(r: redis.Redis) -> int:
    sec, usec = r.time()
    return sec * 1000 + usec // 1000


def thread_worker(url: str, queue: str, begins: str, ready: str) -> None:
    r = redis.Redis.from_url(url)
    q = emqfast.Queue(queue, emqfast.connect(url))

    def handler(job):
        r.hset(begins, job.id, _server_ms(r))
        r.hincrby(begins + ":runs", job.id, 1)
        time.sleep(0.02)

    w = emqfast.Worker(q, handler, concurrency=2, prefetch=20, lease_ms=5000,
                       keep_completed=10**6, shutdown_timeout_s=5)
    w.beat_hooks.append(lambda: r.set(ready + ":" + w.name, 1))
    w.run()


def aio_worker(url: str, queue: str, begins: str, ready: str) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis.from_url(url)
        q = emq_aio.Queue(queue, emq_aio.connect(url))

        async def handler(job):
            sec, usec = await r.time()
            await r.hset(begins, job.id, sec * 1000 + usec // 1000)
            await r.hincrby(begins + ":runs", job.id, 1)
            await asyncio.sleep(0.02)

        w = emq_aio.Worker(q, handler, concurrency=4, lease_ms=5000, keep_completed=10**6,
                           shutdown_timeout_s=5)
        w.beat_hooks.append(lambda: r.set(ready + ":" + w.name, 1))
        await w.run()
    asyncio.run(main())


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"thread": thread_worker, "aio": aio_worker}[mode](*args)
