"""A Worker over many queues holds about as many connections as one over a few: one
blocking connection waits on every queue's marker, one pub/sub connection hears every
queue's cancels, and its claim loops' requests pass a gate of a few at a time, so a
client's pool (redis-py: 100 connections) serves hundreds of queues."""
from __future__ import annotations

import threading

import pytest

import emqfast
from emqfast import Queue, Worker
from waiting import wait_until

N_QUEUES = 120  # more than a redis-py pool holds: one connection per queue cannot work


def _peak_clients(r, stop: threading.Event, peak: list) -> None:
    while not stop.is_set():
        peak.append(int(r.info("clients")["connected_clients"]))
        stop.wait(0.02)


def test_a_worker_over_more_queues_than_a_pool_holds_serves_them_all(redis_url, qname, r):
    conn = emqfast.connect(redis_url)
    queues = [Queue(f"{qname}-{i}", conn) for i in range(N_QUEUES)]
    refs = [(q, q.enqueue(i)) for i, q in enumerate(queues)]
    before = int(r.info("clients")["connected_clients"])
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=_peak_clients, args=(r, stop, peak), daemon=True)
    watcher.start()
    try:
        stats = Worker(queues, lambda job: job.payload).run_until_idle(timeout_s=120)
    finally:
        stop.set()
        watcher.join(5)
    assert stats.completed == N_QUEUES
    assert all(q.get(ref.id).result == i for i, (q, ref) in enumerate(refs))
    # a queue's own marker wait and listener would be 2 x 120 connections at least
    assert max(peak) - before < N_QUEUES, (max(peak), before)


def test_a_serving_worker_over_many_queues_waits_on_one_connection_and_hears_cancels(
        redis_url, qname, r):
    conn = emqfast.connect(redis_url)
    queues = [Queue(f"{qname}-{i}", conn) for i in range(60)]
    gate = threading.Event()
    seen = []

    def handler(job):
        seen.append(job.id)
        while not job.cancelled and not gate.wait(0.01):
            pass
        job.raise_if_cancelled()
        return "done"

    w = Worker(queues, handler, order="weighted")
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: r.pubsub_numsub(queues[-1].keys.cancel_channel)[0][1] == 1, 30,
                   "the listener subscribed")
        # one pub/sub connection carries every queue's cancel channel
        assert all(n == 1 for _, n in r.pubsub_numsub(*[q.keys.cancel_channel for q in queues]))
        assert len(r.client_list(_type="pubsub")) == 1
        last, first = queues[-1], queues[0]
        ref = last.enqueue("x")  # wakes its claim loop through the one shared marker wait
        wait_until(lambda: ref.id in seen, 30, "the last queue's job running")
        assert last.cancel(ref.id) == "requested"
        wait_until(lambda: last.get(ref.id).state == "cancelled", 30, "cancel routed to it")
        # a job of the same id on another queue is not touched by that cancel
        twin = first.enqueue("y", job_id=ref.id)
        wait_until(lambda: seen.count(ref.id) == 2, 30, "the twin running")
        gate.set()
        wait_until(lambda: first.get(twin.id).state == "completed", 30, "the twin completed")
    finally:
        gate.set()
        w.stop()
        t.join(30)
    assert not t.is_alive()


def test_an_aio_worker_over_more_queues_than_a_pool_holds_serves_them_all(redis_url, qname,
                                                                          r):
    import asyncio

    import emqfast.aio

    n = 130  # past the 100 connections of a default pool
    names = [f"{qname}-{i}" for i in range(n)]
    seed = emqfast.connect(redis_url)
    refs = [(name, Queue(name, seed).enqueue(i).id) for i, name in enumerate(names)]
    before = int(r.info("clients")["connected_clients"])
    stop, peak = threading.Event(), []
    watcher = threading.Thread(target=_peak_clients, args=(r, stop, peak), daemon=True)
    watcher.start()

    async def main():
        conn = emqfast.aio.connect(redis_url)
        queues = [emqfast.aio.Queue(name, conn) for name in names]
        return await emqfast.aio.Worker(queues, lambda job: job.payload).run_until_idle(
            timeout_s=120)
    try:
        stats = asyncio.run(main())
    finally:
        stop.set()
        watcher.join(5)
    assert stats.completed == n
    assert all(Queue(name, seed).get(job_id).result == i
               for i, (name, job_id) in enumerate(refs))
    assert max(peak) - before < 60, (max(peak), before)


@pytest.mark.parametrize("order", ["strict", "weighted"])
def test_a_serving_worker_over_many_queues_runs_work_of_its_lowest_queue(redis_url, qname,
                                                                         order):
    """Idle queues waking for their beats must not keep the lowest queue from claiming."""
    conn = emqfast.connect(redis_url)
    queues = [Queue(f"{qname}-{i}", conn) for i in range(N_QUEUES)]
    w = Worker(queues, lambda job: "done", order=order)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        wait_until(lambda: all(m._waiter is not None for m in w.members), 30, "all serving")
        for q in (queues[-1], queues[0], queues[N_QUEUES // 2]):
            ref = q.enqueue("x")
            wait_until(lambda: q.get(ref.id).state == "completed", 30, f"{q.name}'s job run")
    finally:
        w.stop()
        t.join(30)
    assert not t.is_alive()
