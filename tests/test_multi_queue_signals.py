"""A many-queue worker stops as one: SIGTERM lets every queue's running job
finish and write its outcome; a second SIGINT force-quits, handing back the jobs of every
queue at once."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import uuid

import emqfast
from test_cli import cli_env
from waiting import wait_until

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import emqfast
    conn = emqfast.connect(sys.argv[1])
    qs = [emqfast.Queue(name, conn) for name in sys.argv[2:]]
    def handler(job):
        print("STARTED", job.payload["q"], flush=True)
        time.sleep(job.payload["s"])
        return job.payload["q"]
    w = emqfast.Worker(qs, handler, concurrency=2, lease_ms=60_000, shutdown_timeout_s=600)
    print("NAME", w.name, flush=True)
    try:
        w.run()
    except KeyboardInterrupt:
        print("FORCED released", w.stats.released, flush=True)
        os._exit(130)
    print("DONE completed", w.stats.completed, flush=True)
""")


def _start(redis_url, names, tmp_path):
    (tmp_path / "mq_worker.py").write_text(SCRIPT)
    out = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen([sys.executable, "mq_worker.py", redis_url, *names], stdout=out,
                            stderr=subprocess.DEVNULL, env=cli_env(), cwd=tmp_path)
    return proc, tmp_path / "out.txt"


def test_sigterm_lets_every_queues_running_job_finish(redis_url, tmp_path):
    names = [f"mqs-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]
    qs = [emqfast.Queue(n, redis_url) for n in names]
    refs = [q.enqueue({"q": i, "s": 1.0}) for i, q in enumerate(qs)]
    proc, out = _start(redis_url, names, tmp_path)
    try:
        wait_until(lambda: out.read_text().count("STARTED") == 2, 60, "both jobs to start")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "DONE completed 2" in out.read_text()
    assert [q.get(r.id).result for q, r in zip(qs, refs)] == [0, 1]


def test_a_second_sigint_hands_back_every_queues_jobs(redis_url, tmp_path):
    names = [f"mqs-{uuid.uuid4().hex[:8]}-{i}" for i in range(2)]
    qs = [emqfast.Queue(n, redis_url) for n in names]
    refs = [q.enqueue({"q": i, "s": 600}) for i, q in enumerate(qs)]
    proc, out = _start(redis_url, names, tmp_path)
    try:
        wait_until(lambda: out.read_text().count("STARTED") == 2, 60, "both jobs to start")
        proc.send_signal(signal.SIGINT)
        wait_until(lambda: all(q.get(r.id).state == "active" for q, r in zip(qs, refs)), 5,
                   "graceful: the jobs stay active")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "FORCED released 2" in out.read_text()
    for q, r in zip(qs, refs):
        assert q.get(r.id).state == "pending" and q.get(r.id).attempts == 0
