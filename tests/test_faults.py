"""Faults against real redis-servers: workers SIGKILLed mid-run, Redis killed and
restarted under load, a worker frozen past its lease, schedule pumps killed.

Every test runs under one global deadline and waits on conditions (polled with
deadlines), never on bare sleeps. The counts each test observed are printed
(``pytest -s -m faults`` shows them).
"""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Dict, List

import pytest
import redis

import emqfast
from emqfast import Queue, Worker
from emqfast.facade import schedules

from conftest import start_redis_server
from waiting import wait_until, wait_until_async

pytestmark = pytest.mark.faults

HERE = Path(__file__).resolve().parent
PROCS = str(HERE / "fault_procs.py")


class Deadline:
    """One global time budget per test; ``check()`` fails the test when it is spent."""

    def __init__(self, seconds: float, what: str):
        self.end = time.monotonic() + seconds
        self.what = what

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise AssertionError(f"{self.what}: global deadline passed")

    def wait(self, cond: Callable[[], Any], what: str, interval: float = 0.01) -> Any:
        """Poll ``cond`` until truthy (returned); fail when the global deadline passes."""
        return wait_until(cond, max(self.left(), 0.0), f"{what} ({self.what})", interval)

    async def wait_async(self, cond: Callable[[], Any], what: str,
                         interval: float = 0.01) -> Any:
        """:meth:`wait` from inside an event loop (the loop runs on between polls)."""
        return await wait_until_async(cond, max(self.left(), 0.0), f"{what} ({self.what})",
                                      interval)


def spawn(mode: str, *args: Any, backend: str = "") -> subprocess.Popen:
    """Start a tests/fault_procs.py process (stderr to a scratch file, stdout piped),
    on ``backend`` ('c' / 'python'; default: the environment's choice)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    if backend:
        env["EMQFAST_BACKEND"] = backend
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, PROCS, mode, *map(str, args)],
                            stdout=subprocess.PIPE, stderr=err, env=env)
    proc.err_file = err  # type: ignore[attr-defined]
    return proc


def stats_of(proc: subprocess.Popen, timeout: float) -> Dict[str, int]:
    """The WorkerStats JSON line a fault process prints when it stops."""
    out, _ = proc.communicate(timeout=timeout)
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        proc.err_file.seek(0)  # type: ignore[attr-defined]
        raise AssertionError(f"fault process exited {proc.returncode}: "
                             f"{proc.err_file.read().decode()[-3000:]}")  # type: ignore
    return json.loads(lines[-1])


def owner(token: bytes) -> str:
    """Worker name inside a lease token ``<worker>:<n>``."""
    return token.decode().rsplit(":", 1)[0]


def report(name: str, **counts: Any) -> None:
    print(f"\n[fault counts] {name}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))


# --- 1. workers SIGKILLed mid-job --------------------------------------------------------

def test_sigkilled_workers_lose_no_job_and_rerun_only_what_they_held(redis_url, r, qname,
                                                                      backend):
    n_jobs, lease_ms, kill_every, live = 10_000, 1000, 700, 3
    clock = Deadline(180, "SIGKILL run")
    q = Queue(qname, r)
    ids = [ref.id for ref in q.enqueue_many(list(range(n_jobs)))]
    counts_key = f"test:{{{qname}}}:execs"
    names = (f"kw{i}" for i in itertools.count())
    workers: Dict[str, subprocess.Popen] = {}

    def start_one() -> None:
        name = next(names)
        workers[name] = spawn("count-worker", redis_url, qname, name, lease_ms, counts_key,
                              backend=backend)

    held: Counter = Counter()  # job id -> times a killed worker held its lease at death
    kills = kills_holding = 0
    last_kill_at = 0
    try:
        for _ in range(live):
            start_one()
        while True:
            clock.check()
            done = r.zcard(q.keys.completed)
            if done >= n_jobs:
                break
            if done - last_kill_at >= kill_every:
                holders = Counter(owner(t) for t in r.hvals(q.keys.leases))
                victim = next((w for w in workers if holders[w]), None)
                if victim is not None:  # kill a worker while it holds jobs
                    proc = workers.pop(victim)
                    proc.send_signal(signal.SIGKILL)
                    proc.wait(10)
                    # what it held when it died (its leases expire in lease_ms; the
                    # reaper cannot have taken them back yet)
                    dead = [j.decode() for j, t in r.hgetall(q.keys.leases).items()
                            if owner(t) == victim]
                    held.update(dead)
                    kills += 1
                    kills_holding += bool(dead)
                    last_kill_at = done
                    start_one()
            time.sleep(0.01)
        final_stats = []
        for proc in workers.values():
            proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            final_stats.append(stats_of(proc, timeout=max(clock.left(), 10)))
        workers.clear()
    finally:
        for proc in workers.values():
            proc.kill()
            proc.wait(10)

    counts = q.counts()
    completed = set(q.job_ids("completed"))
    execs = {k.decode(): int(v) for k, v in r.hgetall(counts_key).items()}
    reruns = {j: c - 1 for j, c in execs.items() if c > 1}
    lost = n_jobs - len(completed & set(ids))
    report(f"worker SIGKILL [{backend}]", jobs=n_jobs, kills=kills, kills_while_holding=kills_holding,
           held_at_death=sum(held.values()), reruns=sum(reruns.values()), lost=lost)
    assert lost == 0 and completed == set(ids)
    assert counts == {"scheduled": 0, "pending": 0, "grouped": 0, "active": 0,
                      "completed": n_jobs, "failed": 0, "cancelled": 0,
                      "waiting_deps": 0, "expired": 0}
    assert set(execs) == set(ids)  # every job ran at least once
    # a job re-runs only if a worker died holding it, at most once per such death
    assert all(reruns[j] <= held[j] for j in reruns), \
        {j: (reruns[j], held[j]) for j in reruns if reruns[j] > held[j]}
    assert sum(reruns.values()) <= sum(held.values())
    assert kills >= 8 and kills_holding >= 1
    assert r.hlen(q.keys.leases) == 0


# --- 2. Redis killed and restarted under load -------------------------------------------

def test_redis_restart_keeps_every_acknowledged_enqueue(qname, backend):
    clock = Deadline(150, "Redis restart run")
    aof = ["--appendonly", "yes", "--appendfsync", "always"]
    proc, port, workdir = start_redis_server(aof)
    url = f"redis://127.0.0.1:{port}/0"
    conn = emqfast.connect(url, socket_timeout=5)
    q = Queue(qname, conn, attempts=100)
    acked: List[str] = []
    retries = Counter()
    stop = threading.Event()
    errors: List[BaseException] = []

    def producer(tag: str) -> None:
        try:
            for i in itertools.count():
                if stop.is_set():
                    return
                job_id, backoff = f"JOB-{tag}-{i}", 0.01
                while True:  # an enqueue that raised did not return success: try again
                    try:
                        q.enqueue({"i": i}, job_id=job_id)  # same id: a retry is idempotent
                        acked.append(job_id)
                        break
                    except (redis.ConnectionError, redis.TimeoutError,
                            emqfast.ConnectionFailed, emqfast.ServerBusy):  # LOADING: not run
                        retries[tag] += 1
                        if clock.left() < 0:
                            raise
                        time.sleep(backoff)
                        backoff = min(backoff * 2, 0.5)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    worker = Worker(q, lambda job: job.payload["i"], concurrency=8, lease_ms=3000,
                    keep_completed=10**9, max_stalled=1000)
    threads = [threading.Thread(target=producer, args=(t,), daemon=True) for t in "ab"]
    threads.append(threading.Thread(target=worker.run, daemon=True))
    for t in threads:
        t.start()

    def done() -> int:
        with redis.Redis(port=port, socket_timeout=5) as c:
            return c.zcard(q.keys.completed)

    restarts = 0
    try:
        for _ in range(3):
            enq0, done0 = len(acked), done()
            clock.wait(lambda: len(acked) >= enq0 + 300 and done() >= done0 + 100,
                       "producers and worker to make progress")
            proc.send_signal(signal.SIGKILL)  # harsher than SHUTDOWN: no final flush
            proc.wait(10)
            before_kill = list(acked)
            proc, _, _ = start_redis_server(aof, port=port, workdir=workdir)
            restarts += 1
            with redis.Redis(port=port) as c:  # every enqueue that had returned survived
                pipe = c.pipeline(transaction=False)
                for job_id in before_kill:
                    pipe.exists(q.keys.job(job_id))
                missing = [j for j, e in zip(before_kill, pipe.execute()) if not e]
            assert not missing, f"{len(missing)} acknowledged enqueues lost: {missing[:5]}"
        enq0, done0 = len(acked), done()  # everyone reconnected and carries on
        clock.wait(lambda: len(acked) >= enq0 + 300 and done() >= done0 + 100,
                   "progress after the last restart")
        stop.set()
        for t in threads[:2]:
            t.join(max(clock.left(), 1))
        assert not errors, errors
        clock.wait(lambda: done() >= len(set(acked)), "the worker to drain every job")
        worker.stop()
        threads[2].join(max(clock.left(), 1))
        with redis.Redis(port=port) as c:
            job_keys = set(c.scan_iter(match=q.keys.glob()[:-1] + "job:*", count=1000))
            completed = {j.decode() for j in c.zrange(q.keys.completed, 0, -1)}
    finally:
        stop.set()
        worker.stop()
        proc.terminate()
        proc.wait(10)
        conn.close()
    # exactly the acknowledged jobs exist (a retried enqueue is a duplicate, not a copy)
    assert job_keys == {q.keys.job(j).encode() for j in acked}
    assert completed == set(acked) and len(acked) == len(set(acked))
    report(f"redis restart [{backend}]", jobs=len(acked), restarts=restarts,
           producer_retries=sum(retries.values()), completed=len(completed),
           worker_lease_lost=worker.stats.lease_lost, lost=len(set(acked) - completed))


# --- 3. a frozen worker loses its lease ----------------------------------------------------

def test_frozen_worker_cannot_complete_a_job_the_reaper_gave_away(redis_url, r, qname):
    clock = Deadline(60, "lease-lost run")
    q = Queue(qname, r)
    ref = q.enqueue({"x": 1})
    log_key, go_key = f"test:{{{qname}}}:log", f"test:{{{qname}}}:go"
    a = spawn("stall-worker", redis_url, qname, "A", 400, log_key, go_key)
    b = Worker(q, lambda job: {"by": "B"}, lease_ms=5000, name="B", max_stalled=5)
    bt = threading.Thread(target=b.run, daemon=True)
    try:
        clock.wait(lambda: r.lrange(log_key, 0, -1) == [b"started:A:1"], "A to start the job")
        a.send_signal(signal.SIGSTOP)
        bt.start()  # B's beat reaps A's expired lease, re-claims and finishes the job
        clock.wait(lambda: (q.get(ref.id).state == "completed"), "B to finish the job")
        job = q.get(ref.id)
        assert job.result == {"by": "B"}
        # B counts the completion when the reply to its write arrives, a moment after
        # Redis holds it: wait for the count rather than race it.
        clock.wait(lambda: b.stats.completed == 1, "B to count its completion")
        r.set(go_key, 1)
        a.send_signal(signal.SIGCONT)
        a_stats = stats_of(a, timeout=max(clock.left(), 1))
    finally:
        a.send_signal(signal.SIGCONT)
        if a.poll() is None:
            a.kill()
            a.wait(10)
        b.stop()
        if bt.is_alive():
            bt.join(10)
    log = [x.decode() for x in r.lrange(log_key, 0, -1)]
    assert log == ["started:A:1", "extend:LeaseLost"]  # the handler got the typed error
    assert a_stats["lease_lost"] == 1 and a_stats["completed"] == 0  # its result discarded
    job = q.get(ref.id)
    assert job.state == "completed" and job.result == {"by": "B"}
    assert job.stalls == 1 and job.attempts == 1  # the stalled run is not counted
    assert q.counts()["completed"] == 1 and r.hlen(q.keys.leases) == 0
    report("lease lost", jobs=1, freezes=1, reaps=job.stalls,
           rejected_completions=a_stats["lease_lost"], lost=0)


def test_an_ack_resent_after_a_lost_reply_is_idempotent(r, qname):
    """A completion re-sent after its reply was lost (connection drop, restart) finds its
    own outcome and succeeds; any other token still meets LeaseLost."""
    from engine_util import claim, complete

    q = Queue(qname, r)
    ref = q.enqueue("x")
    # claim.lua + start.lua as a bare client would (engine_util follows the scripts' layout)
    [(job_id, token)] = claim(q, "w", 10_000)
    assert job_id == ref.id
    assert complete(q, job_id, token, b'"first"')[1] >= 0  # run ms
    finished = q.get(job_id).finished_ms
    # the re-sent ack: same outcome, and no run times (it was timed already)
    assert complete(q, job_id, token, b'"again"') == [-1, -1]
    job = q.get(job_id)
    assert (job.result, job.finished_ms) == ("first", finished)  # nothing rewritten
    with pytest.raises(emqfast.LeaseLost):
        complete(q, job_id, "w:999", b'"thief"')
    assert q.counts()["completed"] == 1


# --- 4. schedule pumps killed and restarted -----------------------------------------------

def test_killed_and_restarted_pumps_mint_each_occurrence_exactly_once(redis_url, r, qname):
    """Three pump processes race; the test SIGKILLs one at a time and, twice, all of
    them for several slots (catch_up must then mint the missed ones). Every minted job
    is cancelled as soon as it appears, so a second mint of an occurrence would create
    its job again and be seen: each occurrence must be cancelled exactly once."""
    clock = Deadline(90, "pump run")
    every, n_slots = 100, 40
    q = Queue(qname, r)
    start = q.server_time_ms() + 300
    q.schedules.upsert("tick", every_ms=every, start_at_ms=start, missed="catch_up",
                       payload={"tick": True})
    pumps: List[subprocess.Popen] = []
    cancelled: Counter = Counter()
    kills = outages = events = 0

    def sweep_jobs() -> None:
        for job_id in q.job_ids("pending") + q.job_ids("scheduled"):
            if q.cancel(job_id):
                # a cancelled job keeps a record; drop it, so a re-mint of the
                # same occurrence would land again and show up as a second cancel
                r.delete(q.keys.job(job_id))
                r.zrem(q.keys.cancelled, job_id)
                cancelled[job_id] += 1

    def last_occurrence() -> int:
        s = q.schedules.get("tick")
        return -1 if s.last_occurrence_ms is None else s.last_occurrence_ms

    def slot_index() -> int:
        return (last_occurrence() - start) // every

    try:
        pumps += [spawn("pump", redis_url, qname) for _ in range(3)]
        next_event = 3
        while slot_index() < n_slots or kills < 10:  # slots jump under load: run on
            clock.check()
            sweep_jobs()
            i = slot_index()
            if i >= next_event:
                next_event = i + 4
                events += 1
                if events in (2, 5):  # every pump down for 3+ slots
                    for p in pumps:
                        p.kill()
                        p.wait(10)
                    kills += len(pumps)
                    outages += 1
                    stalled_at = last_occurrence()
                    clock.wait(lambda: q.server_time_ms() > stalled_at + 3.5 * every,
                               "three slots to pass with no pump")
                    assert last_occurrence() == stalled_at  # nobody minted meanwhile
                    pumps = [spawn("pump", redis_url, qname) for _ in range(3)]
                else:  # one pump dies, a fresh one takes its place
                    victim = pumps.pop(kills % len(pumps))
                    victim.kill()
                    victim.wait(10)
                    kills += 1
                    pumps.append(spawn("pump", redis_url, qname))
            time.sleep(0.005)
    finally:
        for p in pumps:
            p.kill()
            p.wait(10)
    sweep_jobs()
    last = last_occurrence()
    expected = {schedules.occurrence_job_id("tick", occ)
                for occ in range(start, last + 1, every)}
    twice = {j: c for j, c in cancelled.items() if c > 1}
    report("schedule pumps", occurrences=len(expected), pump_kills=kills,
           full_outages=outages, minted=sum(cancelled.values()),
           duplicates=sum(c - 1 for c in cancelled.values()), missing=len(expected - set(cancelled)))
    assert not twice, twice
    assert set(cancelled) == expected  # every slot from start to the last: no gap, no extra
    assert len(expected) >= n_slots and outages == 2 and kills >= 10
    assert q.counts() == dict.fromkeys(
        ("scheduled", "pending", "grouped", "active", "completed", "failed",
         "cancelled", "waiting_deps", "expired"), 0)


# --- 5. Redis restarted mid-run (AOF, appendfsync always): every job exactly once ---------

def _restart_redis(proc: subprocess.Popen, port: int, workdir: str, how: str,
                   args: List[str]) -> subprocess.Popen:
    """Stop the server ``how`` ('sigkill': no final flush; 'shutdown': SHUTDOWN, which
    fsyncs the AOF) and start it again on the same port and data directory."""
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    else:
        no_retry = redis.retry.Retry(redis.backoff.NoBackoff(), 0)  # no reconnect attempts
        with redis.Redis(port=port, socket_timeout=5, retry=no_retry) as c:
            try:
                c.shutdown(nosave=False)
            except redis.ConnectionError:
                pass  # the server closes the connection as it exits
    proc.wait(10)
    proc, _, _ = start_redis_server(args, port=port, workdir=workdir)
    return proc


@pytest.mark.parametrize("how", ["sigkill", "shutdown"])
def test_redis_restarted_mid_run_runs_every_job_exactly_once(qname, backend, how):
    """Producers (own ids, a failed call retried with the same ids) and a Worker carry on
    across two restarts of an AOF Redis (appendfsync always): no job lost, none run twice,
    no stall (attempts == 1, stalls 0), nothing left active. The lease (5 min) is far
    longer than the run, so any job whose outcome was dropped shows up stuck, not re-run."""
    from test_fault_soak import (SoakResult, job_ids_for, produce_sync, report, verdict,
                                 wait_drained)

    n_jobs, restarts_wanted = 4_000, 2
    clock = Deadline(150, "Redis restart exactly-once run")
    aof = ["--appendonly", "yes", "--appendfsync", "always"]
    proc, port, workdir = start_redis_server(aof)
    conn = emqfast.connect(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
    direct = redis.Redis(port=port, socket_timeout=5)
    q = Queue(qname, conn)
    result = SoakResult(fault=f"redis {how} + restart, AOF always ({backend})")
    errors: Counter = Counter()
    untyped: Counter = Counter()
    execs: Counter = Counter()
    lock = threading.Lock()

    def handler(job: emqfast.Job) -> None:
        with lock:
            execs[job.id] += 1
        time.sleep(0.0005)  # a little work, so outcomes are in flight at each restart

    worker = Worker(q, handler, concurrency=8, lease_ms=300_000, keep_completed=10**9,
                    name=f"restart-{qname}")
    worker_errors: List[BaseException] = []

    def run_worker() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - reported below
            worker_errors.append(exc)

    ids_of = {t: job_ids_for(f"{qname}-{t}", n_jobs // 2) for t in ("a", "b")}
    producer_errors: List[BaseException] = []

    def run_producer(tag: str) -> None:
        try:
            produce_sync(q, ids_of[tag], errors, untyped, clock.end)
        except BaseException as exc:  # noqa: BLE001 - reported below
            producer_errors.append(exc)

    wt = threading.Thread(target=run_worker, daemon=True)
    pts = [threading.Thread(target=run_producer, args=(t,), daemon=True) for t in ids_of]
    ids = [j for t in ids_of for j in ids_of[t]]

    def done() -> int:
        try:
            return direct.zcard(q.keys.completed)
        except redis.ConnectionError:
            return -1  # mid-restart

    restarts = 0
    started = time.monotonic()
    try:
        wt.start()
        for t in pts:
            t.start()
        for i in range(restarts_wanted):
            mark = (i + 1) * n_jobs // (restarts_wanted + 2)
            clock.wait(lambda: done() >= mark or not wt.is_alive(),
                       f"{mark} jobs completed before restart {i + 1}")
            proc = _restart_redis(proc, port, workdir, how, aof)
            restarts += 1
        for t in pts:
            t.join(max(clock.left(), 1))
        wait_drained(done, n_jobs, wt.is_alive, clock.end)
        worker.stop()
        wt.join(30)
        result.producer_errors, result.untyped_errors = dict(errors), dict(untyped)
        if producer_errors:
            result.worker_error += f"producer: {producer_errors[0]!r}; "
        if worker_errors:
            result.worker_error += f"worker: {worker_errors[0]!r}"
        verdict(direct, qname, ids, execs, result)
    finally:
        worker.stop()
        proc.terminate()
        proc.wait(10)
        conn.close()
        direct.close()
    result.cuts = {"restarts": restarts}
    result.seconds = round(time.monotonic() - started, 1)
    report(result)
    assert restarts == restarts_wanted
    assert result.problems() == {}, result


def test_redis_restarted_mid_run_aio_runs_every_job_exactly_once(qname):
    """The same run (SIGKILL, restart, AOF always) with emqfast.aio: producer tasks and an
    aio Worker carry on; no job lost, none run twice, no stall."""
    import asyncio

    import emqfast.aio
    from test_fault_soak import (SoakResult, job_ids_for, produce_async, report, verdict,
                                 wait_drained)

    n_jobs, restarts_wanted = 4_000, 2
    clock = Deadline(150, "Redis restart exactly-once run (aio)")
    aof = ["--appendonly", "yes", "--appendfsync", "always"]
    proc, port, workdir = start_redis_server(aof)
    direct = redis.Redis(port=port, socket_timeout=5)
    # aio bulk calls go through redis.asyncio under either backend: one variant suffices
    result = SoakResult(fault="redis sigkill + restart, AOF always (aio)")
    errors: Counter = Counter()
    untyped: Counter = Counter()
    execs: Counter = Counter()
    q_keys = Queue(qname, direct).keys
    ids_of = {t: job_ids_for(f"{qname}-{t}", n_jobs // 2) for t in ("a", "b")}
    ids = [j for t in ids_of for j in ids_of[t]]
    procs = [proc]

    def done() -> int:
        try:
            return direct.zcard(q_keys.completed)
        except redis.ConnectionError:
            return -1  # mid-restart

    async def handler(job: emqfast.Job) -> None:
        execs[job.id] += 1
        await asyncio.sleep(0)

    async def main() -> int:
        conn = emqfast.aio.connect(f"redis://127.0.0.1:{port}/0", socket_timeout=5)
        q = emqfast.aio.Queue(qname, conn)
        worker = emqfast.aio.Worker(q, handler, concurrency=8, lease_ms=300_000,
                                    keep_completed=10**9, name=f"restart-aio-{qname}")
        wtask = asyncio.create_task(worker.run())
        ptasks = [asyncio.create_task(produce_async(q, ids_of[t], errors, untyped, clock.end))
                  for t in ids_of]
        restarts = 0
        for i in range(restarts_wanted):
            mark = (i + 1) * n_jobs // (restarts_wanted + 2)
            await clock.wait_async(lambda: done() >= mark or wtask.done(),
                                   f"{mark} jobs done before restart {i + 1}")
            procs[0] = await asyncio.to_thread(_restart_redis, procs[0], port, workdir,
                                               "sigkill", aof)
            restarts += 1
        await asyncio.wait(ptasks, timeout=max(clock.left(), 1))
        for t in ptasks:
            if t.done() and t.exception() is not None:
                result.worker_error += f"producer: {t.exception()!r}; "
        await asyncio.to_thread(wait_drained, done, n_jobs, lambda: not wtask.done(),
                                clock.end)
        worker.stop()
        try:
            await asyncio.wait_for(wtask, 30)
        except BaseException as exc:  # noqa: BLE001 - reported in the verdict
            result.worker_error += f"worker: {exc!r}"
        await conn.aclose()
        return restarts

    started = time.monotonic()
    try:
        restarts = asyncio.run(main())
        result.producer_errors, result.untyped_errors = dict(errors), dict(untyped)
        verdict(direct, qname, ids, execs, result)
    finally:
        procs[0].terminate()
        procs[0].wait(10)
        direct.close()
    result.cuts = {"restarts": restarts}
    result.seconds = round(time.monotonic() - started, 1)
    report(result)
    assert restarts == restarts_wanted
    assert result.problems() == {}, result
