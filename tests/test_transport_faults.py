"""The transport and enqueue layer under faults: lost replies are never re-sent blindly,
partial batches are reported, connection failures are typed, a full server is a partial
batch, WAIT durability, and enqueue scripts check everything before their first write.

Faults come from a real loopback proxy (tests/fault_proxy.py) in front of a real
redis-server; the OOM and replica cases use private redis-servers.
"""
from __future__ import annotations

import asyncio
import shutil
import socket
import uuid

import pytest
import redis

import emqfast
import emqfast.aio
from emqfast.core import errors
from emqfast.facade import admission, enqueue_batch
from emqfast.backends import scripts, transport
from conftest import dump_queue, start_redis_server
from fault_proxy import FaultProxy, _Link, upstream_port_of
from waiting import wait_until


# --- a precise cut: the fault proxy, cutting after exactly N reply bytes -----------------

class _BudgetLink(_Link):
    """A proxied connection that, once armed, forwards exactly ``budget`` more reply bytes
    and then closes both sides: every request sent has reached Redis (and run), the
    replies past the budget are lost."""

    budget = None

    def _pump(self, direction, src, dst):  # type: ignore[override]
        if direction == "c2s":
            return super()._pump(direction, src, dst)
        import select
        try:
            while not self.closed.is_set() and not self.proxy._stopped.is_set():
                ready, _, _ = select.select([src], [], [], 0.05)
                if not ready:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                budget = self.proxy.budget
                if budget is not None:
                    if len(data) >= budget:
                        dst.sendall(data[:budget])
                        self.proxy._count("cut_s2c")
                        self.close()
                        return
                    self.proxy.budget = budget - len(data)
                dst.sendall(data)
        except OSError:
            pass
        self.close()


class BudgetProxy(FaultProxy):
    """:class:`FaultProxy` whose ``cut_after(n)`` cuts every connection after exactly
    ``n`` more bytes of replies."""

    budget = None

    def cut_after(self, nbytes: int) -> None:
        self.budget = nbytes

    def _serve(self, client):  # type: ignore[override]
        upstream = socket.create_connection(self.upstream, timeout=5)
        upstream.settimeout(None)
        with self._links_lock:
            self._next_id += 1
            link = _BudgetLink(self, self._next_id, client, upstream)
            self._links[link.cid] = link
        link.start()


@pytest.fixture
def proxy(redis_url):
    with BudgetProxy(upstream_port_of(redis_url), seed=5) as p:
        yield p


def _evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def _queue(url_or_client, qname, **kw):
    return emqfast.Queue(qname, url_or_client, **kw)


def _only_link(proxy: FaultProxy, client=None) -> None:
    """Close the redis-py pool's idle connections (the C Batcher keeps its own), then
    wait until the proxy's links are down to what is in use."""
    if client is not None:
        client.connection_pool.disconnect()
    wait_until(lambda: proxy.live() <= 1, 5, "the proxy's links down to the one in use",
               interval=0.01)


# --- a lost reply is never re-sent -------------------------------------------------------

def test_lost_reply_is_reported_not_resent(backend, proxy, r, qname):
    """redis-py's default Retry would send the EVALSHA again (a duplicate ref, two runs)."""
    client = redis.Redis(port=proxy.port)  # a user's client: default retry policy
    q = _queue(client, qname)
    q.enqueue("warm")
    before = _evalsha_calls(r)
    proxy.cut_after(0)
    from emqfast.core import ids
    job_id = ids.new_id()
    with pytest.raises(errors.ReplyLost) as info:
        q.enqueue("x", job_id=job_id)
    assert info.value.sent is True and isinstance(info.value, ConnectionError)
    assert _evalsha_calls(r) - before == 1  # sent once, ran once
    assert r.exists(q.keys.job(job_id))
    proxy.cut_after(None)
    assert q.enqueue("x", job_id=job_id).status == "duplicate"  # the pool reconnects


def test_lost_pipeline_reply_is_not_resent(proxy, r, qname):
    """The worker path (scripts.run_pipeline): a cut batch is a BatchCut with the replies
    that arrived, never a whole pipeline sent again."""
    client = redis.Redis(port=proxy.port)
    q = _queue(client, qname)
    q.enqueue("warm")
    from emqfast.core import ids
    calls = [(admission.ENQUEUE, [q.keys.job(j), *q._fixed_keys()],
              [j, b'"p"', "j", "", 0, "now", 0, emqfast.KEYSPACE_VERSION])
             for j in ids.new_ids(20)]
    before = _evalsha_calls(r)
    proxy.cut_after(4 * 5)  # five ":1\r\n" replies
    with pytest.raises(transport.BatchCut) as info:
        scripts.run_pipeline(client, calls)
    assert info.value.replies[:5] == [1] * 5
    assert set(map(repr, info.value.replies[5:])) <= {"LOST", "UNSENT"}
    assert _evalsha_calls(r) - before == 20


def test_aio_lost_reply_is_not_resent(proxy, r, qname):
    async def main():
        import redis.asyncio as aredis
        client = aredis.Redis(port=proxy.port)
        q = emqfast.aio.Queue(qname, client)
        await q.enqueue("warm")
        before = _evalsha_calls(r)
        proxy.cut_after(0)
        with pytest.raises(errors.ReplyLost):
            await q.enqueue("x")
        assert _evalsha_calls(r) - before == 1
        await client.aclose()
    asyncio.run(main())


# --- typed connection errors -------------------------------------------------------------

def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def test_dead_server_raises_connection_failed(backend, qname):
    q = emqfast.Queue(qname, _dead_url())
    for call in (lambda: q.enqueue("x"), lambda: q.enqueue_many(["a", "b"]),
                 lambda: q.enqueue_in("x", 10), lambda: q.counts()):
        with pytest.raises(errors.ConnectionFailed) as info:
            call()
        assert info.value.sent is False and isinstance(info.value, ConnectionError)
    # a user's client with redis-py's default retry: still typed, still not sent
    q = emqfast.Queue(qname, redis.Redis.from_url(_dead_url()))
    with pytest.raises(errors.ConnectionFailed):
        q.enqueue("x")


def test_aio_dead_server_raises_connection_failed(qname):
    async def main():
        q = emqfast.aio.Queue(qname, _dead_url())
        with pytest.raises(errors.ConnectionFailed) as info:
            await q.enqueue("x")
        assert info.value.sent is False
        with pytest.raises(errors.ConnectionFailed):
            await q.enqueue_many(["a", "b"])
    asyncio.run(main())


def test_connect_builds_clients_without_command_retry():
    client = emqfast.connect(_dead_url())
    assert client.connection_pool.make_connection().retry.get_retries() == 0
    aclient = emqfast.aio.connect(_dead_url())
    assert aclient.connection_pool.connection_kwargs["retry"].get_retries() == 0


# --- mid-batch disconnects are partial results -------------------------------------------

MANY_LANDED = 200  # enqueue_many.lua: the chunks whose whole reply fits 1000 bytes


def _check_partial(err: errors.PartialBatch, ids, r, q, landed: int, group=None) -> None:
    assert len(err.landed) == landed, (len(err.landed), len(err.unknown), len(err.not_sent))
    assert [ref.id for ref in err.landed] == ids[:landed]
    assert all(ref.status == "pending" for ref in err.landed)
    assert sorted([ref.id for ref in err.landed] + err.unknown + err.not_sent) == sorted(ids)
    assert all(r.exists(q.keys.job(j)) for j in ids[:landed])
    assert not any(r.exists(q.keys.job(j)) for j in err.not_sent)
    assert isinstance(err.__cause__, errors.ConnectionFailed)


def _after_retry(refs, err, ids, r, q, group=None) -> None:
    assert [ref.id for ref in refs] == ids
    assert q.counts()["pending"] == len(ids)  # every job once
    status = {ref.id: ref.status for ref in refs}
    assert "duplicate" not in status.values()
    for j in err.unknown:  # a job whose reply was lost but which had landed: recovered
        assert status[j] in ("recovered", "pending")
    assert any(status[j] == "recovered" for j in err.unknown) or not err.unknown


@pytest.mark.parametrize("group", [None, "g"])
def test_mid_batch_cut_reports_what_landed(backend, proxy, r, qname, monkeypatch, group):
    monkeypatch.setattr(enqueue_batch, "ENQUEUE_CHUNK", 100)  # earlier chunks' results count too
    client = redis.Redis(port=proxy.port)
    q = _queue(client, qname)
    [warm] = q.enqueue_many(["warm"], group=group)  # connects the C Batcher, loads the script
    assert q.cancel(warm.id)  # count this test's jobs only
    _only_link(proxy, client if backend == "c" else None)
    from emqfast.core import ids
    job_ids = ids.new_ids(500)
    # chunks of 100: grouped, each sent as 1 (its ACL check) + 99 calls with a 4-byte
    # reply each (250 land); ungrouped, one enqueue_many.lua call per chunk whose reply is
    # an array of 100 statuses (406 bytes): two chunks land, the third is unknown
    proxy.cut_after(4 * 250)
    with pytest.raises(errors.PartialBatch) as info:
        q.enqueue_many(["p"] * 500, job_ids=job_ids, group=group)
    proxy.cut_after(None)
    err = info.value
    _check_partial(err, job_ids, r, q, landed=250 if group else MANY_LANDED, group=group)
    if not group:  # a whole call's reply lost: each of its jobs is unknown
        assert len(err.unknown) == 100
    assert len(err.not_sent) >= 200  # chunks 4 and 5 never left
    refs = q.retry_partial(err)
    _after_retry(refs, err, job_ids, r, q, group=group)
    # re-sending the ids by hand is safe too: nothing duplicated
    again = q.enqueue_many(["p"] * 500, job_ids=job_ids, group=group)
    assert {ref.status for ref in again} == {"duplicate"}
    assert q.counts()["pending"] == 500


def test_aio_mid_batch_cut_reports_what_landed(proxy, r, qname, monkeypatch):
    monkeypatch.setattr(enqueue_batch, "ENQUEUE_CHUNK", 100)

    async def main():
        import redis.asyncio as aredis
        client = aredis.Redis(port=proxy.port)
        q = emqfast.aio.Queue(qname, client)
        await q.enqueue("warm")
        r.delete(q.keys.pending)
        from emqfast.core import ids
        job_ids = ids.new_ids(500)
        proxy.cut_after(4 * 250)
        with pytest.raises(errors.PartialBatch) as info:
            await q.enqueue_many(["p"] * 500, job_ids=job_ids)
        proxy.cut_after(None)
        _check_partial(info.value, job_ids, r, q, landed=MANY_LANDED)
        refs = await q.retry_partial(info.value)
        _after_retry(refs, info.value, job_ids, r, emqfast.Queue(qname, r))  # sync reads
        await client.aclose()
    asyncio.run(main())


# --- a full server -----------------------------------------------------------------------

@pytest.fixture
def full_server():
    started = []

    def start(*extra):
        proc, port, workdir = start_redis_server(("--maxmemory", "3mb",
                                                  "--maxmemory-policy", "noeviction", *extra))
        started.append((proc, workdir))
        return port
    yield start
    for proc, workdir in started:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _check_full(err: errors.PartialBatch, job_ids, admin, q) -> None:
    assert isinstance(err.__cause__, errors.ServerFull)
    assert err.landed and err.not_sent and not err.unknown
    assert admin.zcard(q.keys.pending) == len(err.landed)
    assert all(admin.exists(q.keys.job(ref.id)) for ref in err.landed)
    assert not any(admin.exists(q.keys.job(j)) for j in err.not_sent)
    assert sorted([ref.id for ref in err.landed] + err.not_sent) == sorted(job_ids)


def test_full_server_is_a_partial_batch(backend, full_server, qname):
    port = full_server()
    admin = redis.Redis(port=port)
    q = emqfast.Queue(qname, f"redis://127.0.0.1:{port}/0")
    from emqfast.core import ids
    job_ids = ids.new_ids(5000)
    with pytest.raises(errors.PartialBatch) as info:
        q.enqueue_many(["x" * 1000] * 5000, job_ids=job_ids)
    _check_full(info.value, job_ids, admin, q)
    # Once the batch buffers are freed the server may sit a few KB under its cap, so a lone
    # job can still fit; keep writing until refused. A refused write is the plain typed
    # error and leaves nothing behind.
    _refused_cleanly(lambda: q.enqueue("y" * 1000), admin, q)
    _refused_cleanly(lambda: q.enqueue_many(["y" * 1000] * 3), admin, q)


def _refused_cleanly(write, admin, q) -> None:
    for _ in range(2000):
        before = admin.zcard(q.keys.pending)
        try:
            refs = write()
        except errors.ServerFull:
            assert admin.zcard(q.keys.pending) == before
            return
        refs = refs if isinstance(refs, list) else [refs]
        assert all(admin.exists(q.keys.job(ref.id)) for ref in refs)
    pytest.fail("a server at its maxmemory kept accepting jobs")


def test_aio_full_server_is_a_partial_batch(full_server, qname):
    port = full_server()
    admin = redis.Redis(port=port)

    async def main():
        q = emqfast.aio.Queue(qname, f"redis://127.0.0.1:{port}/0")
        from emqfast.core import ids
        job_ids = ids.new_ids(5000)
        with pytest.raises(errors.PartialBatch) as info:
            await q.enqueue_many(["x" * 1000] * 5000, job_ids=job_ids)
        _check_full(info.value, job_ids, admin, q)
    asyncio.run(main())


# --- durability: WAIT --------------------------------------------------------------------

def test_wait_replicas_without_a_replica_says_the_jobs_landed(backend, full_server, qname):
    port = full_server()
    admin = redis.Redis(port=port)
    q = emqfast.Queue(qname, f"redis://127.0.0.1:{port}/0", wait_replicas=1,
                      wait_timeout_ms=20)
    with pytest.raises(errors.NotReplicated) as info:
        q.enqueue("x")
    [ref] = info.value.landed
    assert admin.exists(q.keys.job(ref.id)) and info.value.acked == 0
    with pytest.raises(errors.NotReplicated) as info:
        q.enqueue_many(["a", "b", "c"])
    assert len(info.value.landed) == 3 and admin.zcard(q.keys.pending) == 4
    with pytest.raises(errors.NotReplicated):
        q.enqueue_many(["a", "b"], group="g")


def test_wait_replicas_with_a_replica(backend, full_server, qname):
    port = full_server()
    replica = full_server("--replicaof", "127.0.0.1", str(port))
    admin, copy = redis.Redis(port=port), redis.Redis(port=replica)
    wait_until(lambda: admin.info("replication")["connected_slaves"] >= 1
               and copy.info("replication")["master_link_status"] == "up", 10,
               "the replica to sync", interval=0.05)
    q = emqfast.Queue(qname, f"redis://127.0.0.1:{port}/0", wait_replicas=1,
                      wait_timeout_ms=5000)
    ref = q.enqueue("x")
    refs = q.enqueue_many(["a", "b"])
    assert copy.exists(q.keys.job(ref.id)) and all(copy.exists(q.keys.job(x.id)) for x in refs)

    async def main():
        aq = emqfast.aio.Queue(qname, f"redis://127.0.0.1:{port}/0", wait_replicas=1,
                               wait_timeout_ms=5000)
        got = await aq.enqueue_many(["c", "d"])
        assert all(copy.exists(aq.keys.job(x.id)) for x in got)
        one = await aq.enqueue("e")
        assert copy.exists(aq.keys.job(one.id))
    asyncio.run(main())


# --- check before the first write ----------------------------------------------------------

def test_enqueue_denied_a_write_command_writes_nothing(r, redis_url, qname):
    """An ACL user without XADD: enqueue used to write the job and its set, then fail."""
    q_admin = emqfast.Queue(qname, redis_url)
    q_admin.enqueue("first")  # the queue exists (version stamped)
    user = "u" + uuid.uuid4().hex[:8]
    r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"],
                  commands=["+@all", "-xadd"])
    try:
        url = redis_url.replace("redis://", f"redis://{user}:pw@")
        q = emqfast.Queue(qname, url)
        before = dump_queue(r, qname)
        with pytest.raises(errors.PermissionDenied):
            q.enqueue("x")
        with pytest.raises(errors.PermissionDenied):
            q.enqueue("x", group="g")
        with pytest.raises(errors.PermissionDenied):
            q.enqueue_many(["a", "b"])
        # a big batch checks once, in its first call, and sends nothing more when refused
        for group in (None, "g"):
            with pytest.raises(errors.PermissionDenied):
                q.enqueue_many(["a"] * 200, group=group)
        assert dump_queue(r, qname) == before
    finally:
        r.acl_deluser(user)


# --- connect() warns about an evicting server ----------------------------------------------

def test_connect_warns_loudly_on_an_evicting_server(full_server, caplog):
    import logging
    caplog.set_level(logging.WARNING, logger="emqfast")
    evicting = full_server("--maxmemory-policy", "allkeys-lru")
    safe = full_server()
    client = emqfast.connect(f"redis://127.0.0.1:{evicting}/0")
    assert client.ping()
    warnings = [r for r in caplog.records if r.name == "emqfast" and "allkeys-lru" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    emqfast.connect(f"redis://127.0.0.1:{evicting}/0")  # once per server and process
    emqfast.connect(f"redis://127.0.0.1:{safe}/0")
    emqfast.connect(_dead_url())  # never fails connect()
    assert len([r for r in caplog.records if r.name == "emqfast"
                and "maxmemory-policy" in r.getMessage()]) == 1


def test_lost_wait_reply_means_landed_but_unconfirmed(backend, proxy, r, qname):
    """Every write replied, then the connection died before WAIT's reply: the jobs are
    written (reported as landed), their replication is unconfirmed: NotReplicated."""
    client = redis.Redis(port=proxy.port)
    q = _queue(client, qname, wait_replicas=1, wait_timeout_ms=300)
    with pytest.raises(errors.NotReplicated):
        q.enqueue_many(["warm"])  # connects the Batcher (no replica: NotReplicated anyway)
    r.delete(q.keys.pending)
    _only_link(proxy, client if backend == "c" else None)
    # one enqueue_many.lua call admits the 100 jobs: "*100" and 100 ":1" (406 bytes),
    # then the WAIT's reply, which is cut
    proxy.cut_after(6 + 4 * 100)
    with pytest.raises(errors.NotReplicated) as info:
        q.enqueue_many(["p"] * 100)
    assert len(info.value.landed) == 100 and info.value.acked == 0
    assert r.zcard(q.keys.pending) == 100


def test_leaderboard_incr_is_never_resent(proxy, r):
    """ZINCRBY is not idempotent: a re-send by the client's retry would add twice."""
    board = emqfast.Leaderboard(redis.Redis(port=proxy.port), "lb-" + uuid.uuid4().hex[:8])
    assert board.incr("m", 1) == 1
    proxy.cut_after(0)
    with pytest.raises(errors.ReplyLost):
        board.incr("m", 1)
    proxy.cut_after(None)
    assert board.incr("m", 1) == 3  # the lost one ran exactly once
