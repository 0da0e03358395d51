"""A half-open blip costs a Worker one read deadline, not one per connection it holds.

A blip silences every live connection at once (no FIN, no RST; new connections work). An
idle Worker process (tests/soak_procs.py, through tests/fault_proxy.py) notices on its
marker wait, within that wait's deadline; the connections it holds went silent in the
same instant, so the job enqueued after the blip must be done within about one read
deadline, not after each silenced connection has waited out a deadline of its own.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import emqfast
from conftest import require_native
from emqfast.core.deadlines import BLOCK_MARGIN_S, READ_TIMEOUT_S
from fault_proxy import FaultProxy, upstream_port_of
from network_soak import EXIT_S, PROCS
from waiting import wait_until

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]

# one read deadline (the marker wait's: its block time is short), its margin, and slack
# for a loaded machine; two deadlines in a row take 10 s or more
WITHIN_S = READ_TIMEOUT_S + BLOCK_MARGIN_S + 2.0


@pytest.mark.parametrize("kind,backend", [
    pytest.param("thread", "c", id="thread-c"),
    pytest.param("thread", "python", id="thread-python"),
    pytest.param("aio", "c", id="aio-c"),
])
def test_an_idle_worker_runs_the_next_job_within_one_deadline_of_a_blip(
        redis_url, r, qname, tmp_path, kind, backend):
    if backend == "c":
        require_native()
    q = emqfast.Queue(qname, r)
    with FaultProxy(upstream_port_of(redis_url), seed=37) as proxy:
        proc = subprocess.Popen(
            [sys.executable, PROCS, kind, proxy.url(), qname, str(tmp_path / "ledger"),
             f"blip-{kind}-{backend}"], env=dict(os.environ, EMQFAST_BACKEND=backend),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for i in range(3):  # every connection it uses is open and in use
                ref = q.enqueue(i)
                wait_until(lambda: q.get(ref.id).state == "completed", 60, "a warm-up job")
            wait_until(lambda: q.counts()["active"] == 0, 15, "the Worker idle")
            assert proxy.half_open() >= 2
            blip = time.monotonic()
            ref = q.enqueue("after the blip")
            wait_until(lambda: q.get(ref.id).state == "completed", 60, "the job after it")
            took = time.monotonic() - blip
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                out, _ = proc.communicate(timeout=EXIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
    assert "EXITED" in out, out
    assert took <= WITHIN_S, f"the job after the blip took {took:.1f}s (> {WITHIN_S:g}s)"
