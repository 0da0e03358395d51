"""Apps under gevent (or eventlet) patch ``socket.socket`` for cooperative I/O. The C
core's hiredis socket is a plain blocking one, so emqfast must not use it there: each
round trip would stall every greenlet of the process. Such apps get redis-py's
Batcher, which talks through the patched sockets (the single-enqueue path)."""
from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import emqfast
from emqfast.backends import select

GEVENT_APP = textwrap.dedent("""
    from gevent import monkey
    monkey.patch_all()
    import sys
    import gevent
    import emqfast

    url, name = sys.argv[1], sys.argv[2]
    q = emqfast.Queue(name, emqfast.connect(url))
    ticks, seen = [0], []

    def ticker():
        while True:
            ticks[0] += 1
            gevent.sleep(0)

    def producer():
        for i in range(200):
            q.enqueue({"i": i})
            seen.append(ticks[0])
        q.enqueue_many([{"bulk": i} for i in range(500)])
        seen.append(ticks[0])

    t = gevent.spawn(ticker)
    gevent.spawn(producer).join()
    t.kill()
    # the ticker ran between the producer's round trips: the producer yielded on I/O
    print(len(set(seen)), q.counts()["pending"])
""")


def test_a_gevent_app_keeps_its_greenlets_running(redis_url, qname):
    out = subprocess.run([sys.executable, "-c", GEVENT_APP, redis_url, qname],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    distinct_ticks, pending = map(int, out.split())
    assert pending == 700
    assert distinct_ticks > 100  # a blocking socket would leave the ticker at one value


def test_a_patched_socket_class_selects_redis_py(redis_url, monkeypatch):
    client = emqfast.connect(redis_url)
    native = type(select.batcher_for(client)).__name__
    green = type("socket", (socket.socket,), {"__module__": "gevent._socket3"})
    monkeypatch.setattr(socket, "socket", green)
    assert type(select.batcher_for(client)).__module__ == "emqfast.backends.pure_batcher"
    monkeypatch.undo()
    assert type(select.batcher_for(client)).__name__ == native
