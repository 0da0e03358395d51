"""Helpers shared by the engine contract tests (tests/test_engine_*.py).

Everything here waits on *conditions* with deadlines (tests/waiting.py); nothing sleeps
and hopes.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator, List, Optional

import pytest
import redis

import emqfast
from emqfast.core import ids
from emqfast.backends.scripts import load
from emqfast.worker.calls import start_rows
from emqfast.core.version import KEYSPACE_VERSION

from waiting import wait_until


def make_queue(redis_url: str, qname: str, client_name: Optional[str] = None,
               **opts: Any) -> emqfast.Queue:
    """A Queue on its own client (named, so CLIENT LIST can tell its connections apart)."""
    client = redis.Redis.from_url(redis_url, client_name=client_name)
    return emqfast.Queue(qname, client, **opts)


def blocked_on_marker(r: redis.Redis, client_name: str) -> bool:
    """True while a connection named ``client_name`` is blocked in BZPOPMIN (an idle worker)."""
    return any(c.get("name") == client_name and "b" in c.get("flags", "")
               and c.get("cmd") == "bzpopmin" for c in r.client_list())


def server_ms(r: redis.Redis) -> int:
    """The Redis server clock in epoch ms."""
    sec, usec = r.time()
    return sec * 1000 + usec // 1000


def wait_server_past(r: redis.Redis, ms: int, timeout: float = 15.0) -> None:
    """Wait until the Redis server clock is strictly past ``ms`` (epoch ms)."""
    wait_until(lambda: server_ms(r) > ms, timeout=timeout, what=f"server clock past {ms}")


@contextlib.contextmanager
def running_worker(worker: emqfast.Worker) -> Iterator[emqfast.Worker]:
    """Run ``worker.run()`` in a thread for the block; stop it and re-raise its error after."""
    errors: List[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive(), "worker thread did not stop"
    if errors:
        raise errors[0]


@pytest.fixture
def skewed_local_clock(monkeypatch):
    """This process's wall clock a day ahead: code timing anything locally is caught out.

    The id minter never goes back in time once it saw tomorrow, so its state is restored
    too (monkeypatch undoes all three), or later tests would mint ids dated tomorrow.
    """
    skew_s = 86_400
    real_time, real_ns = time.time, time.time_ns
    monkeypatch.setattr(ids, "_last_ms", ids._last_ms)
    monkeypatch.setattr(ids, "_counter", ids._counter)
    monkeypatch.setattr(time, "time", lambda: real_time() + skew_s)
    monkeypatch.setattr(time, "time_ns", lambda: real_ns() + skew_s * 10 ** 9)
    return skew_s * 1000


# --- driving the Lua moves directly (a "zombie" worker with no beat) ---------------

def claim(q: emqfast.Queue, worker: str, lease_ms: int, n: int = 1) -> List[tuple]:
    """claim.lua + start.lua as a bare client would: ``[(job_id, token), ...]`` now active."""
    k = q.keys
    reply = load("claim")(q.redis, [k.pending, k.active, k.leases, k.meta, k.marker, k.delayed,
                                    k.counter, k.rate], [n, lease_ms, worker, KEYSPACE_VERSION])
    pairs = [(reply[i].decode(), reply[i + 1].decode()) for i in range(3, len(reply), 2)]
    if pairs:
        ids = [i for i, _ in pairs]
        rows = load("start")(q.redis, [k.active, k.leases, k.meta, k.events, k.metrics, k.rate,
                                       k.delayed, k.marker, k.grate, k.waiters,
                                       k.dependents, k.outbox, k.expired, *k.jobs(ids)],
                             [KEYSPACE_VERSION, *[x for p in pairs for x in p]])
        assert all(start_rows(rows)), rows
    return pairs


def complete(q: emqfast.Queue, job_id: str, token: str, result: bytes = b"null") -> Any:
    """complete.lua with ``token``."""
    return complete_many(q, [(job_id, token, result)])[0]


def complete_many(q: emqfast.Queue, triples: List[tuple]) -> List[Any]:
    """complete.lua for many ``(job id, token, result)`` in one call: one entry per job,
    ``[wait, run]`` or a raised :class:`emqfast.LeaseLost` when that job's lease is gone."""
    k = q.keys
    # no run record: the script reads each job's attempt and times from its hash
    reply = load("complete")(q.redis, [k.active, k.leases, k.completed, k.meta, k.events,
                                       k.metrics, k.waiters, k.dependents, k.outbox,
                                       *k.jobs([t[0] for t in triples])],
                             [KEYSPACE_VERSION, *[x for t in triples for x in (*t, "")]])
    for entry in reply:
        if isinstance(entry, bytes):
            raise emqfast.errors.from_reply(entry.decode())
    return reply


def fail(q: emqfast.Queue, job_id: str, token: str, delay: int = -1,
         error: str = "E: x", tb: str = "tb") -> Any:
    """fail.lua with ``token`` (``delay`` -1: no retry)."""
    k = q.keys
    return load("fail")(q.redis, [k.job(job_id), k.active, k.leases, k.failed, k.delayed,
                                  k.pending, k.marker, k.meta, k.events, k.metrics,
                                  k.waiters, k.dependents, k.outbox],
                        [job_id, token, delay, error, tb, KEYSPACE_VERSION])


def extend(q: emqfast.Queue, lease_ms: int, *pairs: tuple) -> List[int]:
    """extend.lua for ``(job_id, token)`` pairs."""
    k = q.keys
    return load("extend")(q.redis, [k.active, k.leases, k.meta],
                          [lease_ms, KEYSPACE_VERSION, *[x for p in pairs for x in p]])


def release(q: emqfast.Queue, job_id: str, token: str) -> Any:
    """release.lua with ``token``."""
    k = q.keys
    return load("release")(q.redis, [k.job(job_id), k.active, k.leases, k.pending, k.marker,
                                     k.meta, k.events], [job_id, token, KEYSPACE_VERSION])


def raised(call: Any) -> Optional[BaseException]:
    """What ``call()`` raised (an Exception), or None when it returned."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the caller inspects it
        return exc
    return None
