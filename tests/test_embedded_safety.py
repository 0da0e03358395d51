"""The embedded server's socket, data dir and start-up, tried adversarially.

- long state dirs each get their own socket (never a shared /tmp one), in a per-user
  dir we verify we own (0700); a dir pre-created by someone else is refused;
- a deleted socket never leads to a second server on the same data dir;
- a socket left by ``kill -9`` is probed once, without retries;
- a bad state dir, or a redis-server that fails to start, is a ConnectionFailed saying
  what failed, where and what to do.

Every test stops what it started. The per-user socket root is a private directory
(never the real /tmp/emqfast-UID, which other runs on this machine may use)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import emqfast
from emqfast.server import embedded
from emqfast.core.errors import ConnectionFailed
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _servers_in(directory: Path) -> list:
    """Pids of every redis-server whose working dir is ``directory``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if "redis" in (entry / "comm").read_text() and \
                    os.path.realpath(os.readlink(entry / "cwd")) == os.path.realpath(directory):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def sandbox(monkeypatch):
    """A private socket root (sticky and world-writable, like /tmp) and a helper that
    makes state dirs; every server started in them is stopped at teardown."""
    base = Path(tempfile.mkdtemp(prefix="emq-safe-"))
    root = base / "root"
    root.mkdir()
    root.chmod(0o1777)
    monkeypatch.setattr(embedded, "SOCKET_ROOT", root)
    monkeypatch.delenv("EMQ_REDIS_URL", raising=False)
    made = []

    def state(name: str, long: bool = True) -> Path:
        path = base / name
        if long:  # past the unix-socket limit: the socket cannot live in the dir
            path = path / ("deep-" * 20) / "state"
        made.append(path)
        return path

    def use(path: Path) -> None:
        monkeypatch.setenv("EMQ_STATE_DIR", str(path))

    yield state, use, root
    for path in made:
        for pid in _servers_in(path):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def test_long_state_dirs_get_their_own_server_and_wipe_touches_only_its_own(sandbox):
    state, use, root = sandbox
    a, b = state("a"), state("b")
    use(a)
    sock_a = embedded.socket_path()
    job = emqfast.Queue("tenant").enqueue({"secret": "of A"})
    pid_a = embedded.pid()
    use(b)
    sock_b = embedded.socket_path()
    assert sock_a != sock_b and len(str(sock_a)) <= 100
    q_b = emqfast.Queue("tenant")
    assert q_b.get(job.id) is None  # B does not see A's jobs
    pid_b = embedded.pid()
    assert pid_b != pid_a and _alive(pid_a)
    runtime = sock_a.parent
    assert runtime.parent == root and runtime.stat().st_uid == os.geteuid()
    assert runtime.stat().st_mode & 0o777 == 0o700

    embedded.wipe()  # B's
    wait_until(lambda: not _alive(pid_b), what="B's server exited")
    assert not b.exists() and not sock_b.exists()
    use(a)
    assert _alive(pid_a) and embedded.is_running() and sock_a.exists()
    assert emqfast.Queue("tenant").get(job.id).payload == {"secret": "of A"}
    embedded.stop()


@pytest.mark.parametrize("how", ["another user's, mode 777", "ours but mode 777", "a symlink"])
def test_a_precreated_socket_dir_is_refused(sandbox, how):
    state, use, root = sandbox
    runtime = root / f"emqfast-{os.geteuid()}"
    if how == "a symlink":
        target = root / "elsewhere"
        target.mkdir(mode=0o700)
        runtime.symlink_to(target)
    else:
        runtime.mkdir()
        runtime.chmod(0o777)
        if how.startswith("another"):
            os.chown(runtime, 12345, 12345)  # tests run as root: pose as another local user
    directory = state("victim")
    use(directory)
    with pytest.raises(ConnectionFailed, match="refusing the embedded Redis socket dir"):
        emqfast.connect()
    assert not embedded.is_running() and _servers_in(directory) == []


def test_a_deleted_socket_never_starts_a_second_server(sandbox):
    state, use, _ = sandbox
    directory = state("short", long=False)
    use(directory)
    job = emqfast.Queue("keep").enqueue("x")
    first = embedded.pid()
    embedded.socket_path().unlink()  # someone cleaned up /tmp while it ran
    client = emqfast.connect()
    assert client.ping()
    assert _servers_in(directory) == [embedded.pid()]  # one server on this data dir
    assert embedded.pid() == first or not _alive(first)
    assert emqfast.Queue("keep", client).get(job.id).payload == "x"  # nothing lost
    # the pidfile deleted too: the server working in the dir is still found, not doubled
    embedded.socket_path().unlink()
    (directory / "redis.pid").unlink()
    assert emqfast.connect().ping()
    assert len(_servers_in(directory)) == 1
    assert emqfast.Queue("keep").get(job.id).payload == "x"
    embedded.stop()


def test_a_socket_left_by_kill_9_is_probed_once_without_retries(sandbox, monkeypatch):
    state, use, _ = sandbox
    use(state("killed", long=False))
    job = emqfast.Queue("after-kill").enqueue("x")
    pid = embedded.pid()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not _alive(pid), what="the server died")
    assert embedded.socket_path().exists()  # the leftover socket file

    attempts = []
    real_connect = socket.socket.connect

    def counting(self, address):
        attempts.append(address)
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counting)
    assert embedded.is_running() is False
    assert len(attempts) == 1  # one attempt: no retries, no backoff
    monkeypatch.setattr(socket.socket, "connect", real_connect)
    q = emqfast.Queue("after-kill")  # recovers: a fresh server on the same data
    assert q.get(job.id) is not None and embedded.pid() != pid
    embedded.stop()


def test_bad_state_dirs_are_a_connection_failed_that_says_what_to_do(sandbox):
    state, use, _ = sandbox
    base = state("bad", long=False).parent
    a_file = base / "a-file"
    a_file.write_text("")
    others = base / "others"
    others.mkdir(mode=0o700)
    os.chown(others, 12345, 12345)
    loose = base / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    cases = {a_file: "a file of that name exists", a_file / "sub": "a parent of it is a file",
             others: "owned by uid 12345", loose: "others can write to it"}
    for directory, why in cases.items():
        use(directory)
        with pytest.raises(ConnectionFailed) as info:
            emqfast.connect()
        text = str(info.value)
        assert why in text and "state dir" in text and "EMQ_STATE_DIR" in text, text
        assert info.value.__cause__ is None


def _cli(*args: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EMQ_REDIS_URL"}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    return subprocess.run([sys.executable, "-m", "emqfast", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_redis_server_that_fails_to_start_shows_its_own_error(sandbox):
    state, use, _ = sandbox
    no_log = state("nolog", long=False)
    (no_log / "redis.log").mkdir(parents=True)  # redis-server cannot open its log file
    no_log.chmod(0o700)
    use(no_log)
    with pytest.raises(ConnectionFailed, match="Can't open the log file"):
        emqfast.connect()
    corrupt = state("corrupt", long=False)
    (corrupt / "appendonlydir").mkdir(parents=True)
    corrupt.chmod(0o700)
    (corrupt / "appendonlydir" / "appendonly.aof.manifest").write_text("garbage\n")
    out = _cli("stats", env_extra={"EMQ_STATE_DIR": str(corrupt)})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "Invalid AOF manifest" in out.stderr and "CalledProcessError" not in out.stderr
    assert _servers_in(corrupt) == []
