"""The Redis a benchmark run talks to: a private ``redis-server`` (persistence
off, loopback, free port) started for the run, or ``EMQ_REDIS_URL``."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from contextlib import contextmanager
from typing import Iterator, List, Optional
from urllib.parse import urlparse

import redis


def free_port() -> int:
    """A TCP port nobody listens on right now (loopback)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchServer:
    """Where the benchmarks run. ``private`` servers are stopped and deleted by :meth:`stop`."""

    url: str
    private: bool
    proc: Optional[subprocess.Popen] = None
    workdir: Optional[str] = None
    _clients: List[redis.Redis] = field(default_factory=list)

    @property
    def host(self) -> str:
        """Host for tools that take ``-h`` (redis-benchmark)."""
        return urlparse(self.url).hostname or "127.0.0.1"

    @property
    def port(self) -> int:
        """Port for tools that take ``-p``."""
        return urlparse(self.url).port or 6379

    @property
    def password(self) -> Optional[str]:
        """Password from the URL, for tools that take ``-a`` (never printed)."""
        return urlparse(self.url).password

    @property
    def db(self) -> int:
        """Database number from the URL path (0 when absent)."""
        path = urlparse(self.url).path.strip("/")
        return int(path) if path.isdigit() else 0

    def client(self) -> redis.Redis:
        """A fresh redis-py client (closed by :meth:`stop`)."""
        c = redis.Redis.from_url(self.url)
        self._clients.append(c)
        return c

    def version(self) -> str:
        """The server's ``redis_version``."""
        return str(self.client().info("server").get("redis_version", "?"))

    def stop(self) -> None:
        """Close clients; stop and delete a private server."""
        for c in self._clients:
            c.close()
        self._clients.clear()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def __enter__(self) -> "BenchServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(url: Optional[str] = None, private: bool = False) -> BenchServer:
    """``url`` (or ``EMQ_REDIS_URL``) when given, else a private server on a free port
    (always a private one with ``private=True``)."""
    url = None if private else (url or os.environ.get("EMQ_REDIS_URL"))
    if url:
        server = BenchServer(url=url, private=False)
        server.client().ping()
        return server
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server is not on PATH (install it, or set EMQ_REDIS_URL)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="emq-bench-redis-")
    # Persistence off: the benchmarks measure the queue, not the disk.
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = BenchServer(url=f"redis://127.0.0.1:{port}/0", private=True, proc=proc,
                         workdir=workdir)
    probe = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                probe.ping()
                break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the private redis-server did not start") from None
                time.sleep(0.02)
    except BaseException:
        server.stop()
        raise
    finally:
        probe.close()
    return server


@contextmanager
def isolated(server: BenchServer) -> Iterator[BenchServer]:
    """A fresh private server (same binary and configuration) when ``server`` is private,
    for measurements of ``used_memory``: on the run's server the frees and main-dict
    resizes left by earlier workloads (1M keys deleted by promote and scale) land in the
    measuring window and skew it by hundreds of bytes per job. On a server the run does
    not own (``EMQ_REDIS_URL``) there is no such choice: ``server`` itself."""
    if not server.private:
        yield server
        return
    fresh = start(private=True)
    try:
        yield fresh
    finally:
        fresh.stop()
