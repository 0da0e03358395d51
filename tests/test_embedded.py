"""Engine contract: the embedded default. ``connect()`` with no URL starts one real
redis-server on a unix socket in EMQ_STATE_DIR, every process of the user shares it, its
data survives a stop + restart (AOF), and wipe() deletes it. Every test stops the server
it started (fixture finaliser), pass or fail, so nothing is left running."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import emqfast
from emqfast.server import embedded
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def state_dir(monkeypatch):
    # a short path: the unix socket path must fit in sun_path (108 bytes)
    path = Path(tempfile.mkdtemp(prefix="emq-emb-"))
    monkeypatch.setenv("EMQ_STATE_DIR", str(path))
    monkeypatch.delenv("EMQ_REDIS_URL", raising=False)
    yield path
    pid = embedded.pid()
    embedded.stop()
    if pid and _alive(pid):  # stop() failed: do not leave a daemon behind
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _child(code: str, state: Path) -> str:
    """Run ``code`` in a fresh interpreter with no URL, sharing only EMQ_STATE_DIR."""
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}
    env.update(EMQ_STATE_DIR=str(state), PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_connect_without_url_starts_the_embedded_server(state_dir):
    assert not embedded.is_running()
    client = emqfast.connect()
    assert client.ping()
    assert embedded.is_running()
    sock = state_dir / "redis.sock"
    assert sock.is_socket() and embedded.socket_path() == sock
    assert client.connection_pool.connection_kwargs["path"] == str(sock)
    assert client.config_get("port")["port"] == "0"  # no TCP listener
    assert client.config_get("appendonly")["appendonly"] == "yes"
    assert Path(client.config_get("dir")["dir"]) == state_dir
    pid = embedded.pid()
    assert pid and _alive(pid) and client.info("server")["process_id"] == pid
    emqfast.connect().ping()  # a second connect() reuses it
    assert embedded.pid() == pid


def test_other_processes_reach_the_same_server(state_dir):
    q = emqfast.Queue("shared")  # no conn: embedded
    mine = q.enqueue({"from": "parent"})
    pid = embedded.pid()
    theirs = _child(f"""
        import emqfast
        from emqfast.server import embedded
        q = emqfast.Queue("shared")
        assert q.get({mine.id!r}).payload == {{"from": "parent"}}
        print(embedded.pid(), q.enqueue({{"from": "child"}}).id)
    """, state_dir)
    child_pid, child_job = theirs.split()
    assert int(child_pid) == pid
    assert q.get(child_job).payload == {"from": "child"}


def test_concurrent_first_use_starts_one_server(state_dir):
    code = textwrap.dedent("""
        import emqfast
        print(emqfast.connect().info("server")["process_id"])
    """)
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}
    env.update(EMQ_STATE_DIR=str(state_dir), PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    pids = {int(o.strip()) for o, _ in outs}
    assert pids == {embedded.pid()}


def test_data_survives_stop_and_restart(state_dir):
    q = emqfast.Queue("durable")
    refs = [q.enqueue({"n": i}) for i in range(3)] + [q.enqueue_in("later", 3_600_000)]
    first_pid = embedded.pid()
    assert embedded.stop() is True
    wait_until(lambda: not _alive(first_pid), what="embedded server exited")
    assert not embedded.is_running()
    q2 = emqfast.Queue("durable")  # restarts it
    assert embedded.pid() != first_pid
    assert [q2.get(r.id).payload for r in refs] == [{"n": 0}, {"n": 1}, {"n": 2}, "later"]
    assert q2.counts()["pending"] == 3 and q2.counts()["scheduled"] == 1
    assert emqfast.Worker(q2, lambda job: job.payload).run_until_idle(30).completed == 3


def test_wipe_deletes_the_data(state_dir):
    q = emqfast.Queue("doomed")
    ref = q.enqueue("x")
    pid = embedded.pid()
    embedded.wipe()
    wait_until(lambda: not _alive(pid), what="embedded server exited")
    assert not state_dir.exists() and not embedded.is_running()
    fresh = emqfast.Queue("doomed")  # starts an empty one
    assert fresh.get(ref.id) is None and fresh.counts()["pending"] == 0
