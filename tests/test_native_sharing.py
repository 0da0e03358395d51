"""The C Batcher's connection is shared per (process, thread, server), not held one per
Queue object: an app with many live queues must not hold one extra server connection
per Queue (2,000 queues -> 2,001 clients)."""
from __future__ import annotations

import importlib
import os
import threading

import pytest
import redis

import emqfast

from conftest import require_native

backend = importlib.import_module("emqfast.backend")  # emqfast.backend is also a function


@pytest.fixture
def c_backend():
    require_native()
    previous = backend.current()
    backend.use("c")
    yield
    backend.use(previous)


def _clients(r: redis.Redis) -> int:
    return int(r.info("clients")["connected_clients"])


def test_ten_thousand_live_queues_use_o_threads_connections(c_backend, redis_url, r, qname):
    before = _clients(r)
    client = redis.Redis.from_url(redis_url)
    other = redis.Redis.from_url(redis_url)  # another client on the same server and db
    queues = [emqfast.Queue(qname, client if i % 2 else other) for i in range(8_000)]

    def tenant(slice_: list) -> None:
        for q in slice_:
            q.enqueue_many(["x"])

    tenant(queues)  # the main thread
    threads = [threading.Thread(target=tenant, args=([emqfast.Queue(qname, client)
                                                      for _ in range(500)],))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(queues) == 8_000  # every Queue object is still alive
    # one C connection for the main thread, at most one per worker thread while it ran,
    # plus the redis-py connections of the two clients
    assert _clients(r) - before <= 1 + 4 + 2
    assert emqfast.Queue(qname, r).counts()["pending"] == 10_000
    client.close()
    other.close()


def test_a_forked_child_opens_its_own_connection(c_backend, redis_url, r, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue_many(["parent"])
    inherited = backend.batcher_for(q.redis).batcher()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            mine = backend.batcher_for(q.redis).batcher()
            for _ in range(50):
                q.enqueue_many(["child"] * 20)
            code = 0 if mine is not inherited else 3
        finally:
            os._exit(code)
    for _ in range(50):  # the parent goes on on its own socket meanwhile
        q.enqueue_many(["parent"] * 20)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    q.enqueue_many(["parent"])  # the child closing its copy left ours working
    assert backend.batcher_for(q.redis).batcher() is inherited
    assert q.counts()["pending"] == 2 + 50 * 20 * 2


def test_python_backend_never_loads_the_c_extension():
    import subprocess
    import sys
    code = ("import sys, emqfast\n"
            "q = emqfast.Queue('x', 'redis://127.0.0.1:1/0')\n"
            "assert emqfast.backend() == 'python'\n"
            "print(sorted(m for m in sys.modules if '_native' in m or '_emqcore' in m))\n")
    env = {**os.environ, "EMQFAST_BACKEND": "python"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
