"""A Worker that stops takes its heartbeat record with it: it leaves the dashboard's Workers
page at once instead of lingering until the record expires, and a stopped worker's queue
holds no key that changes by itself afterwards."""
from __future__ import annotations

import asyncio

import emqfast
import emqfast.aio as emq
from engine_util import make_queue


def _worker_keys(r, q):
    return sorted(k for k in r.scan_iter(match=q.keys.base + "worker*"))


def test_a_stopped_thread_worker_leaves_no_heartbeat(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(5)))
    w = emqfast.Worker(q, lambda job: None)
    w.run_until_idle(timeout_s=30)
    assert _worker_keys(r, q) == []


def test_a_stopped_aio_worker_leaves_no_heartbeat(redis_url, qname, r):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(5)))

        async def handler(job):
            return None
        await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        await q.aclose()
        return q
    q = asyncio.run(main())
    assert _worker_keys(r, q) == []
