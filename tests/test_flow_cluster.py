"""Flows on a real 3-master Redis Cluster: a flow whose queues live on three masters
(every step crosses slots). A producer SIGKILLed between writing a waiting job (its slot)
and linking it to its dependency (another slot) leaves nothing that runs early; the next
Worker's repair sends the missing link and the job runs after its dependency; a re-run of
the flow (same ids) admits the rest of the graph. Dependents also release across slots
through the outbox drain, and a failure cascades across slots."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, List

import pytest
import redis

import emqfast
from cluster_util import names_over_masters, start_cluster
from emqfast.facade import deps
from waiting import wait_until

pytestmark = pytest.mark.cluster
PROCS = str(Path(__file__).with_name("flow_procs.py"))


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


@pytest.fixture
def conn(cluster):
    client = emqfast.connect(cluster.url)
    assert isinstance(client, redis.RedisCluster)
    yield client
    client.close()


@pytest.fixture
def queues(cluster, conn, qname):
    return [emqfast.Queue(name, conn) for name in names_over_masters(cluster, 1, qname)]


def _producer(cluster: Any, queues: List[Any], tag: str, mode: str) -> int:
    proc = subprocess.run([sys.executable, PROCS, cluster.url, *(q.name for q in queues), tag,
                           mode], capture_output=True, timeout=120)
    return proc.returncode


class Serving:
    """A Worker per queue, each in a thread, recording the steps in run order."""

    def __init__(self, queues: List[Any]):
        self.ran: List[str] = []
        self.workers = [emqfast.Worker(q, self.handler, lease_ms=5000) for q in queues]
        self.threads = [threading.Thread(target=w.run, daemon=True) for w in self.workers]

    def handler(self, job: Any) -> Any:
        self.ran.append(job.payload["step"])
        if job.payload.get("boom"):
            raise RuntimeError("boom")
        return {"step": job.payload["step"], "deps": job.dependency_results()}

    def __enter__(self) -> "Serving":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for w in self.workers:
            w.stop()
        for t in self.threads:
            t.join(30)


def test_a_producer_killed_between_slots_is_repaired_by_the_next_worker(
        cluster, queues, monkeypatch, qname):
    monkeypatch.setattr(deps, "REPAIR_GRACE_MS", 300)
    q0, q1, q2 = queues
    tag = qname.replace("-", "")
    assert _producer(cluster, queues, tag, "crash") == -9   # SIGKILLed mid-flow
    a, b, c = (f"JOB-{tag}-{s}" for s in "abc")
    assert q0.get(a).state == "pending"
    assert q1.get(b).state == "waiting_deps"                # written on its slot, unlinked
    assert q1.redis.zscore(deps.deplink_key(q1.keys), b) is not None
    assert q0.redis.hget(q0.keys.dependents, a) is None     # the link never reached a's slot
    assert q2.get(c) is None                                # never written
    with Serving(queues) as serving:
        wait_until(lambda: (q1.get(b).state == "completed"), 60,
                   "b repaired by the next worker and run", interval=0.02)
        assert serving.ran == ["a", "b"]
        assert q1.get(b).result == {"step": "b", "deps": {a: {"step": "a", "deps": {}}}}
        assert _producer(cluster, queues, tag, "complete") == 0  # the re-run: same graph
        wait_until(lambda: q2.get(c).state == "completed", 60, "c run", interval=0.02)
        assert serving.ran == ["a", "b", "c"]
    assert q1.redis.zcard(deps.deplink_key(q1.keys)) == 0
    for q in queues:
        assert q.counts()["waiting_deps"] == 0


def test_a_flow_over_three_masters_runs_in_order_and_a_failure_cascades(conn, queues):
    q0, q1, q2 = queues
    flow = emqfast.Flow(conn)
    roots = [flow.add(q0, {"step": f"root{i}"}) for i in range(2)]
    mid = flow.add(q1, {"step": "mid"}, after=roots)
    flow.add(q2, {"step": "leaf"}, after=[mid])
    bad = flow.add(q0, {"step": "bad", "boom": True}, attempts=1)
    doomed = flow.add(q1, {"step": "doomed"}, after=[bad])
    doomed_leaf = flow.add(q2, {"step": "doomed-leaf"}, after=[doomed])
    runner = flow.add(q2, {"step": "runner"}, after=[bad], on_dep_failure="run")
    refs = flow.enqueue()
    assert [ref.status for ref in refs].count("waiting_deps") == 5
    with Serving(queues) as serving:
        wait_until(lambda: q2.counts()["completed"] == 2 and q2.counts()["failed"] == 1, 60,
                   "the leaves ended", interval=0.02)
    ran = serving.ran
    assert ran.index("mid") > max(ran.index("root0"), ran.index("root1"))
    assert ran.index("leaf") > ran.index("mid")
    assert "doomed" not in ran and "doomed-leaf" not in ran and "runner" in ran
    for q, job in ((q1, doomed), (q2, doomed_leaf)):
        got = q.get(job.id)
        assert (got.state, got.error) == ("failed", "dependency failed")
    assert q2.get(runner.id).result == {"step": "runner", "deps": {bad.id: None}}


def test_the_asyncio_flow_admits_across_slots(cluster, queues):
    import asyncio

    import emqfast.aio

    async def admit() -> List[Any]:
        client = emqfast.aio.connect(cluster.url)
        flow = emqfast.aio.Flow(client)
        first = flow.add(queues[0], {"step": "first"})
        flow.add(queues[1], {"step": "second"}, after=[first])
        try:
            return list(await flow.enqueue())
        finally:
            await client.aclose()
    first, second = asyncio.run(admit())
    assert (first.status, second.status) == ("pending", "waiting_deps")
    assert queues[0].redis.hget(queues[0].keys.dependents, first.id) == b"1"


def test_a_drainer_killed_mid_drain_is_finished_by_the_next_worker(cluster, conn, queues):
    from engine_util import claim, complete
    q0, q1, q2 = queues
    root = q0.enqueue({"step": "root"})
    mine = [q1.enqueue({"step": "one"}, depends_on=[root]),
            q2.enqueue({"step": "two"}, depends_on=[root])]
    [(job_id, token)] = claim(q0, "bare", lease_ms=30_000)
    complete(q0, job_id, token)                      # the hook queues it on q0's outbox
    assert conn.llen(q0.keys.outbox) == 1
    proc = subprocess.run([sys.executable, PROCS, cluster.url, q0.name, "-", "-", "-",
                           "drain-crash"], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert conn.llen(q0.keys.outbox) == 1            # the entry outlived its drainer
    assert [q.get(ref.id).state for q, ref in zip((q1, q2), mine)] == ["pending"] * 2
    with Serving(queues) as serving:                 # q0's worker finishes the drain
        wait_until(lambda: conn.llen(q0.keys.outbox) == 0, 30, "the entry drained",
                   interval=0.02)
        wait_until(lambda: q1.counts()["completed"] + q2.counts()["completed"] == 2, 30,
                   "both dependents ran", interval=0.02)
    assert sorted(serving.ran) == ["one", "two"]     # each once
    assert not conn.exists(q0.keys.job_dependents(root.id))
