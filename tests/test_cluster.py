"""The engine's contract on a real 3-master Redis Cluster.

The module starts its own cluster (tests/cluster_util.py), so ``make test`` and
``.ci/run`` need nothing extra. Each test picks queue names whose hash-tag slots
land on every master, runs public operations through ``emqfast.connect(
"redis+cluster://...")`` and checks results; any CROSSSLOT (or other routing
error) would raise and fail the test. Keys are also checked to live on the
master that owns their queue's slot.
"""
from __future__ import annotations

import importlib
import logging
import threading
import time

import pytest
import redis
from redis.crc import key_slot

import emqfast
from emqfast import Backoff, Leaderboard, Queue, Worker, promote_many
from emqfast.facade import schedules
from emqfast.tools import cli
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import PROMOTE_BATCH
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION

from cluster_util import migrate_slot, names_over_masters, start_cluster
from waiting import wait_until

pytestmark = pytest.mark.cluster

# the package attribute `emqfast.backend` is the backend() function, not the module
backend_mod = importlib.import_module("emqfast.backend")

_CLAIM = load("claim")
POLL_S = 0.02  # waits here poll with cluster round trips: a gentler pace than the default


@pytest.fixture(scope="module")
def cluster():
    c = start_cluster(3)
    yield c
    c.stop()


@pytest.fixture
def conn(cluster):
    client = emqfast.connect(cluster.url)
    assert isinstance(client, redis.RedisCluster)
    yield client
    client.close()


@pytest.fixture
def names(cluster, qname):
    """Three queue names of this test, one per master."""
    return names_over_masters(cluster, 1, qname)


def slot_of(name: str) -> int:
    return key_slot(QueueKeys(name).meta.encode())


def keys_on_node(port: int, name: str) -> set:
    with redis.Redis(port=port) as c:
        return set(c.scan_iter(match=QueueKeys(name).glob(), count=1000))


def assert_keys_on_owner(cluster, name: str) -> int:
    """Every key of the queue is on the master owning its slot, none elsewhere; returns count."""
    owner = cluster.owner_port(slot_of(name))
    found = 0
    for port in cluster.ports:
        keys = keys_on_node(port, name)
        if port == owner:
            found = len(keys)
        else:
            assert not keys, f"keys of {name} on non-owner {port}: {keys}"
    return found


def claim(conn, q: Queue, n: int = 10, lease_ms: int = 30_000, worker: str = "w"):
    """Run claim.lua directly (a worker that then dies / never acks)."""
    k = q.keys
    reply = _CLAIM(conn, [k.pending, k.active, k.leases, k.meta, k.marker, k.delayed, k.counter,
                          k.rate],
                   [n, lease_ms, worker, KEYSPACE_VERSION])
    return int(reply[1]), [reply[i].decode() for i in range(3, len(reply), 2)]


# --- the fixture itself ---------------------------------------------------------------

def test_cluster_has_three_masters_and_names_cover_them(cluster, conn):
    info = conn.cluster_info()
    assert info["cluster_state"] == "ok"
    names = names_over_masters(cluster, 3, "cover")
    owners = [cluster.owner_port(slot_of(n)) for n in names]
    assert len(names) == 9 and sorted(set(owners)) == sorted(cluster.ports)
    assert all(owners.count(p) == 3 for p in cluster.ports)


def test_every_key_of_a_queue_shares_one_slot(names):
    for name in names:
        k = QueueKeys(name)
        keys = [getattr(k, a) for a in QueueKeys.__slots__ if a not in ("name", "base")]
        keys += [k.job("JOB1"), k.schedule("nightly")]
        assert {key_slot(key.encode()) for key in keys} == {slot_of(name)}


# --- contract behaviours, each on three queues (one per master) ----------------------

def test_enqueue_get_duplicate_and_payload_round_trip(cluster, conn, names):
    for name in names:
        q = Queue(name, conn)
        a = q.enqueue({"n": 1, "s": "é"})
        b = q.enqueue(b"\x00\xffraw", job_id="JOB-fixed")
        assert (a.status, b.status) == ("pending", "pending")
        assert q.enqueue(b"other", job_id="JOB-fixed").duplicate
        assert q.get(a.id).payload == {"n": 1, "s": "é"}
        assert q.get("JOB-fixed").payload == b"\x00\xffraw"
        assert q.get("JOB-absent") is None
        assert q.counts()["pending"] == 2
        assert assert_keys_on_owner(cluster, name) >= 5


def test_priority_order_holds_on_every_master(conn, names):
    for name in names:
        q = Queue(name, conn)
        prios = [5, 0, 3, 0, 5, 1, 2]
        refs = [q.enqueue(i, priority=p) for i, p in enumerate(prios)]
        expected = [refs[i].id for i in sorted(range(len(prios)), key=lambda i: (prios[i], i))]
        assert q.job_ids("pending") == expected
        seen = []
        Worker(q, lambda job: seen.append(job.id), concurrency=1).run_until_idle(20)
        assert seen == expected


def test_delay_and_promote_on_the_server_clock(conn, names):
    for name in names:
        q = Queue(name, conn)
        ref = q.enqueue_in("later", delay_ms=800)
        assert ref.status == "scheduled"
        run_at = q.get(ref.id).run_at_ms
        moved = q.promote()
        if q.server_time_ms() < run_at:  # promote ran before run_at: it must not release
            assert moved == 0 and q.get(ref.id).state == "scheduled"
        wait_until(lambda: q.promote() or q.get(ref.id).state == "pending", 10, "promotion",
                   interval=POLL_S)
        assert q.get(ref.id).state == "pending"
        assert q.server_time_ms() >= run_at
        assert q.job_ids("pending") == [ref.id]


def test_worker_completes_fails_retries_and_records_results(conn, names):
    for name in names:
        q = Queue(name, conn)
        flaky = q.enqueue({"flaky": True}, attempts=3, backoff=Backoff.fixed(10))
        doomed = q.enqueue({"doomed": True}, attempts=2, backoff=Backoff.fixed(10))
        fine = q.enqueue({"x": 2})

        def handler(job):
            if job.payload.get("doomed") or (job.payload.get("flaky") and job.attempts == 1):
                raise RuntimeError(f"attempt {job.attempts}")
            return {"ok": job.attempts}

        stats = Worker(q, handler, concurrency=4, lease_ms=5000).run_until_idle(
            30, wait_scheduled=True)
        assert (stats.completed, stats.failed, stats.retried) == (2, 1, 2)
        assert q.get(flaky.id).result == {"ok": 2} and q.get(flaky.id).attempts == 2
        assert q.get(fine.id).result == {"ok": 1}
        d = q.get(doomed.id)
        assert d.state == "failed" and d.attempts == 2 and "attempt 2" in d.error
        assert q.counts() == {"scheduled": 0, "pending": 0, "grouped": 0, "active": 0,
                              "completed": 2, "failed": 1,
                              "cancelled": 0, "waiting_deps": 0, "expired": 0}
        q.retry(doomed.id)  # back to pending with fresh attempts
        assert q.get(doomed.id).state == "pending" and q.counts()["failed"] == 0


def test_reap_returns_a_dead_workers_job(conn, names):
    for name in names:
        q = Queue(name, conn)
        ref = q.enqueue("x")
        status, claimed = claim(conn, q, lease_ms=100)
        assert (status, claimed) == (1, [ref.id])
        assert q.counts()["active"] == 1
        wait_until(lambda: q.reap() == (1, 0), 10, "reap", interval=POLL_S)
        job = q.get(ref.id)
        assert job.state == "pending" and job.stalls == 1
        assert q.job_ids("pending") == [ref.id]


def test_cancel_pause_resume(conn, names):
    for name in names:
        q = Queue(name, conn)
        now_job, later_job = q.enqueue("a"), q.enqueue_in("b", delay_ms=60_000)
        assert q.cancel(now_job.id) and q.cancel(later_job.id)
        assert not q.cancel(now_job.id)
        # cancelled jobs keep a record
        assert q.get(now_job.id).state == q.get(later_job.id).state == "cancelled"
        ref = q.enqueue("c")
        q.pause()
        assert q.is_paused()
        assert claim(conn, q) == (0, [])
        q.resume()
        assert not q.is_paused()
        assert claim(conn, q) == (1, [ref.id])


def test_nine_queues_bulk_enqueue_and_drain(cluster, conn):
    names = names_over_masters(cluster, 3, f"bulk-{time.monotonic_ns()}")
    n = 300
    for name in names:
        q = Queue(name, conn)
        refs = q.enqueue_many([{"i": i, "q": name} for i in range(n)], priority=1)
        assert len(refs) == n and all(r.status == "pending" for r in refs)
    for name in names:
        q = Queue(name, conn)
        seen = []
        Worker(q, lambda job: seen.append(job.payload["i"]) or job.payload["q"],
               concurrency=8, keep_completed=10_000).run_until_idle(60)
        assert sorted(seen) == list(range(n))
        assert q.counts()["completed"] == n
        assert q.trim(keep_completed=100) == n - 100
        assert_keys_on_owner(cluster, name)
        assert q.obliterate() > 0
        assert q.counts() == dict.fromkeys(
            ("scheduled", "pending", "grouped", "active", "completed", "failed",
             "cancelled", "waiting_deps", "expired"), 0)
        assert assert_keys_on_owner(cluster, name) == 0


def test_scripts_reload_after_every_node_flushes_its_cache(cluster, conn, names):
    for port in cluster.ports:
        with redis.Redis(port=port) as c:
            c.script_flush()
    for name in names:
        q = Queue(name, conn)
        q.enqueue("one")
        for port in cluster.ports:  # NOSCRIPT path again, this time for the pipelined batch
            with redis.Redis(port=port) as c:
                c.script_flush()
        q.enqueue_many(["two", "three"])
        stats = Worker(q, lambda job: job.payload).run_until_idle(20)
        assert stats.completed == 3


def test_queue_keeps_working_while_its_slot_moves_to_another_master(cluster, conn, qname):
    """Resharding: the client's cached slot map goes stale; MOVED is followed."""
    q = Queue(qname, conn)
    first = q.enqueue_many(list(range(50)))
    slot = slot_of(qname)
    src = cluster.owner_port(slot)
    dst = next(p for p in cluster.ports if p != src)
    assert migrate_slot(cluster, slot, dst) >= 50
    assert cluster.owner_port(slot) == dst
    second = q.enqueue_many(list(range(50, 100)))  # pipelined batch meets MOVED
    third = q.enqueue(100)                          # single script call meets MOVED
    seen = []
    Worker(q, lambda job: seen.append(job.payload)).run_until_idle(30)
    assert sorted(seen) == list(range(101))
    assert {r.id for r in first + second + [third]} == set(q.job_ids("completed", 0, -1))
    assert keys_on_node(src, qname) == set()


def test_leaderboard_on_cluster(cluster, conn, names):
    for name in names:
        board = Leaderboard(conn, name)
        board.set_many({"ada": 97, "linus": 88, "grace": 97})
        board.incr("linus", 10)
        assert [(e.member, e.score) for e in board.top(3)] == [
            ("linus", 98.0), ("ada", 97.0), ("grace", 97.0)]
        assert board.rank("grace") == 3
        assert [e.member for e in board.around("ada", 1)] == ["linus", "ada", "grace"]
        board.clear()
        assert board.size() == 0


def test_enqueue_many_on_cluster_goes_to_the_slot_master_over_the_c_core(conn, names, backend,
                                                                        cluster, caplog):
    """Under C the bulk runs on the C core's own connection to the queue's slot
    master (redis-py's slot map), under Python through redis-py's ClusterPipeline; a plain
    single-node C Batcher still refuses a cluster client (that is the ClusterBatcher's job).
    Nothing falls back, so nothing is logged."""
    from emqfast.backends import pure_batcher as _pure_wire
    from emqfast.backends.native_cluster import ClusterBatcher
    from emqfast.core.errors import BackendUnavailable

    if backend == "c":
        with pytest.raises(BackendUnavailable):
            backend_mod._native.Batcher.from_redis(conn)
    caplog.set_level(logging.INFO, logger="emqfast")
    backend_mod._refusals_logged.clear()
    for name in names:
        q = Queue(name, conn)
        refs = q.enqueue_many([b"a", b"b", b"c"])
        want = ClusterBatcher if backend == "c" else _pure_wire.Batcher
        assert isinstance(q._live_batcher(), want)
        assert [q.get(r.id).payload for r in refs] == [b"a", b"b", b"c"]
        assert assert_keys_on_owner(cluster, name) > 0
    if backend == "c":  # the C core's connections: one per master the queues live on
        masters = {cluster.owner_port(slot_of(name)) for name in names}
        conns = {dict(key).get("port") for key in backend_mod._thread_batchers()}
        assert masters <= conns
    logged = [r for r in caplog.records if "C batcher unavailable" in r.getMessage()]
    assert logged == []


def test_schedules_on_cluster(conn, names):
    for name in names:
        q = Queue(name, conn)
        start = q.server_time_ms() - 250  # three slots already due: catch_up mints them
        q.schedules.upsert("tick", every_ms=100, start_at_ms=start, missed="catch_up",
                           payload={"t": 1})
        q.schedules.upsert_many([{"name": "daily", "cron": "0 9 * * *", "tz": "Europe/Paris"}])
        assert q.schedules.pump() >= 3
        got = q.schedules.get("tick")
        minted = set(q.job_ids("pending"))
        occs = range(start, got.last_occurrence_ms + 1, 100)
        assert minted == {schedules.occurrence_job_id("tick", o) for o in occs}
        assert [s.name for s in q.schedules.list()] == ["tick", "daily"]
        assert q.schedules.remove("daily") and not q.schedules.remove("daily")
        stats = Worker(q, lambda job: job.payload).run_until_idle(20)
        assert stats.completed >= len(minted)


def test_batched_promote_across_queues_on_every_master(cluster, conn, backend):
    """bulk.promote_many pipelines due/promote for many queues at once; on a cluster the
    calls of queues on different masters travel in one ClusterPipeline (a round trip
    per node) because the C Batcher refuses cluster connections."""
    names = names_over_masters(cluster, 3, f"promote-{time.monotonic_ns()}")
    queues = [Queue(n, conn) for n in names]
    refs = {q.name: [r.id for r in q.enqueue_many(list(range(4)), delay_ms=200)]
            for q in queues}
    run_at = max(q.get(refs[q.name][-1]).run_at_ms for q in queues)
    wait_until(lambda: queues[0].server_time_ms() > run_at, 10, "the jobs to fall due",
               interval=POLL_S)
    moved = promote_many(conn, queues)
    assert moved == {n: 4 for n in names}
    for q in queues:
        assert q.job_ids("pending") == refs[q.name]
        assert q.counts()["scheduled"] == 0
    assert promote_many(conn, names) == {n: 0 for n in names}  # nothing left to move


def test_a_promoted_backlog_streams_to_its_master(cluster, conn, backend):
    """Queue.promote of more due jobs than one promote.lua call takes: the round's calls
    go as one streamed bulk to the queue's master, every job moved once, in order."""
    name = names_over_masters(cluster, 1, f"backlog-{time.monotonic_ns()}")[0]
    q = Queue(name, conn)
    n = 2 * PROMOTE_BATCH + 11
    run_at = q.server_time_ms() + 1_500
    ids = [r.id for r in q.enqueue_many(list(range(n)), run_at_ms=run_at)]
    wait_until(lambda: q.server_time_ms() > run_at, 10, "the jobs to fall due",
               interval=POLL_S)
    assert q.promote(limit=10_000) == n
    assert q.job_ids("pending") == ids
    assert q.counts()["scheduled"] == 0
    assert q.promote(limit=10_000) == 0


def test_cli_stats_and_jobs_on_cluster(cluster, conn):
    """The CLI discovers queues on every master (SCAN fans out) and reads them."""
    from click.testing import CliRunner

    names = names_over_masters(cluster, 1, f"cli-{time.monotonic_ns()}")
    refs = {n: Queue(n, conn).enqueue({"q": n}) for n in names}
    assert set(names) <= set(cli.discover_queues(conn))
    runner = CliRunner()
    out = runner.invoke(cli.cli, ["--url", cluster.url, "stats"])
    assert out.exit_code == 0, out.output
    assert all(n in out.output for n in names)
    for n, ref in refs.items():
        out = runner.invoke(cli.cli, ["--url", cluster.url, "jobs", n, "--json"])
        assert out.exit_code == 0 and ref.id in out.output, out.output


# --- failover: a master SIGKILLed mid-run, its replica takes over -----------------------

@pytest.fixture(scope="module")
def replicated_cluster():
    """3 masters with one replica each, a short node timeout (fast failover). Its own
    cluster, so a failover never disturbs the tests above; started only when used."""
    c = start_cluster(3, replicas=1, node_timeout_ms=1500)
    yield c
    c.stop()


class _FailoverLoad:
    """Producers (plain and wait_replicas=1, own ids) and one Worker on one queue, for the
    failover test: the sync facade in threads. ``acked`` holds every id an enqueue
    returned for; ``execs`` counts handler runs per id."""

    def __init__(self, url: str, name: str, deadline: float):
        from collections import Counter

        self.url, self.name, self.deadline = url, name, deadline
        self.errors, self.untyped, self.execs = Counter(), Counter(), Counter()
        self.acked = {"waited": [], "plain": []}
        self.stop_producing = threading.Event()
        self.failed: list = []

    def ids(self, kind: str, b: int) -> list:
        return [f"JOB-fo-{kind}-{b:05d}-{i:02d}" for i in range(20)]

    def start(self) -> None:
        from test_fault_soak import retrying

        conn = self.conn = emqfast.connect(self.url)
        plain = self.plain = Queue(self.name, conn)
        waited = Queue(self.name, conn, wait_replicas=1)  # enqueues wait for a replica
        lock = threading.Lock()

        def handler(job):
            with lock:
                self.execs[job.id] += 1

        def produce(kind: str, q: Queue) -> None:
            """Blocks of 20 ids, alternately one enqueue_many and 20 enqueue calls; an
            error is counted and the same ids re-sent (a duplicate where they landed)."""
            for b in range(10_000):
                block = self.ids(kind, b)
                calls = [(block, lambda: q.enqueue_many([1] * len(block), job_ids=block))] \
                    if b % 2 == 0 else [([j], lambda j=j: q.enqueue(1, job_id=j)) for j in block]
                for landed, call in calls:
                    if self.stop_producing.is_set():
                        return
                    retrying(call, self.errors, self.untyped, self.deadline)
                    self.acked[kind].extend(landed)

        self.worker = Worker(plain, handler, concurrency=8, lease_ms=2000, max_stalled=100,
                             keep_completed=10**9, name=f"fo-{self.name}")
        self.threads = [threading.Thread(target=produce, args=(k, q), daemon=True)
                        for k, q in (("waited", waited), ("plain", plain))]
        self.wt = threading.Thread(target=self.worker.run, daemon=True)
        for t in self.threads + [self.wt]:
            t.start()

    def stop_producers(self) -> None:
        self.stop_producing.set()
        for t in self.threads:
            t.join(30)

    def stop(self) -> None:
        self.stop_producing.set()
        self.worker.stop()
        self.wt.join(30)
        self.conn.close()


class _AioFailoverLoad(_FailoverLoad):
    """The same load with emqfast.aio (redis.asyncio.RedisCluster): producer tasks and an
    aio Worker on an event loop in a thread of its own."""

    def start(self) -> None:
        import asyncio

        import emqfast.aio
        from test_fault_soak import retrying_async

        self._stop_worker = threading.Event()
        self._producers_done = threading.Event()

        async def main() -> None:
            conn = emqfast.aio.connect(self.url)
            plain = emqfast.aio.Queue(self.name, conn)
            waited = emqfast.aio.Queue(self.name, conn, wait_replicas=1)

            async def handler(job):
                self.execs[job.id] += 1

            async def produce(kind: str, q) -> None:
                for b in range(10_000):
                    block = self.ids(kind, b)
                    calls = [(block, lambda: q.enqueue_many([1] * len(block), job_ids=block))] \
                        if b % 2 == 0 else [([j], lambda j=j: q.enqueue(1, job_id=j))
                                            for j in block]
                    for landed, call in calls:
                        if self.stop_producing.is_set():
                            return
                        await retrying_async(call, self.errors, self.untyped, self.deadline)
                        self.acked[kind].extend(landed)

            worker = emqfast.aio.Worker(plain, handler, concurrency=8, lease_ms=2000,
                                        max_stalled=100, keep_completed=10**9,
                                        name=f"fo-aio-{self.name}")
            wtask = asyncio.create_task(worker.run())
            await asyncio.gather(produce("waited", waited), produce("plain", plain))
            self._producers_done.set()
            while not self._stop_worker.is_set() and not wtask.done() \
                    and time.monotonic() < self.deadline + 60:  # bounded even if never told
                await asyncio.sleep(0.02)
            worker.stop()
            await asyncio.wait_for(wtask, 30)
            await conn.aclose()

        def run() -> None:
            try:
                asyncio.run(main())
            except BaseException as exc:  # noqa: BLE001 - surfaced by the test
                self.failed.append(exc)
            finally:
                self._producers_done.set()

        self.wt = threading.Thread(target=run, daemon=True)
        self.wt.start()

    def stop_producers(self) -> None:
        self.stop_producing.set()
        self._producers_done.wait(30)

    def stop(self) -> None:
        self.stop_producing.set()
        self._stop_worker.set()
        self.wt.join(40)


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_master_killed_mid_run_replica_takes_over_and_waited_enqueues_survive(
        replicated_cluster, qname, facade):
    """SIGKILL the master that owns the queue while producers enqueue and a Worker drains;
    its replica takes over (cluster-node-timeout 1.5 s) and everyone carries on. Enqueues
    made with wait_replicas=1 are never lost; plain ones may be (asynchronous replication:
    the README's window), counted and reported, not asserted, as are jobs run twice (an
    outcome or claim the new master never saw: the job runs again). Every surviving job
    is completed, none is left active. The killed node then rejoins as a replica."""
    from test_fault_soak import SoakResult, report

    cluster = replicated_cluster
    cluster.refresh_roles()  # an earlier run of this test swapped a master and its replica
    name = next(n for n in names_over_masters(cluster, 2, qname)
                if cluster.owner_port(slot_of(n)) != cluster.ports[0])  # keep the seed node
    master = cluster.owner_port(slot_of(name))
    replica = cluster.replica_of(master)
    started = time.monotonic()
    load = (_FailoverLoad if facade == "sync" else _AioFailoverLoad)(
        cluster.url, name, started + 120)
    keys = QueueKeys(name)

    def done() -> int:
        try:
            with redis.Redis(port=cluster.owner_port(slot_of(name)), socket_timeout=2) as c:
                return c.zcard(keys.completed)
        except redis.RedisError:
            return -1

    acked = load.acked
    try:
        load.start()
        wait_until(lambda: done() >= 300 or load.failed, 30, "jobs to flow before the kill",
                   interval=POLL_S)
        cluster.kill(master)
        cluster.wait_promoted(replica, timeout=30)
        at_failover = dict((k, len(v)) for k, v in acked.items())
        # the dead node comes back as the new master's replica (what an operator does):
        # until then waited enqueues get NotReplicated (no replica left) and are re-sent
        cluster.restart(master)
        cluster.refresh_roles()
        wait_until(lambda: all(len(acked[k]) >= at_failover[k] + 100 for k in acked)
                   or load.failed, 30, "both producers to carry on after the failover",
                   interval=POLL_S)
        load.stop_producers()
        all_acked = acked["waited"] + acked["plain"]
        with redis.Redis(port=replica, socket_timeout=5) as c:
            def completed_now() -> set:
                return {j.decode() for j in c.zrange(keys.completed, 0, -1)}

            def present(ids) -> set:
                pipe = c.pipeline(transaction=False)
                for j in ids:
                    pipe.exists(keys.job(j))
                return {j for j, e in zip(ids, pipe.execute()) if e}
            lost = {k: sorted(set(v) - present(v)) for k, v in acked.items()}
            survivors = set(all_acked) - set(lost["waited"]) - set(lost["plain"])
            wait_until(lambda: survivors <= completed_now() or load.failed, 60,
                       "the worker to drain every surviving job", interval=POLL_S)
            counts = Queue(name, c).counts()
            survivors_list = sorted(survivors)
            pipe = c.pipeline(transaction=False)
            for j in survivors_list:
                pipe.hmget(keys.job(j), "attempts", "stalls")
            rows = pipe.execute()
    finally:
        load.stop()
    execs = load.execs
    odd = {j: (a, st, execs[j]) for j, (a, st) in zip(survivors_list, rows)
           if int(a or 0) != 1}  # (attempts, stalls, handler runs)
    result = SoakResult(fault=f"cluster master SIGKILL + replica failover ({facade})",
                        seconds=round(time.monotonic() - started, 1),
                        jobs=len(all_acked), lost=len(lost["waited"]) + len(lost["plain"]),
                        run_twice=sum(1 for j in survivors if execs[j] > 1),
                        never_run=sum(1 for j in survivors if execs[j] == 0),
                        stalls=sum(int(st or 0) for _, st in rows),
                        attempts_not_1=len(odd),
                        producer_errors=dict(load.errors), untyped_errors=dict(load.untyped),
                        worker_error=repr(load.failed[0]) if load.failed else "",
                        cuts={"waited_acked": len(acked["waited"]),
                              "waited_lost": len(lost["waited"]),
                              "plain_acked": len(acked["plain"]),
                              "plain_lost_window": len(lost["plain"])},
                        not_completed={"attempts_not_1 (attempts, stalls, runs)":
                                       dict(list(odd.items())[:5])})
    report(result)
    assert not load.failed, load.failed
    assert counts["active"] == 0 and counts["pending"] == 0, counts
    assert not lost["waited"], f"{len(lost['waited'])} waited enqueues lost: {lost['waited'][:5]}"
    assert result.never_run == 0 and not result.untyped_errors, result


def test_one_slot_script_batches_reach_the_slots_master_and_follow_a_move(cluster, conn,
                                                                          qname, backend):
    """A Worker's outcome writes are one queue's calls, so one slot: a pipelined batch of
    them runs on that slot's master (under C over the C core), each call once, also when
    the slot has moved meanwhile (MOVED: nothing ran there; the calls go to the new
    owner). A batch over several slots is routed call by call."""
    import hashlib

    from emqfast.backends import select as backend_select

    script = b"return redis.call('INCR', KEYS[1])"
    sha = hashlib.sha1(script).hexdigest()
    key = f"{{{qname}}}:counter"
    others = [f"{{{name}}}:counter" for name in names_over_masters(cluster, 1, f"{qname}-o")]
    batcher = backend_select.batcher_for(conn)
    try:
        assert batcher.evalsha_many(sha, script, 1, [[key]] * 5) == [1, 2, 3, 4, 5]
        slot = slot_of(qname)
        src = cluster.owner_port(slot)
        dst = next(p for p in cluster.ports if p != src)
        assert migrate_slot(cluster, slot, dst) == 1  # the client's slot map is stale now
        assert batcher.evalsha_many(sha, script, 1, [[key]] * 5) == [6, 7, 8, 9, 10]
        assert int(redis.Redis(port=dst).get(key)) == 10 and keys_on_node(src, qname) == set()
        assert batcher.evalsha_many(sha, script, 1, [[k] for k in [key, *others]]) == \
            [11, 1, 1, 1]
    finally:
        batcher.close()
        for k in [key, *others]:
            conn.delete(k)


def test_a_worker_drains_each_job_once_while_its_slot_moves_mid_drain(cluster, conn, qname,
                                                                    backend):
    """Resharding under a running Worker: while it holds claimed jobs its queue's slot
    moves to another master. Its claims, starts and outcome writes that meet MOVED or
    ASK did not run and are sent on; every job runs exactly once and ends completed on
    the new master."""
    n = 40
    q = Queue(qname, conn)
    q.enqueue_many(list(range(n)))
    slot = slot_of(qname)
    src = cluster.owner_port(slot)
    dst = next(p for p in cluster.ports if p != src)
    seen: list = []
    half, moved = threading.Event(), threading.Event()

    def handler(job):
        seen.append(job.payload)
        if len(seen) == n // 2:  # the worker holds claimed jobs meanwhile: they start later
            half.set()
            assert moved.wait(60), "the slot did not move"

    worker = Worker(q, handler, concurrency=1, batch_size=4, lease_ms=30_000)
    done: dict = {}
    runner = threading.Thread(target=lambda: done.update(stats=worker.run_until_idle(120)))
    runner.start()
    try:
        assert half.wait(60), f"the drain stalled at {len(seen)} jobs"
        assert migrate_slot(cluster, slot, dst) >= 1
    finally:
        moved.set()
        runner.join(120)
    assert not runner.is_alive() and done["stats"].completed == n
    assert sorted(seen) == list(range(n))  # each job once
    assert q.counts()["completed"] == n and q.counts()["active"] == 0
    assert keys_on_node(src, qname) == set() and cluster.owner_port(slot) == dst
