"""A burst worker (run_until_idle / ``emqfast worker --burst``) and jobs left active by a
worker that died: by default it says what it leaves and when the
earliest lease ends; with ``wait_active`` it waits, and re-runs the orphan once its lease
lapses."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import emqfast
import emqfast.aio as emq
from engine_util import claim, make_queue


def _orphan(q, lease_ms: int) -> str:
    """A job claimed by a worker that then died (SIGKILL): active under a lease nobody
    renews."""
    ref = q.enqueue({"n": 1})
    [(job_id, _token)] = claim(q, "dead-worker", lease_ms)
    assert job_id == ref.id
    return ref.id


def test_burst_says_what_it_leaves_active(redis_url, qname, caplog):
    q = make_queue(redis_url, qname)
    orphan = _orphan(q, 60_000)
    q.enqueue({"n": 2})
    runs = []
    with caplog.at_level(logging.INFO, logger="emqfast.worker"):
        stats = emqfast.Worker(q, lambda job: runs.append(job.id)).run_until_idle(timeout_s=30)
    assert stats.completed == 1 and orphan not in runs
    assert q.counts()["active"] == 1
    said = [rec.getMessage() for rec in caplog.records if "leaving 1 job(s) active" in rec.getMessage()]
    assert said and "earliest lease ends in" in said[0]


def test_burst_with_wait_active_reruns_the_orphan_when_its_lease_lapses(redis_url, qname):
    q = make_queue(redis_url, qname)
    orphan = _orphan(q, 600)
    runs = []
    w = emqfast.Worker(q, lambda job: runs.append(job.id), lease_ms=400, max_stalled=5)
    stats = w.run_until_idle(timeout_s=30, wait_active=True)
    assert runs == [orphan] and stats.completed == 1
    assert q.counts()["active"] == 0 and q.counts()["completed"] == 1


def test_aio_burst_with_wait_active_reruns_the_orphan(redis_url, qname):
    q_sync = make_queue(redis_url, qname)
    orphan = _orphan(q_sync, 600)

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        runs = []

        async def handler(job):
            runs.append(job.id)

        stats = await emq.Worker(q, handler, lease_ms=400, max_stalled=5).run_until_idle(
            timeout_s=30, wait_active=True)
        await q.aclose()
        return runs, stats
    runs, stats = asyncio.run(main())
    assert runs == [orphan] and stats.completed == 1


def _cli_burst(redis_url, qname, tmp_path, *extra):
    (tmp_path / "burst_handlers.py").write_text("def noop(job):\n    return None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "COLUMNS": "80"}
    out = subprocess.run([sys.executable, "-m", "emqfast.tools.cli", "--url", redis_url,
                          "worker", "burst_handlers:noop", "-q", qname, "--burst",
                          "--lease-ms", "400", *extra],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_cli_burst_names_the_jobs_it_leaves_active(redis_url, qname, tmp_path):
    q = make_queue(redis_url, qname)
    _orphan(q, 60_000)
    assert "leaving 1 job(s) active" in _cli_burst(redis_url, qname, tmp_path)
    assert q.counts()["active"] == 1


def test_cli_burst_wait_active_runs_a_dead_workers_job(redis_url, qname, tmp_path):
    q = make_queue(redis_url, qname)
    orphan = _orphan(q, 800)
    _cli_burst(redis_url, qname, tmp_path, "--wait-active")
    assert q.get(orphan).state == "completed"
