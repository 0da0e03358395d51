"""On a real Redis Cluster, a cancel published on the queue's master reaches the
Worker's listener (subscribed on whichever node: cluster pub/sub is broadcast), for queues
on every master, with the thread and the asyncio Worker; a timeout ends a run there too."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

import emqfast
import emqfast.aio as emq_aio
from cluster_util import names_over_masters, start_cluster
from waiting import wait_until, wait_until_async


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def _polling_handler(running: threading.Event):
    def poll(job):
        if job.payload == "x":
            running.set()
        while not job.cancelled:
            time.sleep(0.001)
        job.raise_if_cancelled()
    return poll


def test_thread_worker_hears_cancels_on_every_master(cluster, qname):
    for name in names_over_masters(cluster, 1, qname):
        q = emqfast.Queue(name, emqfast.connect(cluster.url))
        running = threading.Event()
        w = emqfast.Worker(q, _polling_handler(running))
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        try:
            ref = q.enqueue("x", attempts=3)
            slow = q.enqueue("slow", timeout_ms=50, attempts=1)
            # "active" alone also covers a job claimed but still waiting for a handler
            # slot, which a cancel ends at once (True): wait for the handler itself
            assert running.wait(30), "handler running"
            asked = time.monotonic()
            assert q.cancel(ref.id) == "requested"
            wait_until(lambda: q.get(ref.id).state == "cancelled", 30, f"cancelled on {name}")
            print(f"{name}: cancel -> cancelled in {(time.monotonic() - asked) * 1000:.1f} ms")
            wait_until(lambda: q.get(slow.id).state == "failed", 30, f"timed out on {name}")
        finally:
            w.stop()
            t.join(30)
        assert q.get(ref.id).attempts == 1 and q.job_ids("cancelled") == [ref.id]
        assert q.get(slow.id).error.startswith("JobTimeout: timeout")


def test_aio_worker_hears_cancels_on_every_master(cluster, qname):
    names = names_over_masters(cluster, 1, qname)

    async def main():
        client = emq_aio.connect(cluster.url)
        out = {}
        try:
            for name in names:
                q = emq_aio.Queue(name, client)

                running = asyncio.Event()

                async def handler(job, running=running):
                    running.set()
                    await asyncio.sleep(600)

                w = emq_aio.Worker(q, handler)
                task = asyncio.ensure_future(w.run())
                ref = await q.enqueue("x", attempts=3)

                async def state(want, job_id=ref.id, q=q):
                    return (await q.get(job_id)).state == want
                await asyncio.wait_for(running.wait(), 30)  # the handler, not only the claim
                assert await q.cancel(ref.id) == "requested"
                await wait_until_async(lambda: state("cancelled"), 30, f"cancelled on {name}")
                w.stop()
                await task
                out[name] = ((await q.get(ref.id)).attempts, await q.job_ids("cancelled"))
                assert out[name] == (1, [ref.id])
        finally:
            await client.aclose()
        return out
    assert len(asyncio.run(asyncio.wait_for(main(), 120))) == len(names)
