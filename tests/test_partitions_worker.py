"""A Worker over a partitioned queue: it serves the partitions in rotation (an urgent job
waits at most one rotation), picks a subset for affinity, and drains a queue spread over
the real 3-master Cluster exactly once per job."""
from __future__ import annotations

import threading
from typing import List

import pytest

import emqfast
from emqfast import Queue, Worker

from partition_fixtures import client, cluster  # noqa: F401 (fixtures)
from waiting import wait_until




def _keys_per_partition(q: Queue) -> List[str]:
    """One partition_key landing in each partition, in partition order."""
    found = {}
    i = 0
    while len(found) < q.partitions:
        key = f"k{i}"
        found.setdefault(q.partition_for(key), key)
        i += 1
    return [found[p] for p in range(q.partitions)]


@pytest.mark.parametrize("partitions", [3, 5])
def test_an_urgent_job_waits_at_most_one_rotation(client, qname, partitions):
    """Every partition full of low-priority jobs; an urgent job enqueued while the first
    one runs starts after at most P jobs (concurrency 1, no prefetch)."""
    q = Queue(qname, client, partitions=partitions)
    keys = _keys_per_partition(q)
    for key in keys:
        q.enqueue_many([{"low": key}] * 10, partition_key=key, priority=100)
    order: List[str] = []
    lock = threading.Lock()

    def handler(job: emqfast.Job) -> None:
        with lock:
            order.append(job.id)
            first = len(order) == 1
        if first:  # lands in the partition served last in this rotation, or any
            urgent.append(q.enqueue({"urgent": True}, partition_key=keys[-1], priority=0).id)

    urgent: List[str] = []
    stats = Worker(q, handler, concurrency=1, prefetch=0).run_until_idle(timeout_s=60)
    assert stats.completed == 10 * partitions + 1
    at = order.index(urgent[0])
    assert at <= partitions, f"urgent job ran as #{at} of {order[:at + 1]}"


def test_rotation_serves_every_partition_alike(client, qname):
    """With every partition full, the jobs run in rounds over the partitions: after any
    3 * P jobs each partition has run at least twice."""
    q = Queue(qname, client, partitions=3)
    keys = _keys_per_partition(q)
    holder = {}
    for p, key in enumerate(keys):
        for ref in q.enqueue_many([p] * 20, partition_key=key):
            holder[ref.id] = p
    ran: List[int] = []
    Worker(q, lambda job: ran.append(job.payload), concurrency=1,
           prefetch=0).run_until_idle(timeout_s=60)
    assert len(ran) == 60
    head = ran[:9]
    assert all(head.count(p) >= 2 for p in range(3)), head


def test_a_running_worker_wakes_for_any_partition(client, qname):
    """An idle Worker blocked on the partitions' wake markers runs a job enqueued to any
    partition (no polling: it wakes on the marker)."""
    q = Queue(qname, client, partitions=4)
    keys = _keys_per_partition(q)
    done: List[str] = []
    w = Worker(q, lambda job: done.append(job.payload), concurrency=2)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        for key in keys:
            q.enqueue(key, partition_key=key)
        wait_until(lambda: sorted(done) == sorted(keys), 30, "a job of every partition to run")
    finally:
        w.stop()
        t.join(30)
    assert not t.is_alive()


def test_two_workers_with_disjoint_partitions_split_the_queue(client, qname):
    q = Queue(qname, client, partitions=4)
    keys = _keys_per_partition(q)
    for key in keys:
        q.enqueue_many([key] * 5, partition_key=key)
    a: List[str] = []
    b: List[str] = []
    Worker(q, lambda job: a.append(job.payload), partitions=[0, 1]).run_until_idle(timeout_s=30)
    Worker(q, lambda job: b.append(job.payload), partitions=[2, 3]).run_until_idle(timeout_s=30)
    assert sorted(set(a)) == sorted(keys[:2]) and sorted(set(b)) == sorted(keys[2:])
    assert len(a) == len(b) == 10
    assert q.counts()["completed"] == 20
