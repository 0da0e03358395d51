"""`emqfast worker` shows every failed job by default, one line each (issue 16 item 1)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

from emqfast import Queue
from emqfast.tools.cli_worker import FailureLines

REPO = Path(__file__).resolve().parent.parent

HANDLER = '''
def handle(job):
    return job.payload["to"]     # the {"n": ...} jobs below have no "to"
'''


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def test_worker_prints_one_line_per_failure_with_id_attempt_and_error(redis_url, qname,
                                                                      tmp_path):
    (tmp_path / "mail_handlers.py").write_text(HANDLER)
    q = Queue(qname, redis_url)
    retried = q.enqueue({"n": 1}, attempts=3, delay_ms=0)
    final = q.enqueue({"n": 2}, attempts=1)
    out = subprocess.run(
        [sys.executable, "-m", "emqfast", "--url", redis_url, "worker", "mail_handlers:handle",
         "--queue", qname, "--burst"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert [ln for ln in lines if final.id in ln and "FAILED" in ln
            and "attempt 1/1: KeyError: 'to'" in ln], out.stderr
    assert [ln for ln in lines if retried.id in ln and "retry" in ln
            and "attempt 1/3: KeyError: 'to'" in ln], out.stderr
    failure_lines = [ln for ln in lines if "KeyError" in ln]
    assert all(len(ln) <= 80 for ln in failure_lines), failure_lines
    assert "Traceback" not in out.stderr


def _record(error: str, final: bool) -> logging.LogRecord:
    record = logging.LogRecord("emqfast.worker", logging.WARNING, __file__, 1, "msg", (), None)
    record.__dict__.update(job_id="JOB0VcU3vfB4jZv4SQZyW80000", attempt=2, max_attempts=2,
                           error=error, final=final)
    return record


def test_a_failure_line_fits_the_terminal_and_stays_one_line():
    long_error = "RuntimeError: " + "x" * 200 + "\nsecond line"
    line = FailureLines(width=80).format(_record(long_error, final=True))
    assert len(line) == 80 and line.endswith("…") and "\n" not in line
    assert "FAILED JOB0VcU3vfB4jZv4SQZyW80000 attempt 2/2: RuntimeError: x" in line
    full = FailureLines(width=None).format(_record(long_error, final=False))
    assert "retry " in full and full.endswith("second line")  # a log file keeps it all
