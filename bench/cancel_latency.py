"""Cancel latency across processes: a Worker process runs a long handler, this
process calls ``q.cancel(id)``; how long until the handler sees it? Target: p99 <= 100 ms.

    python bench/cancel_latency.py [redis://localhost:6379/0] [--n 200]

For the thread Worker (a sync handler polling ``job.cancelled`` every 0.5 ms) and the
asyncio Worker (a coroutine whose task is cancelled). Both clocks are this host's wall
clock (``time.time()`` in each process). Each round: enqueue, wait for the handler to
start, cancel, wait for the handler to record when it saw the cancel.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from typing import List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

import emqfast  # noqa: E402
import emqfast.aio  # noqa: E402

TARGET_P99_MS = 100.0


def _thread_worker(url: str, queue: str, prefix: str) -> None:
    r = redis.Redis.from_url(url)

    def handler(job: emqfast.Job) -> None:
        r.hset(prefix + ":started", job.id, time.time())
        while not job.cancelled:
            time.sleep(0.0005)
        r.hset(prefix + ":seen", job.id, time.time())
        job.raise_if_cancelled()

    emqfast.Worker(emqfast.Queue(queue, emqfast.connect(url)), handler).run()


def _aio_worker(url: str, queue: str, prefix: str) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis.from_url(url)

        async def handler(job: emqfast.Job) -> None:
            await r.hset(prefix + ":started", job.id, time.time())
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                await asyncio.shield(r.hset(prefix + ":seen", job.id, time.time()))
                raise
        q = emqfast.aio.Queue(queue, emqfast.aio.connect(url))
        await emqfast.aio.Worker(q, handler).run()
    asyncio.run(main())


def _wait(fn, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.0005)
    raise TimeoutError("the worker did not answer in time")


def percentile(values: List[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, int(round(p / 100 * len(ordered) + 0.5)) - 1))]


def measure(url: str, mode: str, n: int) -> List[float]:
    """``n`` cancel -> handler-saw-it delays (ms) against a ``mode`` Worker process."""
    queue, prefix = f"bench-cancel-{uuid.uuid4().hex[:8]}", f"bench:cancel:{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(url)
    q = emqfast.Queue(queue, emqfast.connect(url))
    proc = subprocess.Popen([sys.executable, __file__, "--worker", mode, url, queue, prefix])
    delays = []
    try:
        warm = q.enqueue("warm-up")  # the listener subscribes at the worker's start
        _wait(lambda: r.hget(prefix + ":started", warm.id))
        time.sleep(0.2)
        q.cancel(warm.id)
        for _ in range(n):
            ref = q.enqueue("x")
            _wait(lambda: r.hget(prefix + ":started", ref.id))
            asked = time.time()
            q.cancel(ref.id)
            seen = float(_wait(lambda: r.hget(prefix + ":seen", ref.id)))
            delays.append((seen - asked) * 1000)
    finally:
        proc.terminate()
        proc.wait(30)
        q.obliterate()
        r.delete(prefix + ":started", prefix + ":seen")
    return delays


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        mode, url, queue, prefix = sys.argv[2:6]
        (_thread_worker if mode == "thread" else _aio_worker)(url, queue, prefix)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="redis://localhost:6379/0")
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    for mode in ("thread", "aio"):
        d = measure(args.url, mode, args.n)
        p99 = percentile(d, 99)
        print(f"{mode:6s} worker: cancel -> handler saw it: p50 {percentile(d, 50):.2f} ms, "
              f"p99 {p99:.2f} ms, max {max(d):.2f} ms over {len(d)} cancels "
              f"({'OK' if p99 <= TARGET_P99_MS else 'OVER'} the {TARGET_P99_MS:.0f} ms target)")


if __name__ == "__main__":
    main()
