"""Processes for the dependency race (run as a script by tests/test_deps_race.py).

    python tests/deps_procs.py produce URL QA QB TAG GROUPS
    python tests/deps_procs.py thread|aio URL QUEUE TAG

``produce``: GROUPS times, enqueue three roots on QA, a job on QB depending on them, and a
job on QA depending on that one (a cross-queue chain); each dependent's dependencies go in
``HSET <TAG>:deps <id> <dep,dep,...>``. Workers log ``s:<id>`` when a handler begins and
``e:<id>`` when it ends (``RPUSH <TAG>:log``), so the order of runs is the list's order.
Workers set ``<TAG>:ready:<name>`` once serving and stop gracefully on SIGTERM.
"""
from __future__ import annotations

import asyncio
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

import emqfast  # noqa: E402
import emqfast.aio as emq_aio  # noqa: E402


def produce(url: str, qa: str, qb: str, tag: str, groups: str) -> None:
    r = redis.Redis.from_url(url)
    a, b = emqfast.Queue(qa, emqfast.connect(url)), emqfast.Queue(qb, emqfast.connect(url))
    for g in range(int(groups)):
        roots = [a.enqueue({"g": g, "k": k}) for k in range(3)]
        mid = b.enqueue({"g": g}, depends_on=[(qa, ref.id) for ref in roots])
        last = a.enqueue({"g": g, "last": True}, depends_on=[(qb, mid.id)])
        r.hset(tag + ":deps", mapping={mid.id: ",".join(ref.id for ref in roots),
                                       last.id: mid.id})
        r.rpush(tag + ":produced", *(ref.id for ref in roots), mid.id, last.id)


def thread_worker(url: str, queue: str, tag: str) -> None:
    r = redis.Redis.from_url(url)
    q = emqfast.Queue(queue, emqfast.connect(url))

    def handler(job):
        r.rpush(tag + ":log", "s:" + job.id)
        time.sleep(random.random() / 500)
        r.rpush(tag + ":log", "e:" + job.id)

    w = emqfast.Worker(q, handler, concurrency=4, lease_ms=10_000, keep_completed=10**6,
                       shutdown_timeout_s=5)
    w.beat_hooks.append(lambda: r.set(tag + ":ready:" + w.name, 1))
    w.run()


def aio_worker(url: str, queue: str, tag: str) -> None:
    async def main() -> None:
        r = redis.asyncio.Redis.from_url(url)
        q = emq_aio.Queue(queue, emq_aio.connect(url))

        async def handler(job):
            await r.rpush(tag + ":log", "s:" + job.id)
            await asyncio.sleep(random.random() / 500)
            await r.rpush(tag + ":log", "e:" + job.id)

        w = emq_aio.Worker(q, handler, concurrency=4, lease_ms=10_000, keep_completed=10**6,
                           shutdown_timeout_s=5)
        w.beat_hooks.append(lambda: r.set(tag + ":ready:" + w.name, 1))
        await w.run()
    asyncio.run(main())


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    {"produce": produce, "thread": thread_worker, "aio": aio_worker}[mode](*args)
