"""``emqfast worker --processes``: the options reach the Worker, the start line says
processes × concurrency, the exit line says what was finished, released, killed (by
reason) and crashed; a thread worker whose handler outlived --shutdown-timeout suggests
--processes. Real redis-server, real child processes, real signals."""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from emqfast import Queue
from emqfast.tools.cli_worker import OUTLIVED_HINT, exit_line
from test_cli import cli_env, emq
from waiting import wait_until

TESTS = Path(__file__).resolve().parent


def _worker(redis_url: str, qname: str, *args: str) -> "subprocess.Popen[str]":
    """``emqfast worker procobs_handlers:handle -q QNAME ARGS`` in the background."""
    return subprocess.Popen([sys.executable, "-m", "emqfast", "--url", redis_url, "worker",
                             "procobs_handlers:handle", "-q", qname, *args],
                            cwd=TESTS, env=cli_env(COLUMNS="80"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _began(mark: Path, n: int = 1) -> bool:
    return mark.exists() and len(mark.read_text().splitlines()) >= n


def _last_numbers(line: str) -> dict:
    """``crashed 1, recycled 2`` in an exit line -> {"crashed": 1, "recycled": 2}."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"([a-z]+) (\d+)", line)}


def test_burst_with_processes_says_processes_and_what_they_did(redis_url, qname):
    q = Queue(qname, redis_url)
    ok = [q.enqueue({"k": "quick"}) for _ in range(4)]
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "--burst", "--processes", "2", "--max-jobs-per-child", "1", cwd=TESTS,
              timeout=90)
    assert out.returncode == 0, out.stderr
    assert "2 processes × concurrency 1" in out.stderr, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("worker stopped: claimed 4, completed 4,"), out.stderr
    assert "; handler processes: killed 0, crashed 0, recycled " in last, last
    said = _last_numbers(last.split(";")[1])
    # children replaced after a job, each by a new one, except those recycled as the
    # burst ended (no replacement is started for a Worker that is stopping)
    assert said["recycled"] >= 1 and said["restarted"] >= said["recycled"] - 2, last
    assert all(q.get(j.id).state == "completed" for j in ok)


def test_a_crash_is_counted_and_fails_only_its_job(redis_url, qname):
    q = Queue(qname, redis_url)
    dead = q.enqueue({"k": "exit"}, attempts=1)
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "--burst", "--processes", "1", cwd=TESTS, timeout=90)
    assert out.returncode == 0, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    # (its replacement may not have started yet when a burst ends: restarted 0 or 1)
    assert "failed 1," in last and "killed 0, crashed 1, recycled 0, restarted" in last, \
        out.stderr
    gone = q.get(dead.id)
    assert gone.state == "failed" and "WorkerCrashed" in (gone.error or ""), gone.error


def test_a_timeout_kill_is_counted_by_its_reason(redis_url, qname, tmp_path):
    q = Queue(qname, redis_url)
    job = q.enqueue({"k": "nap", "s": 60}, attempts=1)
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "--burst", "--processes", "1", "--job-timeout-ms", "300",
              "--cancel-grace-ms", "100", cwd=TESTS, timeout=90)
    assert out.returncode == 0, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert "failed 1," in last and "killed 1 (timeout 1), crashed 0" in last, last
    assert q.get(job.id).state == "failed"


def test_shutdown_timeout_kills_and_says_so(redis_url, qname, tmp_path):
    q = Queue(qname, redis_url)
    mark = tmp_path / "began"
    job = q.enqueue({"k": "nap", "s": 6, "mark": str(mark)})
    proc = _worker(redis_url, qname, "--processes", "1", "--shutdown-timeout", "1")
    try:
        wait_until(lambda: _began(mark), 30, "the handler to begin")
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - stopped
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert took < 4, (took, err)  # the bound (1 s) and the kill, not the 6 s handler
    last = err.strip().splitlines()[-1]
    assert "released 1;" in last and "killed 1 (shutdown 1)" in last, err
    assert OUTLIVED_HINT not in err
    assert q.get(job.id).state == "pending" and q.get(job.id).attempts == 0


def test_a_thread_worker_waited_for_a_handler_suggests_processes(redis_url, qname, tmp_path):
    q = Queue(qname, redis_url)
    mark = tmp_path / "began"
    q.enqueue({"k": "nap", "s": 2, "mark": str(mark)})
    proc = _worker(redis_url, qname, "--shutdown-timeout", "0.3")
    try:
        wait_until(lambda: _began(mark), 30, "the handler to begin")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "concurrency 8," in err and "handler processes" not in err, err
    lines = err.strip().splitlines()
    assert lines[-2].startswith("worker stopped: claimed 1, completed 1,"), err
    assert lines[-1] == OUTLIVED_HINT, err


def test_a_thread_worker_that_stopped_in_time_gives_no_hint(redis_url, qname):
    Queue(qname, redis_url).enqueue({"k": "quick"})
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "--burst", "-c", "2", cwd=TESTS, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "concurrency 2," in out.stderr and OUTLIVED_HINT not in out.stderr
    assert out.stderr.strip().splitlines()[-1].endswith("released 0")


def test_child_limits_need_processes_and_one_queue(redis_url, qname):
    for extra in (["--max-jobs-per-child", "3"], ["--max-memory-per-child", "100"]):
        out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
                  *extra, cwd=TESTS)
        assert out.returncode == 2 and "needs --processes N" in out.stderr, out.stderr
        assert extra[0] in out.stderr
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "-q", qname + "-b", "--processes", "2", cwd=TESTS)
    assert out.returncode == 2 and "serves one queue" in out.stderr, out.stderr
    out = emq("--url", redis_url, "worker", "procobs_handlers:handle", "-q", qname,
              "--processes", "0", cwd=TESTS)
    assert out.returncode == 2 and "--processes" in out.stderr, out.stderr


def test_exit_line_reads_the_heartbeat_report():
    stats = SimpleNamespace(claimed=9, completed=5, retried=1, failed=1, cancelled=1,
                            released=1)
    report = {"children": [], "child_events": {"restarts": 4, "crash": 1, "kill:timeout": 2,
                                               "kill:shutdown": 1, "recycled:memory": 1}}
    assert exit_line(stats, report) == (
        "worker stopped: claimed 9, completed 5, retried 1, failed 1, cancelled 1, "
        "released 1; handler processes: killed 3 (shutdown 1, timeout 2), crashed 1, "
        "recycled 1, restarted 4")
    assert exit_line(stats, None).endswith("released 1")
    fresh = {"children": [], "child_events": {}}
    assert exit_line(stats, fresh).endswith("killed 0, crashed 0, recycled 0, restarted 0")
