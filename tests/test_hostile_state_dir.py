"""Another local user must not read the embedded server's data: a state dir of ours
that others can read is made 0700 before the server starts, and redis-server runs under
umask 077, so its AOF, log and pidfile are private too. Tried with a real second user
(``useradd``, removed afterwards) reading the files a payload was written to."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

import emqfast
from emqfast.server import embedded
from waiting import wait_until

if os.geteuid() != 0 or not (shutil.which("useradd") and shutil.which("runuser")):
    pytest.skip("needs root with useradd/runuser to make a second local user",
                allow_module_level=True)


@pytest.fixture
def other_user():
    """A second local user (no home, no login), removed afterwards."""
    name = "emqprobe" + secrets.token_hex(3)
    subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    yield name
    subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def open_state_dir(monkeypatch):
    """A state dir that already exists with mode 0755 under a parent anyone may enter."""
    base = Path(tempfile.mkdtemp(prefix="emq-open-"))
    base.chmod(0o755)
    state = base / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    monkeypatch.setenv("EMQ_STATE_DIR", str(state))
    monkeypatch.delenv("EMQ_REDIS_URL", raising=False)
    yield state
    pid = embedded.pid()
    if pid:
        os.kill(pid, signal.SIGKILL)
    shutil.rmtree(base, ignore_errors=True)


def _as(user: str, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", *command], capture_output=True,
                          timeout=60)


def _files(directory: Path):
    return [p for p in directory.rglob("*") if p.is_file() and not p.is_socket()]


def test_another_user_cannot_read_a_payload_from_the_state_dir(open_state_dir, other_user):
    secret = "card-4111-" + secrets.token_hex(8)
    client = emqfast.connect()
    emqfast.Queue("private", client).enqueue({"card": secret})

    def written() -> bool:
        return any(secret.encode() in p.read_bytes() for p in _files(open_state_dir))

    wait_until(written, what="the payload in the AOF")
    client.close()
    assert stat.S_IMODE(open_state_dir.stat().st_mode) == 0o700
    for path in _files(open_state_dir):
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, (path, oct(path.stat().st_mode))
        got = _as(other_user, "cat", str(path))
        assert got.returncode != 0 and secret.encode() not in got.stdout, path
    listing = _as(other_user, "ls", str(open_state_dir))
    assert listing.returncode != 0


def test_a_state_dir_others_can_write_is_still_refused(open_state_dir):
    open_state_dir.chmod(0o777)
    with pytest.raises(emqfast.ConnectionFailed, match="others can write to it"):
        emqfast.connect()
    assert stat.S_IMODE(open_state_dir.stat().st_mode) == 0o777  # not silently adopted
