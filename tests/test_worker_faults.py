"""The worker's script path under faults: claim -> start -> complete/fail,
leases, and what both Workers do around them.

- big claims lose nothing (claim.lua chunks every unpack; bad counts refused before a pop);
- a capped-group claim as a user whose ACL lacks the lex commands fails before any write;
- claim/start/complete/fail re-sent with the same arguments (a lost reply) count nothing
  twice, and a Worker whose replies are lost re-sends them and finishes every job once;
- transient server states are waited out (BUSY, a restart), permanent ones stop the worker;
- shutdown never releases a job whose handler may still finish;
- async handlers are refused by the sync Worker;
- the rate limit holds on handler *starts* across workers;
- an evicting server is refused, a job whose hash vanished is counted as orphaned;
- lease extensions and releases go in bounded chunks.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import threading
import time
import uuid
from typing import Any, Dict, List

import pytest
import redis

import emqfast
import emqfast.aio
from emqfast.facade.events import parse_entry
from emqfast.worker import calls as acks, outcomes, resend
from emqfast.worker import calls as core
from emqfast.core.errors import EvictionRisk, InvalidInput, PermissionDenied, ReplyLost

from conftest import dump_queue, start_redis_server
from engine_util import make_queue, running_worker
from waiting import wait_until, wait_until_async


def _aio_queue(url: str, qname: str) -> emqfast.aio.Queue:
    import redis.asyncio as aredis
    return emqfast.aio.Queue(qname, aredis.Redis.from_url(url))


def _pairs(q: emqfast.Queue, n: int, worker: str = "w", request: str = "") -> List[tuple]:
    call = core.claim_call(q.keys, n, 30_000, worker, *([(), request] if request else []))
    return core.parse_claim(call.script(q.redis, call.keys, call.args))[3]


def _start(q: emqfast.Queue, pairs: List[tuple]) -> List[Any]:
    call = core.start_call(q.keys, pairs)
    return core.start_rows(call.script(q.redis, call.keys, call.args))  # one entry per job


def _events(r: redis.Redis, q: emqfast.Queue, name: str) -> List[dict]:
    # batched entries (one per 16 jobs: start.lua, complete.lua) read as one event per job
    return [{"id": e.job_id, **e.fields} for entry_id, fields in r.xrange(q.keys.events)
            for e in parse_entry(entry_id, fields) if e.name == name]


# --- 1. big claims ------------------------------------------------------------------------

def test_a_direct_claim_of_5000_returns_5000_leases(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(5500)))
    pairs = _pairs(q, 5000)
    assert len(pairs) == 5000
    assert r.hlen(q.keys.leases) == 5000 and r.zcard(q.keys.active) == 5000
    assert r.zcard(q.keys.pending) == 500


def test_claim_refuses_a_fractional_count_or_lease_before_any_pop(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many([1, 2, 3])
    before = dump_queue(r, qname)
    for n, lease in ((2.5, 30_000), (2, 100.5), (0, 30_000), (10_001, 30_000), (200_000, 30_000)):
        call = core.claim_call(q.keys, n, lease, "w")
        with pytest.raises(InvalidInput):
            call.script(q.redis, call.keys, call.args)
    assert dump_queue(r, qname) == before


def test_worker_with_batches_of_5000_runs_all_6000_jobs(backend, redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(6000)))
    # keep every completed job: the 5 s retention beat must not trim what is counted below
    stats = emqfast.Worker(q, lambda job: None, batch_size=5000, prefetch=5000,
                           keep_completed=10_000).run_until_idle(timeout_s=120)
    assert stats.completed == 6000
    assert q.counts()["completed"] == 6000 and r.zcard(q.keys.pending) == 0
    assert r.hlen(q.keys.leases) == 0


# --- 2. least privilege: no write before a command an ACL may deny -------------------------

def _readme_least_privilege() -> List[str]:
    """The command rules of the README's least-privilege ``ACL SETUSER`` line."""
    readme = os.path.join(os.path.dirname(__file__), "..", "README.md")
    with open(readme, encoding="utf-8") as f:
        line = next(ln for ln in f if "ACL SETUSER" in ln and "-@all" in ln)
    return [w for w in line.split() if w.startswith(("+", "-"))]


def test_capped_group_claim_without_lex_rights_fails_before_popping(redis_url, qname, r):
    rule = [c for c in _readme_least_privilege()
            if c.lower() not in ("+zlexcount", "+zrangebylex", "+hexists")]
    user, password = "emq-nolex-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    r.acl_setuser(user, enabled=True, passwords=["+" + password], keys=["emq:*"],
                  reset_channels=True, commands=[c for c in rule if c.startswith(("+", "-"))])
    try:
        admin = make_queue(redis_url, qname)
        admin.groups.set_concurrency("g", 1)
        admin.enqueue({"g": 1}, group="g")
        flat = admin.enqueue({"flat": 1})
        host, port = r.connection_pool.connection_kwargs["host"], \
            r.connection_pool.connection_kwargs["port"]
        limited = redis.Redis(host=host, port=port, username=user, password=password)
        call = core.claim_call(admin.keys, 5, 30_000, "w", ["g"], "req-1")
        with pytest.raises(Exception) as err:  # noqa: B017 - typed below
            call.script(limited, call.keys, call.args)
        assert isinstance(resend.typed(err.value), PermissionDenied), err.value
        # nothing was popped: the flat job still waits
        assert r.zscore(admin.keys.pending, flat.id) is not None
        assert r.hlen(admin.keys.leases) == 0
    finally:
        r.acl_deluser(user)


# --- 3. re-sent calls are idempotent ----------------------------------------------------

def test_a_resent_claim_returns_its_leases_and_pops_nothing_more(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(10)))
    first = _pairs(q, 4, request="req-7")
    again = _pairs(q, 4, request="req-7")
    assert again == first
    assert r.zcard(q.keys.pending) == 6 and r.hlen(q.keys.leases) == 4
    # a lease that ended since is not handed back
    _start(q, first[:1])
    core_call = acks.complete_call(q.keys, [outcomes.Done(q.get(first[0][0]), first[0][1], b"1")])
    core_call.script(q.redis, core_call.keys, core_call.args)
    assert _pairs(q, 4, request="req-7") == first[1:]
    # the next request claims anew
    assert len(_pairs(q, 4, request="req-8")) == 4


def test_a_resent_start_counts_one_attempt_and_one_event(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue_many(["a", "b"])
    pairs = _pairs(q, 2)
    first = _start(q, pairs)
    state = dump_queue(r, qname)
    again = _start(q, pairs)
    assert again == first
    assert dump_queue(r, qname) == state  # nothing written by the re-send
    assert [q.get(i).attempts for i, _ in pairs] == [1, 1]
    assert len(_events(r, q, "active")) == 2


def test_a_resent_complete_reports_success_and_counts_once(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("a")
    pairs = _pairs(q, 1)
    _start(q, pairs)
    job = q.get(pairs[0][0])
    call = acks.complete_call(q.keys, [outcomes.Done(job, pairs[0][1], b"1")])
    call.script(q.redis, call.keys, call.args)
    state = dump_queue(r, qname)
    reply = call.script(q.redis, call.keys, call.args)
    assert reply == [-1]  # timed already (with its run record: the run ms alone, -1)
    assert dump_queue(r, qname) == state
    assert r.hget(q.keys.metrics, "completed") == b"1"


@pytest.mark.parametrize("retry", [True, False])
def test_a_resent_fail_reports_success_and_counts_once(redis_url, qname, r, retry):
    q = make_queue(redis_url, qname)
    q.enqueue("a", attempts=3 if retry else 1)
    pairs = _pairs(q, 1)
    _start(q, pairs)
    job = q.get(pairs[0][0])
    outcome = outcomes.failure(job, pairs[0][1], ValueError("boom"), "tb")
    call, retrying = acks.fail_call(q.keys, outcome)
    assert retrying == retry
    first = call.script(q.redis, call.keys, call.args)
    state = dump_queue(r, qname)
    again = call.script(q.redis, call.keys, call.args)
    assert again[0] == first[0] == (1 if retry else 0)
    assert dump_queue(r, qname) == state
    assert r.hget(q.keys.metrics, "retried" if retry else "failed") == b"1"
    assert len(_events(r, q, "retrying" if retry else "failed")) == 1


class _LoseFirstReplies:
    """Simulates lost replies honestly: the call runs on the server, then the caller sees
    ReplyLost (the typed error the transport raises when a connection drops after a
    request was written), once per script: the Worker must re-send it itself."""

    def __init__(self, scripts: List[str]):
        self.names = set(scripts)
        self.lost: Dict[str, int] = {}
        self.lock = threading.Lock()

    def first_time(self, name: str) -> bool:
        with self.lock:
            if name not in self.names or name in self.lost:
                return False
            self.lost[name] = 1
            return True

    def install(self, monkeypatch) -> None:
        from emqfast.backends import scripts
        from emqfast.backends import drive
        faults = self
        real_call, real_async = scripts.Script.__call__, scripts.Script.call_async

        def call(script, client, keys, args):
            reply = real_call(script, client, keys, args)
            if faults.first_time(script.name):
                raise ReplyLost(f"simulated: {script.name} ran, its reply was lost")
            return reply

        async def call_async(script, client, keys, args):
            reply = await real_async(script, client, keys, args)
            if faults.first_time(script.name):
                raise ReplyLost(f"simulated: {script.name} ran, its reply was lost")
            return reply

        def batch(real):
            def run(*a):
                calls = a[1]  # (batcher or client, calls, wait)
                replies = real(*a)
                if any(faults.first_time(c[0].name) for c in calls):
                    raise ReplyLost("simulated: the batch ran, its replies were lost")
                return replies
            return run

        def batch_async(real):
            async def run(*a):
                calls = a[1]
                replies = await real(*a)
                if any(faults.first_time(c[0].name) for c in calls):
                    raise ReplyLost("simulated: the batch ran, its replies were lost")
                return replies
            return run

        monkeypatch.setattr(scripts.Script, "__call__", call)
        monkeypatch.setattr(scripts.Script, "call_async", call_async)
        # the drivers' pipelines of script calls: the acks' Batcher (sync), the starts'
        # pipeline over the client (sync), redis.asyncio
        monkeypatch.setattr(drive, "run_calls", batch(drive.run_calls))
        monkeypatch.setattr(drive, "send", batch(drive.send))
        monkeypatch.setattr(drive, "send_async", batch_async(drive.send_async))


def _flaky_handler(runs: Dict[str, int]):
    lock = threading.Lock()

    def handler(job):
        with lock:
            runs[job.id] = runs.get(job.id, 0) + 1
            first = runs[job.id] == 1
        if job.payload % 2 and first:
            raise ValueError("fail once")
        return job.payload
    return handler


def _assert_each_ran_once_per_attempt(q, r, refs, runs):
    for i, ref in enumerate(refs):
        job = q.get(ref)
        assert job.state == "completed", (i, job.state)
        assert job.attempts == (2 if i % 2 else 1), (i, job.attempts)
        assert runs[ref] == job.attempts
    m = r.hgetall(q.keys.metrics)
    assert int(m[b"completed"]) == len(refs) and int(m[b"retried"]) == len(refs) // 2
    assert int(m.get(b"stalled", 0)) == 0
    assert r.hlen(q.keys.leases) == 0


def test_worker_whose_replies_are_lost_runs_every_job_once(backend, redis_url, qname, r,
                                                           monkeypatch, caplog):
    q = make_queue(redis_url, qname)
    refs = [q.enqueue(i, attempts=2).id for i in range(20)]
    runs: Dict[str, int] = {}
    faults = _LoseFirstReplies(["claim", "start", "complete", "fail"])
    faults.install(monkeypatch)
    stats = emqfast.Worker(q, _flaky_handler(runs), concurrency=4).run_until_idle(
        timeout_s=60, wait_scheduled=True)
    assert set(faults.lost) == {"claim", "start", "complete", "fail"}
    assert "outcome discarded" not in caplog.text
    assert stats.lease_lost == 0 and stats.completed == 20
    _assert_each_ran_once_per_attempt(q, r, refs, runs)


def test_aio_worker_whose_replies_are_lost_runs_every_job_once(redis_url, qname, r,
                                                               monkeypatch, caplog):
    sq = make_queue(redis_url, qname)
    refs = [sq.enqueue(i, attempts=2).id for i in range(20)]
    runs: Dict[str, int] = {}
    faults = _LoseFirstReplies(["claim", "start", "complete", "fail"])
    faults.install(monkeypatch)
    handler = _flaky_handler(runs)

    async def coro(job):
        return handler(job)

    async def main():
        return await emqfast.aio.Worker(_aio_queue(redis_url, qname), coro,
                                        concurrency=4).run_until_idle(timeout_s=60,
                                                                      wait_scheduled=True)
    stats = asyncio.run(main())
    assert set(faults.lost) == {"claim", "start", "complete", "fail"}
    assert "outcome discarded" not in caplog.text
    assert stats.lease_lost == 0 and stats.completed == 20
    _assert_each_ran_once_per_attempt(sq, r, refs, runs)


# --- 4. transient states waited out, permanent ones stop ------------------------------------

@pytest.fixture
def private_redis(tmp_path):
    """A private redis-server whose ``restart()`` saves, stops and starts it again on the
    same port, loading slowly: for ~2 s it answers LOADING, as a real restart of a big
    dataset does."""
    workdir = str(tmp_path)
    proc, port, _ = start_redis_server(workdir=workdir)
    box = {"proc": proc, "port": port, "url": f"redis://127.0.0.1:{port}/0"}
    filler = redis.Redis(port=port)
    for i in range(100):  # what the restart loads slowly
        filler.set(f"filler:{i}", os.urandom(2000))
    filler.close()

    def restart():
        admin = redis.Redis(port=port)
        try:
            admin.shutdown(save=True)
        except redis.ConnectionError:
            pass
        box["proc"].wait(10)
        box["proc"] = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", workdir,
             "--key-load-delay", "20000", "--loading-process-events-interval-bytes", "1024"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: _loading(box["url"]), what="server loading")
    box["restart"] = restart
    yield box
    box["proc"].terminate()
    box["proc"].wait(10)


def _loading(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_timeout=1).get("filler:0")
        return False
    except redis.BusyLoadingError:
        return True
    except redis.ResponseError as exc:
        return "LOADING" in str(exc)
    except redis.RedisError:
        return False


def _gated_handler():
    gate, started = threading.Event(), threading.Event()

    def handler(job):
        started.set()
        assert gate.wait(30)
        return "ok"
    return handler, gate, started


def test_outcomes_are_written_after_a_redis_restart(backend, private_redis, qname):
    q = make_queue(private_redis["url"], qname)
    ref = q.enqueue("x").id
    handler, gate, started = _gated_handler()
    w = emqfast.Worker(q, handler, lease_ms=60_000)
    with running_worker(w):
        assert started.wait(15)
        private_redis["restart"]()  # returns while the server still answers LOADING
        gate.set()
        wait_until(lambda: _state(q, ref) == "completed", what="outcome written after restart")
    job = q.get(ref)
    assert (job.attempts, job.result, job.stalls) == (1, "ok", 0)
    assert w.stats.completed == 1
    assert q.redis.hget(q.keys.metrics, "stalled") in (None, b"0")


def test_aio_outcomes_are_written_after_a_redis_restart(private_redis, qname):
    q = make_queue(private_redis["url"], qname)
    ref = q.enqueue("x").id
    handler, gate, started = _gated_handler()

    async def main():
        w = emqfast.aio.Worker(_aio_queue(private_redis["url"], qname), handler,
                               lease_ms=60_000)
        task = asyncio.create_task(w.run())
        await wait_until_async(started.is_set, 15, "the handler to start", interval=0.01)
        await asyncio.to_thread(private_redis["restart"])
        gate.set()
        await wait_until_async(lambda: _state(q, ref) == "completed", 15,
                               "the outcome written after the restart", interval=0.05)
        w.stop()
        return await asyncio.wait_for(task, 15)
    stats = asyncio.run(main())
    job = q.get(ref)
    assert (job.attempts, job.result, job.stalls, stats.completed) == (1, "ok", 0, 1)


def test_outcomes_wait_out_a_busy_server(private_redis, qname):
    q = make_queue(private_redis["url"], qname)
    admin = redis.Redis.from_url(private_redis["url"])
    admin.config_set("busy-reply-threshold", 20)
    ref = q.enqueue("x").id
    handler, gate, started = _gated_handler()
    busy_script = ("local function ms() local t = redis.call('TIME') "
                   "return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000 end "
                   "local stop = ms() + 2000 while ms() < stop do end return 1")
    w = emqfast.Worker(q, handler)
    with running_worker(w):
        assert started.wait(15)
        busy = threading.Thread(target=lambda: redis.Redis.from_url(
            private_redis["url"], socket_timeout=30).eval(busy_script, 0), daemon=True)
        busy.start()
        wait_until(lambda: _is_busy(private_redis["url"]), what="server busy", interval=0.001)
        gate.set()
        wait_until(lambda: _state(q, ref) == "completed", what="outcome after BUSY")
        busy.join(10)
    assert w.stats.completed == 1 and q.get(ref).attempts == 1


def _state(q: emqfast.Queue, ref: str) -> Any:
    try:
        return q.get(ref).state
    except Exception:  # noqa: BLE001 - the server is busy: not yet
        return None


def _is_busy(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_timeout=1).ping()
        return False
    except redis.ResponseError as exc:
        return "BUSY" in str(exc)
    except redis.RedisError:
        return False


def _denied_user(r: redis.Redis) -> tuple:
    user, password = "emq-denied-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    r.acl_setuser(user, enabled=True, passwords=["+" + password], keys=["emq:*"],
                  commands=["-@all", "+ping"])
    kw = r.connection_pool.connection_kwargs
    return user, f"redis://{user}:{password}@{kw['host']}:{kw['port']}/0"


def test_sync_worker_stops_with_permission_denied(redis_url, qname, r):
    user, url = _denied_user(r)
    try:
        q = make_queue(url, qname)
        with pytest.raises(PermissionDenied):
            emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=20)
    finally:
        r.acl_deluser(user)


def test_aio_worker_stops_with_permission_denied(redis_url, qname, r):
    user, url = _denied_user(r)
    try:
        async def main():
            q = _aio_queue(url, qname)
            await emqfast.aio.Worker(q, lambda job: None).run_until_idle(timeout_s=20)
        with pytest.raises(PermissionDenied):
            asyncio.run(main())
    finally:
        r.acl_deluser(user)


# --- 5. shutdown never releases a job whose handler may still finish -----------------------

def test_shutdown_timeout_never_runs_a_job_twice(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("slow").id
    runs: List[str] = []
    handler, gate, started = _gated_handler()

    def counted(job):
        runs.append(job.id)
        return handler(job)
    a = emqfast.Worker(q, counted, shutdown_timeout_s=0.2, lease_ms=2_000)
    b = emqfast.Worker(q, counted)
    thread = threading.Thread(target=a.run, daemon=True)
    thread.start()
    assert started.wait(15)
    a.stop()
    with running_worker(b):
        # well past A's shutdown timeout and past its lease: still one run, A's
        time.sleep(2.5)
        assert runs == [ref] and q.get(ref).state == "active"
        gate.set()
        thread.join(15)
        wait_until(lambda: q.get(ref).state == "completed", what="A's outcome")
    assert not thread.is_alive()
    assert runs == [ref] and q.get(ref).attempts == 1 and a.stats.released == 0


def test_shutdown_timeout_keeps_a_cap_1_group_to_one_run_at_a_time(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.groups.set_concurrency("solo", 1)
    refs = [q.enqueue(i, group="solo").id for i in range(2)]
    live, most, lock = [0], [0], threading.Lock()
    gate, started = threading.Event(), threading.Event()

    def handler(job):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        started.set()
        if job.payload == 0:
            gate.wait(30)
        with lock:
            live[0] -= 1
    a = emqfast.Worker(q, handler, shutdown_timeout_s=0.2, lease_ms=2_000, concurrency=2)
    b = emqfast.Worker(q, handler, concurrency=2)
    thread = threading.Thread(target=a.run, daemon=True)
    thread.start()
    assert started.wait(15)
    a.stop()
    with running_worker(b):
        time.sleep(1.0)
        gate.set()
        thread.join(15)
        wait_until(lambda: all(q.get(i).state == "completed" for i in refs), what="both done")
    assert most[0] == 1
    assert [q.get(i).attempts for i in refs] == [1, 1]


def test_aio_shutdown_waits_for_a_thread_handler_and_writes_its_outcome(redis_url, qname, r):
    sq = make_queue(redis_url, qname)
    ref = sq.enqueue("slow").id
    handler, gate, started = _gated_handler()

    async def main():
        w = emqfast.aio.Worker(_aio_queue(redis_url, qname), handler, shutdown_timeout_s=0.2)
        task = asyncio.create_task(w.run())
        await wait_until_async(started.is_set, 15, "the handler to start", interval=0.01)
        w.stop()
        await asyncio.sleep(0.6)  # past the timeout: not released
        assert sq.get(ref).state == "active"
        gate.set()
        return await asyncio.wait_for(task, 15)
    stats = asyncio.run(main())
    assert stats.released == 0 and stats.completed == 1
    job = sq.get(ref)
    assert (job.state, job.attempts, job.result) == ("completed", 1, "ok")


# --- 6. async handlers on the sync Worker ---------------------------------------------------

def test_sync_worker_refuses_an_async_handler(redis_url, qname):
    q = make_queue(redis_url, qname)

    async def handler(job):
        return 1

    class Callable_:
        async def __call__(self, job):
            return 1
    for h in (handler, Callable_()):
        with pytest.raises(TypeError, match="emqfast.aio.Worker"):
            emqfast.Worker(q, h)


def test_a_handler_returning_an_awaitable_fails_clearly_without_retry(redis_url, qname):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("x", attempts=3).id

    async def work(job):
        return 1
    emqfast.Worker(q, lambda job: work(job)).run_until_idle(timeout_s=30)
    job = q.get(ref)
    assert job.state == "failed" and job.attempts == 1
    assert "awaitable" in job.error and "emqfast.aio.Worker" in job.error


# --- 7. the rate limit holds on handler starts --------------------------------------------

def _most_in_window(stamps: List[int], window: int) -> int:
    stamps = sorted(stamps)
    most, lo = 0, 0
    for hi, s in enumerate(stamps):
        while s - stamps[lo] >= window:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


def test_rate_limit_holds_on_starts_across_workers(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.set_rate_limit(20, 500)
    refs = q.enqueue_many(list(range(90)))
    workers = [emqfast.Worker(make_queue(redis_url, qname), lambda job: time.sleep(0.002),
                              concurrency=4, prefetch=8) for _ in range(3)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: q.counts()["completed"] == 90, timeout=30, what="all done")
    finally:
        for w in workers:
            w.stop()
        for t in threads:
            t.join(15)
    stamps = [q.get(ref.id).started_ms for ref in refs]
    assert _most_in_window(stamps, 500) <= 20
    assert all(q.get(ref.id).attempts == 1 for ref in refs)


def test_late_starts_cannot_bunch_with_the_next_windows_claims(redis_url, qname, r):
    """Claims counted at claim time let starts bunch: a batch claimed at T and started at
    T + W/2, then a batch claimed and started just after T + W, is 2N starts within W. The
    window holds each start instant instead, so the second claim finds no room."""
    from engine_util import server_ms, wait_server_past
    q = make_queue(redis_url, qname)
    q.set_rate_limit(5, 600)
    refs = q.enqueue_many(list(range(10)))
    t0 = server_ms(r)
    first = _pairs(q, 5)
    wait_server_past(r, t0 + 300)
    assert all(_start(q, first))
    wait_server_past(r, t0 + 620)
    second = _pairs(q, 5)
    if second:
        _start(q, second)
    stamps = [j.started_ms for j in (q.get(ref.id) for ref in refs) if j.started_ms]
    assert _most_in_window(stamps, 600) <= 5, sorted(s - t0 for s in stamps)


def test_late_starts_cannot_bunch_in_a_group_window(redis_url, qname, r):
    """The same for a group's own rate limit: the start re-checks the group's window."""
    from engine_util import server_ms, wait_server_past
    q = make_queue(redis_url, qname)
    q.groups.set_rate_limit("A", 5, 600)
    refs = q.enqueue_many(list(range(10)), group="A")

    def claim_and_start():
        call = core.claim_call(q.keys, 5, 30_000, "w", ["A"], uuid.uuid4().hex)
        pairs = core.parse_claim(call.script(q.redis, call.keys, call.args))[3]
        if pairs:
            start = core.start_call(q.keys, pairs, ["A"])
            return pairs, start
        return pairs, None
    t0 = server_ms(r)
    first, start = claim_and_start()
    assert len(first) == 5
    wait_server_past(r, t0 + 300)
    assert all(core.start_rows(start.script(q.redis, start.keys, start.args)))
    wait_server_past(r, t0 + 620)
    second, start = claim_and_start()
    if start is not None:
        start.script(q.redis, start.keys, start.args)
    stamps = [j.started_ms for j in (q.get(ref.id) for ref in refs) if j.started_ms]
    assert _most_in_window(stamps, 600) <= 5, sorted(s - t0 for s in stamps)


def test_start_parks_a_job_whose_claim_left_a_full_window(redis_url, qname, r):
    """A claimed job that starts after its claim left the window, with the window full of
    other starts, is not started: it waits on the delayed set for the window to open."""
    q = make_queue(redis_url, qname)
    q.set_rate_limit(2, 300)
    q.enqueue_many(["late", "x", "y"])
    late = _pairs(q, 1)
    wait_until(lambda: r.zcard(q.keys.rate) == 0, what="claim left the window")
    others = _pairs(q, 2)
    assert _start(q, others) and r.zcard(q.keys.rate) == 2
    assert _start(q, late) == [0]
    assert r.zscore(q.keys.delayed, late[0][0]) is not None
    assert r.hget(q.keys.leases, late[0][0]) is None
    assert q.get(late[0][0]).attempts == 0
    # it runs once the window opens
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert q.get(late[0][0]).state == "completed"


# --- 8. eviction --------------------------------------------------------------------------

@pytest.fixture
def evicting(r):
    previous = r.config_get("maxmemory-policy")["maxmemory-policy"]
    r.config_set("maxmemory-policy", "allkeys-lru")
    yield
    r.config_set("maxmemory-policy", previous)


def test_workers_refuse_an_evicting_server_unless_allowed(redis_url, qname, r, evicting):
    from emqfast.server import eviction
    assert "allkeys-lru" in eviction.check(r)
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    with pytest.raises(EvictionRisk, match="allkeys-lru"):
        emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=10)

    async def aio_refused():
        await emqfast.aio.Worker(_aio_queue(redis_url, qname),
                                 lambda job: None).run_until_idle(timeout_s=10)
    with pytest.raises(EvictionRisk):
        asyncio.run(aio_refused())
    stats = emqfast.Worker(q, lambda job: None, allow_eviction=True).run_until_idle(timeout_s=10)
    assert stats.completed == 1


def test_eviction_check_reads_info_when_config_is_denied(redis_url, r, evicting):
    from emqfast.server import eviction
    user, password = "emq-noconfig-" + uuid.uuid4().hex[:6], uuid.uuid4().hex
    r.acl_setuser(user, enabled=True, passwords=["+" + password], keys=["emq:*"],
                  commands=["-@all", "+info", "+ping"])
    try:
        kw = r.connection_pool.connection_kwargs
        limited = redis.Redis(host=kw["host"], port=kw["port"], username=user, password=password)
        assert eviction.read_policy(limited) == "allkeys-lru"
    finally:
        r.acl_deluser(user)
    assert eviction.verdict("noeviction") is None


def test_a_job_whose_hash_vanished_is_counted_orphaned(backend, redis_url, qname, r):
    q = make_queue(redis_url, qname)
    gone = q.enqueue("gone").id
    kept = q.enqueue("kept").id
    r.delete(q.keys.job(gone))  # as an evicting server would
    stats = emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    assert stats.completed == 1 and q.get(kept).state == "completed"
    assert r.hget(q.keys.metrics, "orphaned") == b"1"
    assert [e["id"] for e in _events(r, q, "orphaned")] == [gone]
    assert r.hlen(q.keys.leases) == 0 and r.zcard(q.keys.active) == 0


# --- 9. bounded extend / release batches -----------------------------------------------------

def test_lease_extensions_and_releases_go_in_bounded_chunks(redis_url, qname, r, monkeypatch):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(30)))
    monkeypatch.setattr(core, "LEASE_CHUNK", 7)
    sizes: Dict[str, List[int]] = {"extend": [], "release": []}
    real_extend, real_release = core.extend_call, core.release_calls
    monkeypatch.setattr(core, "extend_call", lambda k, ms, pairs: sizes["extend"].append(
        len(pairs)) or real_extend(k, ms, pairs))
    monkeypatch.setattr(core, "release_calls", lambda k, held: sizes["release"].append(
        len(held)) or real_release(k, held))
    gate = threading.Event()
    w = emqfast.Worker(q, lambda job: gate.wait(30), concurrency=20, prefetch=10,
                       lease_ms=200, shutdown_timeout_s=5)
    with running_worker(w):
        wait_until(lambda: sizes["extend"] and sum(sizes["extend"]) >= 20, what="extensions")
        gate.set()
        wait_until(lambda: q.counts()["completed"] >= 20, what="running ones done")
    assert max(sizes["extend"]) <= 7
    assert not sizes["release"] or max(sizes["release"]) <= 7
    assert q.counts()["completed"] + r.zcard(q.keys.pending) == 30


def test_shutdown_releases_held_jobs_in_bounded_chunks(redis_url, qname, r, monkeypatch):
    q = make_queue(redis_url, qname)
    refs = q.enqueue_many(list(range(21)))
    monkeypatch.setattr(core, "LEASE_CHUNK", 7)
    sizes: List[int] = []
    real_release = core.release_calls
    monkeypatch.setattr(core, "release_calls", lambda k, held: sizes.append(len(held))
                        or real_release(k, held))
    gate, started = threading.Event(), threading.Event()

    def handler(job):
        started.set()
        gate.wait(30)
    w = emqfast.Worker(q, handler, concurrency=1, prefetch=20, shutdown_timeout_s=5)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    wait_until(lambda: w.stats.claimed == 21 and started.is_set(), what="21 claimed, 1 running")
    w.stop()
    wait_until(lambda: w.stats.released == 20, what="20 held jobs released")
    gate.set()
    thread.join(15)
    assert sizes == [7, 7, 6]
    assert q.counts()["completed"] == 1 and r.zcard(q.keys.pending) == 20
    assert all(q.get(ref.id).attempts == 0 for ref in refs if q.get(ref.id).state != "completed")


def test_outcomes_wait_out_a_full_server(backend, private_redis, qname):
    """maxmemory reached with noeviction: the outcome write is refused (OOM) until memory
    is freed, then written; the job is not left to its lease."""
    q = make_queue(private_redis["url"], qname)
    admin = redis.Redis.from_url(private_redis["url"])
    ref = q.enqueue("x").id
    handler, gate, started = _gated_handler()
    w = emqfast.Worker(q, handler, lease_ms=60_000)
    with running_worker(w):
        assert started.wait(15)
        for i in range(8):
            admin.set(f"ballast:{i}", os.urandom(1024 * 1024))
        admin.config_set("maxmemory-policy", "noeviction")
        # well below what is used: every write gets OOM until the ballast goes
        admin.config_set("maxmemory", admin.info("memory")["used_memory"] - 4 * 1024 * 1024)

        def ooms() -> int:
            return admin.info("errorstats").get("errorstat_OOM", {}).get("count", 0)
        before = ooms()
        gate.set()
        wait_until(lambda: ooms() > before, what="an outcome write refused with OOM")
        assert _state(q, ref) == "active"  # refused, waiting, not dropped
        admin.delete(*[f"ballast:{i}" for i in range(8)])
        wait_until(lambda: _state(q, ref) == "completed", what="outcome after OOM")
    admin.config_set("maxmemory", 0)
    job = q.get(ref)
    assert (job.attempts, job.result, job.stalls, w.stats.completed) == (1, "ok", 0, 1)
