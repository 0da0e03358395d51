"""A second Ctrl-C force-quits, for the thread Worker, the asyncio Worker
and ``emqfast worker``: the first SIGINT stops gracefully (a running job keeps its
lease), the second ends the worker at once and hands back what it held, so another worker
takes the job now instead of after its lease expires. The start line stays one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import emqfast
from emqfast import Queue

from test_cli import cli_env
from waiting import wait_until

SYNC = textwrap.dedent("""
    import logging, os, sys, time
    import emqfast
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    q = emqfast.Queue(sys.argv[1], sys.argv[2])
    def handler(job):
        print("STARTED", job.id, flush=True)
        time.sleep(600)
    w = emqfast.Worker(q, handler, concurrency=1, lease_ms=60_000, shutdown_timeout_s=600)
    try:
        w.run()
    except KeyboardInterrupt:
        print("FORCED released", w.stats.released, flush=True)
        os._exit(130)
""")

AIO = textwrap.dedent("""
    import asyncio, logging, sys
    import emqfast.aio
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    async def handler(job):
        print("STARTED", job.id, flush=True)
        await asyncio.sleep(600)
    async def main():
        q = emqfast.aio.Queue(sys.argv[1], emqfast.aio.connect(sys.argv[2]))
        w = emqfast.aio.Worker(q, handler, concurrency=1, lease_ms=60_000,
                               shutdown_timeout_s=600)
        stats = await w.run()
        print("RETURNED released", stats.released, flush=True)
    asyncio.run(main())
""")

HANDLER_MODULE = textwrap.dedent("""
    import time
    def slow(job):
        print("STARTED", job.id, flush=True)
        time.sleep(600)
""")


def _start(cmd, redis_url, qname, tmp_path, env=None):
    out = open(tmp_path / "out.txt", "w+")
    err = open(tmp_path / "err.txt", "w+")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env or cli_env(), cwd=tmp_path)
    return proc, tmp_path / "out.txt", tmp_path / "err.txt"


def _force_quit_flow(proc, out, err, r, q, slow_id, others):
    wait_until(lambda: "STARTED" in out.read_text(), 60, "the slow handler to start")
    assert q.get(slow_id).state == "active"
    proc.send_signal(signal.SIGINT)
    wait_until(lambda: "shutting down gracefully" in err.read_text(), 30, "graceful stop")
    # graceful: the running job keeps its lease (its handler may still finish)
    time.sleep(0.3)  # give a wrong implementation the chance to give up (no wait for a state)
    assert proc.poll() is None and q.get(slow_id).state == "active"
    proc.send_signal(signal.SIGINT)
    code = proc.wait(30)  # ends at once, not after the 600 s handler or shutdown timeout
    assert "force quit" in err.read_text()
    # everything it held is back on pending, the lease gone, the attempt not counted
    job = q.get(slow_id)
    assert job.state == "pending" and job.attempts == 0, job
    assert r.hget(q.keys.leases, slow_id) is None and q.counts()["active"] == 0
    assert set(q.job_ids("pending")) == {slow_id, *others}
    # another worker takes it now
    done = []
    emqfast.Worker(q, lambda j: done.append(j.id)).run_until_idle(timeout_s=30)
    assert set(done) == {slow_id, *others}
    return code


def _seed(r, qname):
    q = Queue(qname, r)
    slow = q.enqueue("slow", priority=0)
    others = [ref.id for ref in q.enqueue_many(["a", "b", "c"], priority=5)]
    return q, slow.id, others


def test_sync_worker_second_sigint_force_quits(redis_url, r, qname, tmp_path):
    q, slow, others = _seed(r, qname)
    proc, out, err = _start([sys.executable, "-c", SYNC, qname, redis_url], redis_url, qname,
                            tmp_path)
    try:
        assert _force_quit_flow(proc, out, err, r, q, slow, others) == 130
        assert "FORCED released" in out.read_text()
    finally:
        proc.kill()


def test_aio_worker_second_sigint_force_quits(redis_url, r, qname, tmp_path):
    q, slow, others = _seed(r, qname)
    proc, out, err = _start([sys.executable, "-c", AIO, qname, redis_url], redis_url, qname,
                            tmp_path)
    try:
        assert _force_quit_flow(proc, out, err, r, q, slow, others) == 0
        assert "RETURNED released" in out.read_text()
    finally:
        proc.kill()


def test_cli_worker_second_sigint_force_quits_and_logs_one_start_line(redis_url, r, qname,
                                                                       tmp_path):
    (tmp_path / "slowjobs.py").write_text(HANDLER_MODULE)
    q, slow, others = _seed(r, qname)
    proc, out, err = _start([sys.executable, "-m", "emqfast", "--url", redis_url, "worker",
                             "slowjobs:slow", "--queue", qname, "--concurrency", "1",
                             "--shutdown-timeout", "600"], redis_url, qname, tmp_path,
                            env=cli_env(COLUMNS="80"))
    try:
        assert _force_quit_flow(proc, out, err, r, q, slow, others) == 130
    finally:
        proc.kill()
    lines = err.read_text().splitlines()
    start = [line for line in lines if line.startswith("emqfast worker ")]
    assert len(start) == 1 and "a second one force-quits" in start[0], lines[:3]
    assert any(line.startswith("worker force-quit: released ") for line in lines), lines
