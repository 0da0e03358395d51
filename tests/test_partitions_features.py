"""Features a user relies on, on a partitioned queue (standalone and the 3-master
Cluster): waiting for results, delays and retries run by a Worker, the events stream,
cancelling a running job, a group's cap, dependencies between jobs of two partitions."""
from __future__ import annotations

import threading
from typing import List

import pytest

import emqfast
from emqfast import Backoff, JobFailed, Queue, Worker

from partition_fixtures import client, cluster  # noqa: F401 (fixtures)
from waiting import wait_until




def test_results_are_waited_for_in_every_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    refs = q.enqueue_many([{"n": i} for i in range(6)])
    bad = q.enqueue({"n": -1}, attempts=1)
    w = Worker(q, lambda job: job.payload["n"] * 10 if job.payload["n"] >= 0
               else 1 / 0)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert q.wait_many(refs, timeout_s=30) == [i * 10 for i in range(6)]
        assert q.ref(refs[4].id).wait(timeout_s=10) == 40
        with pytest.raises(JobFailed):
            bad.wait(timeout_s=30)
    finally:
        w.stop()
        t.join(30)


def test_delays_and_retries_run_in_their_partitions(client, qname):
    q = Queue(qname, client, partitions=3)
    tries: List[int] = []

    def flaky(job: emqfast.Job) -> str:
        if job.payload == "flaky":
            tries.append(job.attempts)
            if job.attempts == 1:
                raise RuntimeError("once")
        return "ok"
    q.enqueue("later", delay_ms=50)
    q.enqueue("flaky", attempts=3, backoff=Backoff.fixed(20), partition_key="k")
    stats = Worker(q, flaky).run_until_idle(timeout_s=60, wait_scheduled=True)
    assert stats.completed == 2 and stats.retried == 1 and tries == [1, 2]
    assert q.counts()["completed"] == 2


def test_the_events_stream_covers_every_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    refs = q.enqueue_many(list(range(9)))
    Worker(q, lambda job: None).run_until_idle(timeout_s=60)
    done = {e.job_id for e in q.events() if e.name == "completed"}
    assert done == {r.id for r in refs}
    assert {e.fields["partition"] for e in q.read_events(count=1000)} == {"0", "1", "2"}
    last = q.last_event_id()
    assert q.read_events(last) == []


def test_cancelling_a_running_job_reaches_its_worker(client, qname):
    q = Queue(qname, client, partitions=3)
    started = threading.Event()

    def slow(job: emqfast.Job) -> None:
        started.set()
        pause = threading.Event()
        while not job.cancelled:  # a handler polling its cancel flag between steps
            pause.wait(0.02)
    ref = q.enqueue("slow", partition_key="k2")
    w = Worker(q, slow)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert started.wait(30)
        assert q.cancel(ref.id) == "requested"
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "the job to end cancelled")
    finally:
        w.stop()
        t.join(30)


def test_a_groups_cap_holds_over_the_partitions(client, qname):
    q = Queue(qname, client, partitions=3)
    q.groups.set_concurrency("tenant", 1)
    q.enqueue_many([{"g": i} for i in range(6)], group="tenant")
    q.enqueue_many([{"i": i} for i in range(6)])
    lock = threading.Lock()
    running: List[int] = [0, 0]  # now, most at once, for the group's jobs

    def handler(job: emqfast.Job) -> None:
        if "g" not in job.payload:
            return
        with lock:
            running[0] += 1
            running[1] = max(running)
        threading.Event().wait(0.01)  # a little work, so overlaps could show
        with lock:
            running[0] -= 1
    stats = Worker(q, handler, concurrency=4).run_until_idle(timeout_s=60)
    assert stats.completed == 12 and running[1] == 1


def test_a_job_depends_on_a_job_of_another_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    first = q.enqueue({"step": 1}, partition_key="a")
    second = q.enqueue({"step": 2}, partition_key="b", depends_on=[first])
    order: List[int] = []
    Worker(q, lambda job: order.append(job.payload["step"])).run_until_idle(timeout_s=60)
    assert order == [1, 2]
    assert q.get(second.id).state == "completed"
