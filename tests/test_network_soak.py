"""Workers ride out a network and a server that misbehave, losing nothing and running
nothing twice (tests/network_soak.py): thread and asyncio Worker processes, one per
backend, drain a queue through the fault proxy while, in turn, a half-open blip silences
every connection, a blackhole swallows everything for a while, a script that never ends
holds the server BUSY, and a loop kills every client connection every 100 ms.

Every run is reconciled from a ledger the handlers write outside Redis: every job
enqueued is completed, none ran twice, each fault is followed by every Worker running
jobs again within twice its length (plus a margin for a loaded machine), and every Worker
exits cleanly on SIGTERM afterwards. Each run prints its table (``pytest -s``); set
``EMQ_FAULT_REPORT`` to a file to get the JSON line. bench/faults.py ``--network`` runs
the long version (20,000 jobs, a 10 s blackhole).
"""
from __future__ import annotations

import shutil
import uuid

import pytest

from conftest import start_redis_server
from emqfast.core.deadlines import READ_TIMEOUT_S
from network_soak import network_soak, table
from test_fault_soak import report

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]

MARGIN_S = 10.0  # on top of twice a fault's length: a loaded 2-core machine
# A half-open blip costs a Worker one read deadline: its first call to meet it makes every
# other connection suspect (its acker's, its pool's), so none waits out a deadline of its own.
BLIP_MARGIN_S = 3.5


@pytest.fixture(scope="module")
def soak_server_port():
    """A private redis-server: the faults (BUSY, CLIENT KILL) hit every client of it."""
    proc, port, workdir = start_redis_server()
    yield port
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("kind", ["thread", "aio"])
def test_workers_ride_out_blips_blackholes_busy_scripts_and_kills(soak_server_port, kind,
                                                                   tmp_path):
    result = network_soak(soak_server_port, f"t-soak-{kind}-{uuid.uuid4().hex[:8]}", kind,
                          backends=("c", "python"), n_jobs=2_000, blackhole_s=3.0,
                          busy_s=2.0, kill_s=2.0, margin_s=MARGIN_S, workdir=tmp_path)
    report(result)
    print(table(result.rows))
    assert [row.fault for row in result.rows] == ["half-open blip", "blackhole",
                                                  "BUSY script", "CLIENT KILL loop"], result
    assert result.problems() == {}, (result.problems(), result.worker_logs)
    late = [(row.fault, row.per_worker, row.detail) for row in result.rows
            if row.detail or not row.within(MARGIN_S)]
    assert late == [], table(result.rows)
    blip = result.rows[0]
    assert blip.recovery_s <= READ_TIMEOUT_S + BLIP_MARGIN_S, table(result.rows)
