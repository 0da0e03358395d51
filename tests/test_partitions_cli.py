"""The CLI and the metrics exporter show a partitioned queue as one logical queue, with a
per-partition breakdown when it is named, and run a worker over it (or a subset)."""
from __future__ import annotations

import json

import emqfast
from emqfast import Queue
from emqfast.facade.metrics import Collector

from test_cli import emq


def _stats(redis_url: str, *args: str) -> dict:
    """``emqfast stats`` piped: queue name -> its key=value fields."""
    out = emq("--url", redis_url, "stats", *args)
    assert out.returncode == 0, out.stderr
    rows = {}
    for line in out.stdout.splitlines():
        fields = dict(part.split("=", 1) for part in line.split(" ")[2:] if "=" in part)
        rows[line.split("queue=", 1)[1].split(" scheduled=")[0]] = fields
    return rows


def test_stats_lists_the_logical_queue_and_its_partitions(redis_url, qname):
    q = Queue(qname, redis_url, partitions=3)
    q.enqueue_many(list(range(9)))
    every = _stats(redis_url)
    assert every[qname]["pending"] == "9" and every[qname]["partitions"] == "3"
    assert not [name for name in every if name.startswith(qname + "#")]
    alone = _stats(redis_url, qname)
    assert [alone[f"{qname} #{i}"]["pending"] for i in range(3)] == ["3", "3", "3"]


def test_jobs_enqueue_and_cancel_take_a_partitioned_queue(redis_url, qname):
    q = Queue(qname, redis_url, partitions=3)
    ref = q.enqueue({"n": 1})
    out = emq("--url", redis_url, "enqueue", qname, '{"n": 2}')
    assert out.returncode == 0, out.stderr
    assert q.counts()["pending"] == 2
    assert emq("--url", redis_url, "jobs", qname, ref.id).returncode == 0
    listed = emq("--url", redis_url, "jobs", qname, "--state", "pending", "--json")
    assert listed.returncode == 0, listed.stderr
    assert ref.id in listed.stdout
    assert emq("--url", redis_url, "cancel", qname, ref.id).returncode == 0
    assert q.get(ref.id).state == "cancelled"


def test_worker_burst_serves_the_partitions_asked(redis_url, qname, tmp_path):
    (tmp_path / "part_handlers.py").write_text("def handle(job):\n    return job.payload\n")
    q = Queue(qname, redis_url, partitions=3)
    q.enqueue_many(list(range(9)))
    out = emq("--url", redis_url, "worker", "part_handlers:handle", "-q", qname,
              "--partitions", "0,2", "--burst", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert [c["pending"] for c in q.partition_counts()] == [0, 3, 0]
    out = emq("--url", redis_url, "worker", "part_handlers:handle", "-q", qname,
              "--partitions", "7", "--burst", cwd=tmp_path)
    assert out.returncode == 2 and "--partitions" in out.stderr
    out = emq("--url", redis_url, "worker", "part_handlers:handle", "-q", qname, "--burst",
              cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert q.counts()["completed"] == 9


def test_the_exporter_sums_the_partitions(redis_url, qname):
    q = Queue(qname, redis_url, partitions=2)
    q.enqueue_many(list(range(4)))
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    snaps = {s.queue: s for s in Collector(redis_url, [qname]).snapshots()}
    assert snaps[qname].counters["completed"] == 4
    assert snaps[qname].states["completed"] == 4
    assert json.dumps(snaps[qname].counters)
