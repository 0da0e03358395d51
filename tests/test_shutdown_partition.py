"""A Worker stopped (SIGTERM) while its server is silent (a partition: connections are
accepted, nothing is answered) exits within its ``shutdown_timeout_s`` plus one read
deadline, says what it could not write, and loses nothing: the job whose outcome it could
not write runs again elsewhere once its lease lapses."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

import emqfast
from emqfast.core.deadlines import READ_TIMEOUT_S
from fault_proxy import FaultProxy
from waiting import wait_until

PROCS = str(Path(__file__).with_name("partition_procs.py"))
SHUTDOWN_S = 2.0  # partition_procs' Worker
# the bound: the shutdown's own, and slack for a loaded machine (before, such a Worker ran
# on for 17 s to for ever); a thread Worker may also wait out one read the stop found in
# flight (a blocked socket read cannot be interrupted), the asyncio Worker leaves it
EXIT_WITHIN_S = {"thread": SHUTDOWN_S + READ_TIMEOUT_S + 4.0, "aio": SHUTDOWN_S + 3.5}


@pytest.mark.parametrize("mode", ["thread", "aio"])
@pytest.mark.parametrize("when", ["idle", "handler-running", "mid-call"])
def test_sigterm_during_a_partition_exits_within_its_bound_and_loses_nothing(
        redis_url, qname, r, tmp_path, mode, when):
    busy = when == "handler-running"
    port = r.connection_pool.connection_kwargs["port"]
    ledger = tmp_path / "runs"
    ledger.touch()
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    # running when the partition starts; it ends within the shutdown's grace, so its
    # outcome is what the Worker cannot write
    ref = q.enqueue(1.5) if busy else None
    with FaultProxy(upstream_port=port) as proxy:
        proc = subprocess.Popen([sys.executable, PROCS, mode, proxy.url(), qname, str(ledger)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            if busy:
                wait_until(lambda: ledger.read_text(), 30, "the handler running")
            else:
                wait_until(lambda: r.zcard(q.keys.workers), 30, "the worker serving")
            proxy.blackhole()
            if when == "mid-call":  # its next call (a beat's, a claim's) waits on silence
                wait_until(lambda: proxy.stats["swallowed_c2s"], 30, "a call sent into it")
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=EXIT_WITHIN_S[mode])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0 and "EXITED" in out, out
    if not busy:
        return
    assert "could not write 1 outcomes" in out or "outcomes still unwritten" in out, out
    # nothing lost: once its lease lapses, another Worker runs it again
    emqfast.Worker(q, lambda job: "again").run_until_idle(timeout_s=60, wait_active=True)
    assert q.get(ref.id).state == "completed" and q.get(ref.id).result == "again"
    assert ledger.read_text().split() == [ref.id]  # the one run before the partition
