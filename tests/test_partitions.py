"""Partitioned queues: one logical queue over P partitions (``Queue(name, conn,
partitions=P)``), on a standalone server and on the real 3-master Cluster: placement,
order within a partition, the layout fence, and the logical views."""
from __future__ import annotations

import asyncio
from typing import Any, Dict, List

import pytest
import redis
from redis.crc import key_slot

import emqfast
import emqfast.aio
from emqfast import PartitionMismatch, Queue, VersionMismatch, Worker
from emqfast.core.keys import partition_names, partition_of
from emqfast.core.errors import InvalidInput, JobNotFound, RangeError
from emqfast.facade.partitioned import PartitionedQueue

from partition_fixtures import client, cluster  # noqa: F401 (fixtures)




def _holders(q: PartitionedQueue) -> Dict[str, int]:
    """Job id -> partition holding it (pending ids, read per partition)."""
    return {j: i for i, part in enumerate(q.partition_queues) for j in part.job_ids("pending")}


def test_a_partitioned_queue_is_a_queue_with_its_own_type(client, qname):
    q = Queue(qname, client, partitions=4)
    assert isinstance(q, Queue) and isinstance(q, PartitionedQueue)
    assert q.partitions == 4 and len(q.partition_queues) == 4
    assert [p.name for p in q.partition_queues] == list(partition_names(qname, 4))
    assert type(Queue(qname, client)) is Queue


def test_round_robin_spreads_jobs_and_counts_are_logical(client, qname):
    q = Queue(qname, client, partitions=3)
    refs = q.enqueue_many([{"n": i} for i in range(30)])
    one = [q.enqueue(i) for i in range(6)]
    assert q.counts()["pending"] == 36
    per = [c["pending"] for c in q.partition_counts()]
    assert sum(per) == 36 and min(per) >= 10, per
    job = q.get(refs[7].id)
    assert job is not None and job.payload == {"n": 7}
    assert q.get(one[-1].id).payload == 5
    assert q.get("JOBnope") is None


def test_same_partition_key_same_partition_in_order(client, qname):
    q = Queue(qname, client, partitions=5)
    refs = [q.enqueue(i, partition_key="user-42") for i in range(20)]
    many = q.enqueue_many(list(range(20, 30)), partition_key="user-42")
    holders = _holders(q)
    want = partition_of("user-42", 5)
    assert {holders[r.id] for r in refs + many} == {want}
    assert q.partition(want).job_ids("pending") == [r.id for r in refs + many]
    keyed = q.enqueue_many(["a", "b", "c"], partition_keys=["k1", None, "k1"])
    holders = _holders(q)
    assert holders[keyed[0].id] == holders[keyed[2].id] == partition_of("k1", 5)


def test_priority_orders_within_a_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    low = q.enqueue("low", partition_key="k", priority=5)
    high = q.enqueue("high", partition_key="k", priority=0)
    part = q.partition(q.partition_for("k"))
    assert part.job_ids("pending") == [high.id, low.id]


def test_groups_and_dedupe_keys_live_in_one_partition(client, qname):
    q = Queue(qname, client, partitions=4)
    grouped = [q.enqueue(i, group="tenant-1") for i in range(5)]
    grouped += q.enqueue_many([5, 6], group="tenant-1")
    part = q.partition(q.partition_for("tenant-1"))
    assert all(part.get(r.id) is not None for r in grouped)
    q.groups.set_concurrency("tenant-1", 2)
    assert q.groups.concurrency("tenant-1") == 2
    assert part.groups.concurrency("tenant-1") == 2
    assert q.groups.list() == ["tenant-1"]
    first = q.enqueue("a", dedupe_key="order-9")
    second = q.enqueue("b", dedupe_key="order-9")
    assert second.status == "deduplicated"
    many = q.enqueue_many(["c", "d"], dedupe_keys=["order-9", "order-10"])
    assert many[0].status == "deduplicated" and many[1].status == "pending"
    assert q.get(first.id).payload == "a"
    with pytest.raises(InvalidInput):
        q.enqueue("x", group="g", partition_key="k")
    with pytest.raises(InvalidInput):
        q.enqueue("x", dedupe_key="d", partition_key="k")


def test_another_number_of_partitions_is_refused_before_any_write(client, qname):
    q = Queue(qname, client, partitions=3)
    q.enqueue("x")
    other = Queue(qname, client, partitions=4)
    with pytest.raises(PartitionMismatch) as err:
        other.enqueue("y")
    assert isinstance(err.value, VersionMismatch)
    assert "partitions=3" in str(err.value) and "partitions=4" in str(err.value)
    assert "drain and switch" in str(err.value)
    for part in other.partition_queues:  # nothing of the refused layout was written
        assert not client.exists(part.keys.meta)
    with pytest.raises(PartitionMismatch):  # a Worker too, before it serves
        Worker(other, lambda job: None)
    with pytest.raises(PartitionMismatch):  # and a read: it would count the wrong keys
        Queue(qname, client, partitions=4).counts()
    assert q.counts()["pending"] == 1


def test_plain_and_partitioned_never_share_a_name(client, qname):
    Queue(qname, client, partitions=2).enqueue("x")
    with pytest.raises(PartitionMismatch, match="partitioned"):
        Queue(qname, client).enqueue("y")
    with pytest.raises(PartitionMismatch):
        Queue(qname, client).enqueue_many(["y", "z"])
    plain = qname + "-plain"
    Queue(plain, client).enqueue("x")
    with pytest.raises(PartitionMismatch, match="plain"):
        Queue(plain, client, partitions=2).enqueue("y")
    assert Queue(plain, client).counts()["pending"] == 1


def test_bad_partition_counts_and_names_are_typed_errors(client, qname):
    for bad in (0, 1025, -1):
        with pytest.raises(RangeError):
            Queue(qname, client, partitions=bad)
    with pytest.raises(InvalidInput):
        Queue(qname, client, partitions="3")
    with pytest.raises(InvalidInput):
        Queue(qname + "#1", client, partitions=2)
    q = Queue(qname, client, partitions=2)
    with pytest.raises(RangeError):
        q.partition(2)


def test_by_id_writes_find_the_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    refs = q.enqueue_many(list(range(6)))
    assert q.cancel(refs[4].id) is True
    assert q.get(refs[4].id).state == "cancelled"
    assert q.delete(refs[5].id) is True
    assert q.get(refs[5].id) is None
    with pytest.raises(JobNotFound):
        q.cancel("JOBmissing")
    later = q.enqueue("later", delay_ms=60_000)
    assert q.counts()["scheduled"] == 1
    assert q.next_due_ms() is not None
    assert q.promote_job(later.id) is True
    assert q.counts()["scheduled"] == 0


def test_pause_resume_and_rate_limits_cover_every_partition(client, qname):
    q = Queue(qname, client, partitions=3)
    q.pause()
    assert q.is_paused() and all(p.is_paused() for p in q.partition_queues)
    q.enqueue_many(list(range(6)))
    assert q.counts()["pending"] == 6  # a paused queue still accepts jobs
    q.resume()
    assert not q.is_paused()
    q.set_rate_limit(10, 1000)
    assert q.rate_limit() == (10, 1000)
    assert all(p.rate_limit() == (10, 1000) for p in q.partition_queues)
    q.clear_rate_limit()
    assert q.rate_limit() is None


def test_a_worker_runs_every_job_once_and_the_logical_views_add_up(client, qname):
    q = Queue(qname, client, partitions=4)
    refs = q.enqueue_many([{"n": i} for i in range(200)])
    refs.append(q.enqueue({"n": 200}, partition_key="k"))
    seen: List[int] = []
    stats = Worker(q, lambda job: seen.append(job.payload["n"]) or job.payload["n"] * 2,
                   concurrency=4).run_until_idle(timeout_s=60)
    assert stats.completed == 201 and sorted(seen) == list(range(201))
    assert q.counts()["completed"] == 201
    assert refs[3].wait(timeout_s=5) == 6
    assert q.metrics().counters["completed"] == 201
    events = q.read_events(count=1000)
    assert {e.job_id for e in events if e.name == "completed"} >= {r.id for r in refs[:50]}
    assert q.trim(keep_completed=0) == 201
    assert q.obliterate() > 0
    assert q.counts()["completed"] == 0
    Queue(qname, client, partitions=2).enqueue("new layout after obliterate")


def test_a_worker_serves_a_subset_of_partitions(client, qname):
    q = Queue(qname, client, partitions=3)
    for i in range(3):
        q.enqueue_many([i] * 5, partition_key=None)
    stats = Worker(q, lambda job: None, partitions=[0, 2]).run_until_idle(timeout_s=30)
    per = [c["pending"] for c in q.partition_counts()]
    assert per[1] == 5 and per[0] == per[2] == 0
    assert stats.completed == 10
    with pytest.raises(InvalidInput):
        Worker(q, lambda job: None, partitions=[0, 0])
    with pytest.raises(InvalidInput):
        Worker(Queue(qname + "-plain", client), lambda job: None, partitions=[0])


def test_partitions_spread_over_the_three_masters(cluster):
    """P = 12 over the test Cluster's 3 masters: 4 partitions on each."""
    c = emqfast.connect(cluster.url)
    q = Queue("spread-check", c, partitions=12)
    ranges = list(cluster._ranges())
    held: Dict[int, int] = {}
    for part in q.partition_queues:
        slot = key_slot(part.keys.meta.encode())
        port = next(p for (lo, hi), p in ranges if lo <= slot <= hi)
        held[port] = held.get(port, 0) + 1
    assert sorted(held.values()) == [4, 4, 4]
    c.close()


def test_aio_queue_and_worker_take_partitions(redis_url, qname):
    async def main() -> Any:
        q = emqfast.aio.Queue(qname, redis_url, partitions=3)
        assert isinstance(q, emqfast.aio.Queue) and q.partitions == 3
        refs = await q.enqueue_many(list(range(12)))
        await q.enqueue("k", partition_key="x")
        assert (await q.counts())["pending"] == 13
        got = await q.get(refs[2].id)
        assert got.payload == 2
        w = emqfast.aio.Worker(q, lambda job: job.payload)
        stats = await w.run_until_idle(timeout_s=30)
        assert (await q.counts())["completed"] == 13
        wrong = emqfast.aio.Queue(qname, redis_url, partitions=4)
        with pytest.raises(PartitionMismatch):
            await emqfast.aio.Worker(wrong, lambda job: None).run_until_idle(timeout_s=5)
        with pytest.raises(PartitionMismatch):
            await wrong.enqueue("x")
        assert (await q.aref(refs[0].id)).id == refs[0].id
        await q.aclose()
        return stats.completed

    assert asyncio.run(main()) == 13


def test_a_batch_failing_in_one_partition_is_retried_whole_and_in_order(client, qname):
    """A partition refusing its share (here: a keyspace of another major version) makes
    enqueue_many raise one PartialBatch over the whole batch: the partitions before it
    landed, the rest not sent; retry_partial sends the rest to the same partitions."""
    q = Queue(qname, client, partitions=3)
    q.enqueue("warm")
    broken = q.partition(1).keys.meta
    client.hset(broken, "version", "other:9.0")
    with pytest.raises(emqfast.PartialBatch) as err:
        q.enqueue_many([{"n": i} for i in range(30)])
    partial = err.value
    assert isinstance(partial.__cause__, VersionMismatch)
    assert len(partial.landed) + len(partial.not_sent) == 30 and not partial.unknown
    assert q.counts()["pending"] == 1 + len(partial.landed)
    client.hset(broken, "version", emqfast.KEYSPACE_VERSION)
    refs = q.retry_partial(partial)
    assert [q.get(r.id).payload for r in refs] == [{"n": i} for i in range(30)]
    assert q.counts()["pending"] == 31
    with pytest.raises(InvalidInput):
        Queue(qname + "-other", client, partitions=3).retry_partial(partial)


def test_code_for_a_partitioned_queue_runs_on_a_plain_one(client, qname):
    """A plain queue is one partition: it takes partition_key(s) and only checks them."""
    q = Queue(qname, client)
    refs = [q.enqueue(i, partition_key="user-1") for i in range(3)]
    refs += q.enqueue_many([3, 4], partition_key="user-1")
    refs += q.enqueue_many([5, 6], partition_keys=["a", None])
    assert q.job_ids("pending") == [r.id for r in refs]
    for bad in (1, "", b"k"):
        with pytest.raises(emqfast.InputTypeError):
            q.enqueue("x", partition_key=bad)
    with pytest.raises(InvalidInput):
        q.enqueue_many([1, 2], partition_keys=["a"])
    with pytest.raises(InvalidInput):
        q.enqueue_many([1], partition_key="a", partition_keys=["a"])
    assert q.counts()["pending"] == 7
