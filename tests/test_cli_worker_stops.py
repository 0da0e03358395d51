"""`emqfast worker --job-timeout-ms`: the CLI worker stops runs that take too
long, as Worker(job_timeout_ms=...) does; a job's own timeout_ms wins."""
from __future__ import annotations

import textwrap

from emqfast import Queue
from test_cli import emq


def test_cli_worker_times_out_long_runs(redis_url, qname, tmp_path):
    (tmp_path / "slow_handlers.py").write_text(textwrap.dedent("""
        import time

        def handle(job):
            deadline = time.monotonic() + 1.5
            while time.monotonic() < deadline:  # a long run that heeds its stop
                job.raise_if_cancelled()
                time.sleep(0.005)
            return "finished"
    """))
    q = Queue(qname, redis_url)
    slow = q.enqueue("slow", attempts=1)
    own = q.enqueue("own", timeout_ms=60_000, attempts=1)
    out = emq("--url", redis_url, "worker", "slow_handlers:handle", "--queue", qname,
              "--burst", "--concurrency", "1", "--job-timeout-ms", "200",
              "--cancel-grace-ms", "100", cwd=tmp_path, timeout=90)
    assert out.returncode == 0, out.stderr
    failed = q.get(slow.id)
    assert failed.state == "failed" and "timeout" in (failed.error or "").lower()
    assert q.get(own.id).state == "completed"  # its own 60 s beat the worker's 200 ms


def test_cli_worker_refuses_a_bad_timeout(redis_url, qname, tmp_path):
    out = emq("--url", redis_url, "worker", "x:y", "--queue", qname, "--job-timeout-ms", "0",
              cwd=tmp_path)
    assert out.returncode == 2 and "--job-timeout-ms" in out.stderr
