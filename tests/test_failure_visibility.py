"""Failures are visible by default: a retried failure logs at INFO, a
final one at WARNING (shown by a plain script), the same in both drivers; `emqfast worker`
prints one line per failed job."""
from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import emqfast
import emqfast.aio as emq
from emqfast import Queue, Unrecoverable
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


def _failure_records(caplog, job_id: str) -> list:
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if getattr(r, "job_id", None) == job_id and getattr(r, "error", None)]


def _check_levels(caplog, retried: str, final: str, unrecoverable: str) -> None:
    first, last = _failure_records(caplog, retried)
    assert first[0] == logging.INFO and "will retry" in first[1], first
    assert last[0] == logging.WARNING and "attempt 2 of 2" in last[1], last
    assert "RuntimeError: broke" in last[1] and not last[1].startswith("emqfast:")
    for job_id in (final, unrecoverable):
        [(level, message)] = _failure_records(caplog, job_id)
        assert level == logging.WARNING and f"job {job_id!r} failed" in message, message


def _enqueue_three(q):
    return (q.enqueue({"n": 1}, attempts=2), q.enqueue({"n": 2}, attempts=1),
            q.enqueue({"stop": True}, attempts=5))


def _handler(job):
    if job.payload.get("stop"):
        raise Unrecoverable("no point retrying")
    raise RuntimeError("broke")


def test_sync_worker_logs_retries_at_info_and_final_failures_at_warning(redis_url, qname,
                                                                         caplog):
    q = Queue(qname, redis_url)
    refs = _enqueue_three(q)
    with caplog.at_level(logging.INFO, logger="emqfast"):
        emqfast.Worker(q, _handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    _check_levels(caplog, *(r.id for r in refs))


def test_aio_worker_logs_failures_by_the_same_rule(redis_url, qname, caplog):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        refs = [await q.enqueue({"n": 1}, attempts=2), await q.enqueue({"n": 2}, attempts=1),
                await q.enqueue({"stop": True}, attempts=5)]

        async def handler(job):
            _handler(job)

        await emq.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
        return refs

    with caplog.at_level(logging.INFO, logger="emqfast"):
        refs = asyncio.run(main())
    _check_levels(caplog, *(r.id for r in refs))
