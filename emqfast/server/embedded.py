"""The embedded Redis: a real ``redis-server`` on a unix socket in a per-user state dir.

``connect()`` with no URL starts it on first use (daemonized, so it outlives the
process that started it) and every later process of the same user finds the
running one instead of starting its own. Data persists there (AOF) until
``emqfast server stop`` stops it or ``emqfast server wipe`` deletes it.

Safety rules:

* The socket lives in a directory only its owner can write, checked (owner, mode,
  not a symlink) before every use. It is ``STATE_DIR/redis.sock`` when that path fits
  in a unix socket address, else ``/tmp/emqfast-UID/<hash of the state dir>.sock``
  (the per-user dir created 0700 and refused if anyone else owns it or it is looser):
  two state dirs never share a server, and no other user can stand in for ours.
* Never two servers on one data dir: before starting one, the pid recorded in the
  state dir is checked (alive, a redis-server, working in this dir). A live server
  whose socket file was deleted is stopped cleanly (SIGTERM: it flushes its AOF) and
  started again, never doubled.
* Liveness is probed with one raw PING on the socket, no retries: a socket left by a
  ``kill -9`` is seen dead at once.
* A state dir that cannot be used, or a redis-server that fails to start, raises
  :class:`ConnectionFailed` saying what failed, where, and what to do (with the
  server's own error lines).

The directory checks live in :mod:`emqfast.server.embedded_dirs`, the process side
(binary, spawn, PING probe, recognising our pid) in :mod:`emqfast.server.embedded_process`;
this module knows where things are and starts, stops and wipes the server.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any, Dict, Optional

from emqfast.core.errors import ConnectionFailed
from emqfast.server.embedded_dirs import (dir_problem, prepare_runtime_dir, prepare_state_dir,
                                          state_dir_error)
from emqfast.server.embedded_process import (PROBE_TIMEOUT_S, alive, is_our_server, ping_socket,
                                             read_log, server_working_in, spawn, tail,
                                             wait_exit)
from emqfast.server.embedded_process import find_server  # noqa: F401 - public here too

log = logging.getLogger("emqfast")

_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux
SOCKET_ROOT = Path("/tmp")  # where the per-user socket dir goes when the state dir is long


# --- where things are -------------------------------------------------------------------
def state_dir() -> Path:
    """``$EMQ_STATE_DIR``, else ``$XDG_STATE_HOME/emqfast``, else ``~/.local/state/emqfast``
    (always absolute: the socket path must not depend on the current directory)."""
    explicit = os.environ.get("EMQ_STATE_DIR")
    if explicit:
        return Path(os.path.abspath(os.path.expanduser(explicit)))
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(os.path.abspath(base)) / "emqfast"


def _runtime_dir() -> Path:
    """The per-user directory for sockets of state dirs too long to hold their own."""
    return SOCKET_ROOT / f"emqfast-{os.geteuid()}"


def socket_path() -> Path:
    """Unix socket of the embedded server: in the state dir when the path fits, else a
    name derived from the state dir in the per-user runtime dir (one per state dir)."""
    directory = state_dir()
    path = directory / "redis.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:20]
    return _runtime_dir() / f"{digest}.sock"


def url() -> str:
    """URL of the embedded server's socket."""
    return f"unix://{socket_path()}"


def _socket_dir_problem() -> Optional[str]:
    """Why the socket's directory must not be trusted now (None when it is fine or absent)."""
    directory = socket_path().parent
    return dir_problem(directory, exact_0700=directory == _runtime_dir())


def _prepare_dirs() -> Path:
    directory = state_dir()
    prepare_state_dir(directory)
    if socket_path().parent != directory:
        prepare_runtime_dir(socket_path().parent)
    return directory


# --- is it up? ----------------------------------------------------------------------------
def _probe() -> str:
    """``'up'``, ``'loading'`` or ``'down'``: one PING on the (trusted) socket."""
    path = socket_path()
    if not path.exists() or _socket_dir_problem():
        return "down"
    return ping_socket(path)


def is_running() -> bool:
    """True when the embedded server answers PING on its (trusted) socket."""
    return _probe() == "up"


# --- the recorded server --------------------------------------------------------------------
def pid() -> Optional[int]:
    """PID of the embedded server, when its pidfile exists."""
    try:
        return int((state_dir() / "redis.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _recorded_server(directory: Path) -> Optional[int]:
    """The pid of our live redis-server working in ``directory``: the recorded one, else
    (pidfile deleted too) any redis-server of ours whose working dir it is; else None."""
    process = pid()
    if process and is_our_server(process, directory):
        return process
    return server_working_in(directory)


def _stop_orphan(process: int, directory: Path) -> None:
    """Stop our live server whose socket file is gone (nothing can reach it any more):
    SIGTERM makes redis-server flush its AOF and exit cleanly."""
    log.warning("emqfast: the embedded redis-server (pid %d, %s) lost its socket %s; "
                "restarting it", process, directory, socket_path())
    os.kill(process, signal.SIGTERM)
    if not wait_exit(process, 15):
        raise ConnectionFailed(
            f"the embedded redis-server (pid {process}) in {directory} lost its socket "
            f"{socket_path()} and did not stop on SIGTERM; stop it (kill {process}) and retry")


# --- start / stop -----------------------------------------------------------------------------
def ensure_running(timeout_s: float = 15.0) -> str:
    """Start the embedded server unless one is already up; return its URL.

    A file lock makes concurrent first uses (several processes at once) start
    exactly one server; the recorded pid makes sure no second server ever runs on
    the same data dir.
    """
    directory = _prepare_dirs()  # before any probe: never talk to a socket we don't trust
    if is_running():
        return url()
    try:
        lock = os.fdopen(os.open(directory / "start.lock", os.O_WRONLY | os.O_CREAT, 0o600), "w")
    except OSError as exc:
        raise state_dir_error(directory, f"cannot write start.lock ({exc.strerror})") from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _probe() != "down" or _adopt_recorded(directory, timeout_s):
            _wait_up(directory, timeout_s, None)
            return url()
        _start(directory, timeout_s)
    return url()


def _adopt_recorded(directory: Path, timeout_s: float) -> bool:
    """True when our recorded server runs and its socket exists (it is still starting or
    loading: wait for it). A recorded server without its socket is stopped (False)."""
    process = _recorded_server(directory)
    if process is None:
        return False
    if socket_path().exists():
        return True
    _stop_orphan(process, directory)
    return False


def _start(directory: Path, timeout_s: float) -> None:
    socket_path().unlink(missing_ok=True)
    (directory / "redis.pid").unlink(missing_ok=True)
    spawn(directory, socket_path(), timeout_s)
    _wait_up(directory, timeout_s, started=True)


def _wait_up(directory: Path, timeout_s: float, started: Optional[bool]) -> None:
    """Wait until the server answers; fail fast with its log when it died starting."""
    began = time.monotonic()
    deadline = began + timeout_s
    seen_pid = False
    while not is_running():
        process = pid()
        if process and alive(process):
            seen_pid = True
        # the daemon writes its pidfile at once: gone (or never there after 1 s) = it died
        elif started and (seen_pid or time.monotonic() - began > 1.0):
            raise ConnectionFailed(
                f"the embedded redis-server exited while starting in {directory}; its log "
                f"({directory / 'redis.log'}) says:\n{tail(read_log(directory))}")
        if time.monotonic() > deadline:
            raise ConnectionFailed(
                f"the embedded redis-server did not answer within {timeout_s:.0f} s in "
                f"{directory}; its log says:\n{tail(read_log(directory))}")
        time.sleep(0.02)


def stop() -> bool:
    """Stop the embedded server (its data stays on disk). False if it was not running.

    A recorded server whose socket is gone is stopped too (SIGTERM)."""
    directory = state_dir()
    process = _recorded_server(directory)
    if not is_running():
        if process is None:
            return False
        os.kill(process, signal.SIGTERM)
        wait_exit(process, 10)
        return True
    _shutdown_over_socket()
    deadline = time.monotonic() + 10
    while (is_running() or (process and alive(process))) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def _shutdown_over_socket() -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # no retries: the server closing the connection is the success case, and redis-py's
    # default retry policy would spend seconds backing off and reconnecting to a socket
    # that is gone
    client = redis.Redis(unix_socket_path=str(socket_path()), retry=Retry(NoBackoff(), 0),
                         socket_connect_timeout=PROBE_TIMEOUT_S)
    try:
        client.shutdown(nosave=False)
    except redis.ConnectionError:
        pass  # the server closes the connection as it exits
    finally:
        client.close()


def wipe() -> None:
    """Stop the embedded server and delete its data (this state dir's only)."""
    stop()
    directory = state_dir()
    sock = socket_path()
    shutil.rmtree(directory, ignore_errors=True)
    if sock.parent != directory and not _socket_dir_problem():
        try:
            sock.unlink()
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise


def info() -> Dict[str, Any]:
    """Where the embedded server lives and whether it runs."""
    return {"state_dir": str(state_dir()), "socket": str(socket_path()),
            "running": is_running(), "url": url()}
