"""ref.wait where the wire is not simple: a pub/sub connection killed while
waiting (re-subscribed, and the job re-read: an end while it was down is not missed), a
real 3-master Redis Cluster (queues on every master, the waiter's pub/sub connection on
one node: PUBLISH is broadcast), and TLS, on both facades."""
from __future__ import annotations

import asyncio
import importlib
import os
import sys
import threading
from typing import Any, List

import pytest
import redis
import redis.asyncio

import emqfast
import emqfast.aio as emq
from cluster_util import names_over_masters, start_cluster
from test_wait_result import Waits, _conn, registered
from waiting import wait_until

pytestmark = pytest.mark.timeout(180)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _echo(job: emqfast.Job) -> Any:
    return job.payload


@pytest.fixture(params=["sync", "aio"])
def facade(request):
    return request.param


# --- a dropped pub/sub connection ------------------------------------------------------------

def _retrying(facade: str, url: str) -> Any:
    """A client of the user's own, that re-connects by itself (redis-py's retries)."""
    if facade == "aio":
        from redis.asyncio.retry import Retry as ARetry
        from redis.backoff import ExponentialBackoff
        return lambda: redis.asyncio.Redis.from_url(url, retry=ARetry(ExponentialBackoff(), 3))
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry
    return lambda: redis.Redis.from_url(url, retry=Retry(ExponentialBackoff(), 3))


@pytest.mark.parametrize("client", ["emqfast", "retrying"])
@pytest.mark.parametrize("when", ["while_down", "after_resubscribe"])
def test_a_killed_pubsub_connection_resubscribes_and_rereads(facade, redis_url, qname, r,
                                                              when, client):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"lesson": 1})
    channel = q.keys.done_channel(ref.id)
    conn = _conn(facade, redis_url) if client == "emqfast" else _retrying(facade, redis_url)
    waits = Waits(facade, conn, qname, [ref.id], 60)
    wait_until(lambda: registered(r, q, [ref.id]), what="the waiter registered")
    assert r.client_kill_filter(_type="pubsub") >= 1
    if when == "after_resubscribe":  # the end is published to the new connection
        wait_until(lambda: r.pubsub_numsub(channel)[0][1] == 1, what="re-subscribed")
    # else: ended at once, most likely before the re-subscribe: only the re-read sees it
    emqfast.Worker(q, _echo).run_until_idle(timeout_s=30)
    assert waits.results() == [{"lesson": 1}]
    assert r.exists(q.keys.waiters) == 0


# --- Redis Cluster ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


def test_cluster_waits_on_every_master_sync(cluster, qname):
    conn = emqfast.connect(cluster.url)
    qs = [emqfast.Queue(n, conn) for n in names_over_masters(cluster, 1, qname)]
    refs = [q.enqueue({"q": i}) for i, q in enumerate(qs)]
    bad = qs[2].enqueue({"q": "bad"}, attempts=1)
    out: List[Any] = []
    t = threading.Thread(target=lambda: out.extend(
        emqfast.wait_all([*refs, bad], 60, return_exceptions=True)))
    t.start()
    wait_until(lambda: all(conn.hlen(q.keys.waiters) for q in qs), what="registered")

    def handler(job: emqfast.Job) -> Any:
        if job.payload["q"] == "bad":
            raise ValueError("not on this master")
        return job.payload["q"] * 10
    emqfast.Worker(qs, handler).run_until_idle(timeout_s=60)
    t.join(60)
    assert out[:3] == [0, 10, 20]
    assert isinstance(out[3], emqfast.JobFailed) and "not on this master" in out[3].error
    assert qs[0].ref(refs[0].id).wait(0) == 0  # already ended: answered without waiting
    conn.close()


def test_cluster_waits_on_every_master_aio(cluster, qname):
    names = names_over_masters(cluster, 1, qname)

    async def main() -> None:
        client = emq.connect(cluster.url)
        qs = [emq.Queue(n, client) for n in names]
        refs = [await q.enqueue({"q": i}) for i, q in enumerate(qs)]
        task = asyncio.ensure_future(emq.wait_all(refs, 60))
        for q in qs:
            while not await client.hlen(q.keys.waiters):
                await asyncio.sleep(0.01)

        async def handler(job: emqfast.Job) -> Any:
            return job.payload["q"] + 100
        await emq.Worker(qs, handler).run_until_idle(timeout_s=60)
        assert await task == [100, 101, 102]
        assert await refs[1].wait(0) == 101
        await client.aclose()
    asyncio.run(main())


# --- TLS --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tls_srv():
    try:
        tls = importlib.import_module("emqfast.bench.tls")
    except ModuleNotFoundError:
        sys.path.insert(0, ROOT)
        tls = importlib.import_module("bench.tls")
    try:
        server = tls.start_tls_server()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()


def _tls_kw(server: Any) -> dict:
    return dict(host="127.0.0.1", port=server.tls_port, ssl=True,
                ssl_ca_certs=str(server.certs["ca.crt"]),
                ssl_certfile=str(server.certs["client.crt"]),
                ssl_keyfile=str(server.certs["client.key"]))


def test_tls_waits(facade, tls_srv, qname, backend):
    kw = _tls_kw(tls_srv)
    q = emqfast.Queue(qname, redis.Redis(**kw))
    refs = q.enqueue_many([{"n": i} for i in range(20)])
    make = (lambda: redis.asyncio.Redis(**kw)) if facade == "aio" else (lambda: redis.Redis(**kw))
    waits = Waits(facade, make, qname, [x.id for x in refs], 60)
    plain = redis.Redis(port=tls_srv.port)
    wait_until(lambda: plain.hlen(q.keys.waiters) == 20, what="20 waiters over TLS")
    emqfast.Worker(q, _echo).run_until_idle(timeout_s=60)
    assert waits.results() == [{"n": i} for i in range(20)]
    plain.close()


# --- the README's least-privilege ACL user -------------------------------------------------

def test_a_least_privilege_user_waits(facade, backend):
    import shutil
    from conftest import start_redis_server
    from lua_static import readme_least_privilege

    proc, port, workdir = start_redis_server(["--user", "emquser", "on", ">emq-pw", "~emq:*",
                                              "resetchannels", *readme_least_privilege()])
    url = f"redis://emquser:emq-pw@127.0.0.1:{port}/0"
    admin = redis.Redis(port=port)
    try:
        q = emqfast.Queue("acl-wait", url)
        ok, bad = q.enqueue({"ok": 1}), q.enqueue({"bad": 1}, attempts=1)
        waits = Waits(facade, _conn(facade, url), "acl-wait", [ok.id, bad.id], 60)
        wait_until(lambda: admin.hlen(q.keys.waiters) == 2, what="two waiters registered")

        def handler(job: emqfast.Job) -> Any:
            if "bad" in job.payload:
                raise KeyError("bad")
            return job.payload
        emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
        value, failed = waits.results()
        assert value == {"ok": 1} and isinstance(failed, emqfast.JobFailed)
        assert q.wait_many([ok.id], 0) == [{"ok": 1}]
        refused = {e.get("object") for e in admin.acl_log()}
        assert refused <= {"client|id", "client|unblock", "config|get"}, refused
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


# --- no polling ---------------------------------------------------------------------------

def test_a_long_wait_sends_a_bounded_number_of_commands(facade):
    """A wait costs the same few commands however long it lasts (SUBSCRIBE, the register
    script, the read or the unregister, UNSUBSCRIBE): nothing is polled meanwhile."""
    import shutil
    from conftest import start_redis_server

    proc, port, workdir = start_redis_server()
    url = f"redis://127.0.0.1:{port}/0"
    admin = redis.Redis(port=port)
    try:
        q = emqfast.Queue("quiet", url)
        refs = [q.enqueue({"n": i}) for i in range(3)]  # nobody runs them
        counted = lambda: int(admin.info("stats")["total_commands_processed"])  # noqa: E731
        used = []
        for timeout_s in (0.1, 0.2, 2.0):  # (the first pays for loading the scripts)
            before = counted()
            [err] = Waits(facade, _conn(facade, url), "quiet", [refs[0].id], timeout_s,
                          ).results()
            assert isinstance(err, emqfast.WaitTimeout)
            used.append(counted() - before - 1)  # (less this INFO)
        # ten times longer, the same commands (a 1 ms poll would send ~2000 more)
        assert used[2] <= used[1] + 1 and used[2] <= 20, used
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_reader_left_unused_closes_without_a_command(facade, monkeypatch):
    """Once its last wait ends, the pub/sub reader closes at its linger without PINGing
    the connection it is about to drop (a quiet connection is probed only while someone
    waits on it), so an idle process sends Redis nothing."""
    import shutil
    from conftest import start_redis_server
    from emqfast.aio import job_wait
    from emqfast.facade import wait_reader
    from waiting import wait_until_async

    monkeypatch.setattr(wait_reader, "QUIET_S", 0.2)  # probe soon, linger longer
    monkeypatch.setattr(job_wait, "LINGER_S", 1.0)
    proc, port, workdir = start_redis_server()
    url = f"redis://127.0.0.1:{port}/0"
    admin = redis.Redis(port=port)
    pings = lambda: admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0)  # noqa
    subscribers = lambda: sum(1 for c in admin.client_list()  # noqa: E731
                              if int(c.get("sub", 0)) or int(c.get("psub", 0)))
    try:
        ref = emqfast.Queue("idle", url).enqueue({"n": 1})  # nobody runs it
        if facade == "sync":
            q = emqfast.Queue("idle", url)  # (held: an app's queue outlives its waits)
            with pytest.raises(emqfast.WaitTimeout):
                q.ref(ref.id).wait(0.3)
            before = pings()
            wait_until(lambda: subscribers() == 0, timeout=30, what="the reader closed")
        else:
            async def main() -> int:  # (the loop lives on past the wait, to its linger)
                q = emq.Queue("idle", url)
                with pytest.raises(emqfast.WaitTimeout):
                    await q.ref(ref.id).wait(0.3)
                seen = pings()
                await wait_until_async(lambda: subscribers() == 0, timeout=30,
                                       what="the reader closed")
                return seen
            before = asyncio.run(main())
        assert pings() == before, "an unused reader PINGed the connection it closed"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
