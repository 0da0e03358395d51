"""Test fixtures: a real redis-server per test session, never a fake.

Set ``EMQ_REDIS_URL`` to run against an existing server instead.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest
import redis

from waiting import wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis_server(extra_args=(), port=None, workdir=None):
    """Start ``redis-server`` on a free loopback port; return (proc, port, workdir).

    ``EMQ_REDIS_SERVER`` names another server binary (Redis 6.2, valkey-server: the server
    matrix, scripts/servermatrix.sh); by default the one on PATH."""
    exe = os.environ.get("EMQ_REDIS_SERVER") or shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not on PATH: run `make test`, which installs it")
    port = port or _free_port()
    workdir = workdir or tempfile.mkdtemp(prefix="emq-test-redis-")
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, *extra_args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server exited ({proc.returncode}) on port {port}")
            return False
    wait_until(answers, 10, f"redis-server on port {port} to answer PING", interval=0.02)
    client.close()
    return proc, port, workdir


@pytest.fixture(scope="session")
def redis_url():
    """URL of a real Redis for the whole session."""
    url = os.environ.get("EMQ_REDIS_URL")
    if url:
        yield url
        return
    proc, port, workdir = start_redis_server()
    yield f"redis://127.0.0.1:{port}/0"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def r(redis_url):
    """A plain redis-py client on the session server."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def conn(r):
    """The session server's client, under the name the dashboard tests give it."""
    return r


@pytest.fixture
def qname():
    """A queue name no other test uses."""
    return "t-" + uuid.uuid4().hex[:12]


def native_built() -> bool:
    """Whether the C core is built; under CI (``EMQ_REQUIRE_C=1``) a missing one fails the
    calling test: there it is a broken build, never a reason to test less."""
    import importlib

    # not `from emqfast import backend`: that name is the public backend() function
    backend_mod = importlib.import_module("emqfast.backend")
    if backend_mod.native_available():
        return True
    if os.environ.get("EMQ_REQUIRE_C") == "1":
        pytest.fail("C backend required (EMQ_REQUIRE_C=1) but not built: "
                    + backend_mod.native_error())
    return False


def require_native() -> None:
    """Skip the calling test when the C core is not built (fail under ``EMQ_REQUIRE_C=1``)."""
    if not native_built():
        import importlib

        backend_mod = importlib.import_module("emqfast.backend")
        pytest.skip("C extension not built: " + backend_mod.native_error())


@pytest.fixture(params=["python", "c"])
def backend(request):
    """Run the test under each backend; the C one must be built (CI builds it)."""
    import importlib

    import emqfast
    # not `from emqfast import backend`: that name is the public backend() function
    backend_mod = importlib.import_module("emqfast.backend")

    previous = backend_mod.current()
    if request.param == "c":
        require_native()
    backend_mod.use(request.param)
    yield request.param
    backend_mod.use(previous)
    assert emqfast.backend() == previous


def dump_queue(client: redis.Redis, queue: str) -> dict:
    """Byte-exact snapshot of every key of one queue (for "left Redis untouched").

    A hash in hashtable encoding is snapshotted as its sorted fields instead: its DUMP
    follows the dict's bucket order, which a mere HGET changes while the dict is being
    rehashed incrementally (a read, not a write)."""
    out = {}
    for key in sorted(client.scan_iter(match=f"emq:{{{queue}}}:*", count=1000)):
        if client.type(key) == b"hash" and client.object("encoding", key) == b"hashtable":
            out[key] = ("hashtable", sorted(client.hgetall(key).items()))
        else:
            out[key] = client.dump(key)
    return out
