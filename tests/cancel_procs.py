"""Worker processes for the cancel contract (run as a script by tests/test_cancel_running.py
and bench/cancel_latency.py).

    python tests/cancel_procs.py thread|aio URL QUEUE KEYS_PREFIX

The handler counts its runs (``HINCRBY <prefix>:runs <id> 1``), marks its start
(``HSET <prefix>:started <id> <wall s>``), then by the payload's ``"do"``:

- ``"poll"``: waits until ``job.cancelled`` (aio: sleeps until its task is cancelled),
  records when it saw it (``HSET <prefix>:seen <id> <wall s>``) and raises;
- ``"swallow"``: as ``poll``, but returns ``"done anyway"`` instead of raising;
- anything else: returns the payload at once.

``<prefix>:ready`` is set once the Worker's cancel listener is subscribed. SIGTERM stops
the worker gracefully.
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


def thread_worker(url: str, queue: str, prefix: str) -> None:
    r = redis.Redis.from_url(url)
    q = emqfast.Queue(queue, emqfast.connect(url))

    def handler(job):
        r.hincrby(prefix + ":runs", job.id, 1)
        r.hset(prefix + ":started", job.id, time.time())
        what = job.payload.get("do") if isinstance(job.payload, dict) else None
        if what not in ("poll", "swallow"):
            return job.payload
        while not job.cancelled:
            time.sleep(0.0005)
        r.hset(prefix + ":seen", job.id, time.time())
        if what == "swallow":
            return "done anyway"
        job.raise_if_cancelled()

    w = emqfast.Worker(q, handler, concurrency=4, lease_ms=4000, shutdown_timeout_s=5)

    def ready() -> None:
        if w._listener is not None and w._listener.subscribed.is_set():
            r.set(prefix + ":ready", 1)
    w.beat_hooks.append(ready)
    w.run()


def aio_worker(url: str, queue: str, prefix: str) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis.from_url(url)
        q = emq_aio.Queue(queue, emq_aio.connect(url))

        async def handler(job):
            await r.hincrby(prefix + ":runs", job.id, 1)
            await r.hset(prefix + ":started", job.id, time.time())
            what = job.payload.get("do") if isinstance(job.payload, dict) else None
            if what not in ("poll", "swallow"):
                return job.payload
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                seen = time.time()
                await asyncio.shield(r.hset(prefix + ":seen", job.id, seen))
                if what == "swallow":
                    return "done anyway"
                raise

        w = emq_aio.Worker(q, handler, concurrency=4, lease_ms=4000, shutdown_timeout_s=5)

        async def ready() -> None:
            if w.cancel_listening is not None and w.cancel_listening.is_set():
                await r.set(prefix + ":ready", 1)
        w.beat_hooks.append(ready)
        await w.run()
    asyncio.run(main())


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"thread": thread_worker, "aio": aio_worker}[mode](*args)
