"""Soak tests through the fault proxy (tests/fault_proxy.py): connections cut at a random
byte in either direction, or reset, every ~50-200 ms while producers enqueue and a
worker drains 10,000 jobs. Both backends, sync and aio facades; plus a reply-lost storm
(server->client cuts only, every 20-60 ms, the Worker started after the producers so its
own replies are cut) and self-tests of the proxy.

What must hold:

- every job enqueued (producers retry a failed call with the SAME ids, so a retry is
  idempotent) is completed, and its handler ran exactly once (counted in-process);
- ``attempts == 1`` and no stall on every job (the lease is long: none really expires);
- nothing is left active, ``counts()`` add up;
- every error a producer saw is one of emqfast's typed errors.

Each variant prints one ``[fault counts]`` line (``pytest -s``); set ``EMQ_FAULT_REPORT``
to a file path to get one JSON line per variant appended there. bench/faults.py runs
longer soaks with these same functions and prints the closing table.
Every wait is condition-based with a deadline; a run that stops making progress for
``STALL_S`` is reported as stalled (with what was left where) rather than waited out.
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Sequence

import pytest
import redis

import emqfast
import emqfast.aio
from emqfast import Queue, Worker

from fault_proxy import FaultProxy, fault_proxy, upstream_port_of  # noqa: F401 - a fixture

pytestmark = pytest.mark.faults

N_JOBS = 10_000
LEASE_MS = 300_000       # far longer than any run: no lease may really expire
STALL_S = 10.0           # no completion for this long while jobs remain: report a stall
BUDGET_S = 90.0          # hard cap of one variant
CHAOS_GAP_S = (0.05, 0.2)
BLOCK = 250              # ids per producer block (enqueue_many, or that many enqueue calls)


# --- the report ---------------------------------------------------------------------------

@dataclass
class SoakResult:
    """What one soak variant observed (one row of the closing table)."""

    fault: str
    jobs: int = 0
    runs: int = 1
    lost: int = 0                # enqueued, then in no state at all (no hash, no set)
    run_twice: int = 0           # jobs whose handler ran more than once
    never_run: int = 0           # completed, yet the handler never ran
    stalls: int = 0              # sum of the jobs' stall counters
    stuck_active: int = 0        # still active (leased) when the run ended
    not_completed: Dict[str, int] = field(default_factory=dict)  # state -> count
    attempts_not_1: int = 0
    counts_ok: bool = True
    cuts: Dict[str, int] = field(default_factory=dict)
    producer_errors: Dict[str, int] = field(default_factory=dict)
    untyped_errors: Dict[str, int] = field(default_factory=dict)
    worker_error: str = ""
    seconds: float = 0.0

    def problems(self) -> Dict[str, Any]:
        """Every invariant that did not hold, by name (empty when the run is clean)."""
        found = {"lost": self.lost, "run_twice": self.run_twice, "never_run": self.never_run,
                 "stalls": self.stalls, "stuck_active": self.stuck_active,
                 "not_completed": self.not_completed, "attempts_not_1": self.attempts_not_1,
                 "untyped_errors": self.untyped_errors, "worker_error": self.worker_error}
        bad = {k: v for k, v in found.items() if v}  # each is 0 / empty when all is well
        if not self.counts_ok:
            bad["counts_ok"] = False
        return bad


def report(result: SoakResult) -> None:
    """Print the variant's line; append it as JSON to ``$EMQ_FAULT_REPORT`` if set."""
    row = asdict(result)
    print("\n[fault counts] " + ", ".join(f"{k}={v}" for k, v in row.items()))
    path = os.environ.get("EMQ_FAULT_REPORT")
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(row) + "\n")


# --- producers: own ids, a failed call retried with the same ids ---------------------------

def job_ids_for(tag: str, n: int) -> List[str]:
    return [f"JOB-soak-{tag}-{i:06d}" for i in range(n)]


def classify(exc: BaseException, errors: Counter, untyped: Counter) -> None:
    """Count an error a producer saw; remember it separately if it is not an EmqError."""
    name = type(exc).__name__
    errors[name] += 1
    if not isinstance(exc, emqfast.EmqError):
        untyped[name] += 1


def retrying(call: Callable[[], Any], errors: Counter, untyped: Counter,
             deadline: float) -> Any:
    """Run ``call`` until it returns; any error is counted and the SAME call re-made (its
    job ids are fixed, so a re-sent enqueue is a ``duplicate`` no-op, never a copy)."""
    pause = 0.005
    while True:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - counted, typed or not; checked at the end
            classify(exc, errors, untyped)
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


def produce_sync(q: Queue, ids: Sequence[str], errors: Counter, untyped: Counter,
                 deadline: float) -> None:
    """Enqueue ``ids``: even blocks with one enqueue_many, odd blocks job by job."""
    for b, start in enumerate(range(0, len(ids), BLOCK)):
        block = list(ids[start:start + BLOCK])
        if b % 2 == 0:
            retrying(lambda: q.enqueue_many([{"i": j} for j in block], job_ids=block),
                     errors, untyped, deadline)
        else:
            for job_id in block:
                retrying(lambda: q.enqueue({"i": job_id}, job_id=job_id), errors, untyped,
                         deadline)


async def retrying_async(call: Callable[[], Any], errors: Counter, untyped: Counter,
                         deadline: float) -> Any:
    pause = 0.005
    while True:
        try:
            return await call()
        except Exception as exc:  # noqa: BLE001 - as retrying()
            classify(exc, errors, untyped)
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)


async def produce_async(q: "emqfast.aio.Queue", ids: Sequence[str], errors: Counter,
                        untyped: Counter, deadline: float) -> None:
    for b, start in enumerate(range(0, len(ids), BLOCK)):
        block = list(ids[start:start + BLOCK])
        if b % 2 == 0:
            await retrying_async(lambda: q.enqueue_many([{"i": j} for j in block],
                                                        job_ids=block),
                                 errors, untyped, deadline)
        else:
            for job_id in block:
                await retrying_async(lambda: q.enqueue({"i": job_id}, job_id=job_id),
                                     errors, untyped, deadline)


# --- the verdict, read on a direct (unproxied) connection ----------------------------------

def verdict(direct: redis.Redis, qname: str, ids: Sequence[str], execs: Counter,
            result: SoakResult) -> SoakResult:
    """Fill ``result`` from what Redis holds and what the handler counted."""
    q = Queue(qname, direct)
    k = q.keys
    completed = {j.decode() for j in direct.zrange(k.completed, 0, -1)}
    active = {j.decode() for j in direct.zrange(k.active, 0, -1)}
    result.jobs = len(ids)
    result.run_twice = sum(1 for j in ids if execs[j] > 1)
    result.never_run = sum(1 for j in completed if execs[j] == 0)
    result.stuck_active = len(active)
    result.not_completed = dict(where_left(direct, q, [j for j in ids if j not in completed]))
    result.lost = result.not_completed.get("nowhere", 0)
    pipe = direct.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(k.job(job_id), "attempts", "stalls")
    rows = pipe.execute()
    result.attempts_not_1 = sum(1 for a, _ in rows if a is not None and int(a) != 1)
    result.stalls = sum(int(s) for _, s in rows if s is not None)
    counts = q.counts()
    result.counts_ok = counts == {"scheduled": 0, "pending": 0, "grouped": 0, "active": 0,
                                  "completed": len(ids), "failed": 0,
                                  "cancelled": 0, "waiting_deps": 0, "expired": 0}
    if not result.counts_ok:
        result.not_completed["counts"] = counts  # type: ignore[assignment]
    return result


def where_left(direct: redis.Redis, q: Queue, left: Sequence[str]) -> Counter:
    """For jobs not completed: which set holds each ('nowhere' = lost), and how many have
    no hash. By set membership, not the hash: a job claimed by a lost claim reply is in
    the active set while its hash still reads pending."""
    k = q.keys
    sets = {"scheduled": k.delayed, "pending": k.pending, "active": k.active,
            "failed": k.failed}
    pipe = direct.pipeline(transaction=False)
    for job_id in left:
        for key in sets.values():
            pipe.zscore(key, job_id)
        pipe.exists(k.job(job_id))
    replies = pipe.execute()
    places: Counter = Counter()
    step = len(sets) + 1
    for i in range(len(left)):
        row = replies[i * step:(i + 1) * step]
        held = [name for name, score in zip(sets, row) if score is not None]
        places["+".join(held) or "nowhere"] += 1
        if not row[-1]:
            places["no_hash"] += 1
    return places


def wait_drained(done: Callable[[], int], n: int, worker_alive: Callable[[], bool],
                 deadline: float) -> None:
    """Wait until ``done() >= n``; return early (the verdict reports it) when the worker
    died, progress stopped for ``STALL_S``, or the hard deadline passed."""
    last, last_change = -1, time.monotonic()
    while time.monotonic() < deadline and worker_alive():
        now_done = done()
        if now_done >= n:
            return
        if now_done != last:
            last, last_change = now_done, time.monotonic()
        elif time.monotonic() - last_change > STALL_S:
            return
        time.sleep(0.02)


# --- the sync variant -------------------------------------------------------------------------

def soak_sync(upstream_port: int, qname: str, n_jobs: int = N_JOBS, seed: int = 1,
              producers: int = 2, concurrency: int = 8, fault: str = "cut c2s/s2c/rst",
              faults: Sequence[str] = ("c2s", "s2c", "rst"),
              gap_s: Sequence[float] = CHAOS_GAP_S, worker_after: bool = False,
              socket_timeout: float = 5.0, hold_s: float = 1.0) -> SoakResult:
    """Producers and one Worker, all through a fresh FaultProxy under chaos. With
    ``worker_after`` the Worker starts once every job is enqueued, so the cuts made while
    it drains (``cuts['while_draining']``) can only hit the Worker's connections."""
    result = SoakResult(fault=fault)
    t0 = time.monotonic()
    deadline = t0 + BUDGET_S
    errors: Counter = Counter()
    untyped: Counter = Counter()
    execs: Counter = Counter()
    lock = threading.Lock()
    direct = redis.Redis(port=upstream_port)
    with FaultProxy(upstream_port, seed=seed) as proxy:
        conn = emqfast.connect(proxy.url(), socket_timeout=socket_timeout)
        q = Queue(qname, conn)

        def handler(job: emqfast.Job) -> None:
            with lock:
                execs[job.id] += 1

        worker = Worker(q, handler, concurrency=concurrency, lease_ms=LEASE_MS,
                        keep_completed=10**9, name=f"soak-{qname}")
        worker_errors: List[BaseException] = []

        def run_worker() -> None:
            try:
                worker.run()
            except BaseException as exc:  # noqa: BLE001 - reported in the verdict
                worker_errors.append(exc)

        tags = [f"p{i}" for i in range(producers)]
        per = n_jobs // producers
        ids_of = {tag: job_ids_for(f"{qname}-{tag}", per) for tag in tags}
        chaos = proxy.chaos(BUDGET_S, gap_s=tuple(gap_s), faults=faults,  # type: ignore[arg-type]
                            hold_s=hold_s)
        wt = threading.Thread(target=run_worker, daemon=True, name="soak-worker")
        if not worker_after:
            wt.start()
        producer_errors: List[BaseException] = []

        def run_producer(tag: str) -> None:
            try:
                produce_sync(q, ids_of[tag], errors, untyped, deadline)
            except BaseException as exc:  # noqa: BLE001 - reported in the verdict
                producer_errors.append(exc)

        pts = [threading.Thread(target=run_producer, args=(t,), daemon=True) for t in tags]
        for t in pts:
            t.start()
        for t in pts:
            t.join(max(deadline - time.monotonic(), 0.1))
        ids = [j for tag in tags for j in ids_of[tag]]
        cuts_before_drain = chaos.total
        if worker_after:
            wt.start()
        wait_drained(lambda: direct.zcard(q.keys.completed), len(ids), wt.is_alive, deadline)
        chaos.stop()
        chaos.join()
        worker.stop()
        wt.join(30)
        result.cuts = dict(chaos.cuts)
        result.cuts["while_draining"] = chaos.total - cuts_before_drain
        if producer_errors:
            result.worker_error += f"producer: {producer_errors[0]!r}; "
        if worker_errors:
            result.worker_error += f"worker: {worker_errors[0]!r}"
        elif wt.is_alive():
            result.worker_error += "worker did not stop"
        conn.close()
    result.producer_errors = dict(errors)
    result.untyped_errors = dict(untyped)
    verdict(direct, qname, ids, execs, result)
    result.seconds = round(time.monotonic() - t0, 1)
    direct.close()
    return result


# --- the aio variant ----------------------------------------------------------------------------

async def _soak_aio(proxy: FaultProxy, direct: redis.Redis, qname: str, n_jobs: int,
                    producers: int, concurrency: int, result: SoakResult,
                    execs: Counter, errors: Counter, untyped: Counter,
                    deadline: float, chaos_opts: Dict[str, Any],
                    socket_timeout: float) -> List[str]:
    conn = emqfast.aio.connect(proxy.url(), socket_timeout=socket_timeout)
    q = emqfast.aio.Queue(qname, conn)

    async def handler(job: emqfast.Job) -> None:
        execs[job.id] += 1

    worker = emqfast.aio.Worker(q, handler, concurrency=concurrency, lease_ms=LEASE_MS,
                                keep_completed=10**9, name=f"soak-{qname}")
    wtask = asyncio.create_task(worker.run())
    tags = [f"p{i}" for i in range(producers)]
    per = n_jobs // producers
    ids_of = {tag: job_ids_for(f"{qname}-{tag}", per) for tag in tags}
    ptasks = [asyncio.create_task(produce_async(q, ids_of[t], errors, untyped, deadline))
              for t in tags]
    chaos = proxy.chaos(BUDGET_S, **chaos_opts)
    done, _ = await asyncio.wait(ptasks, timeout=max(deadline - time.monotonic(), 0.1))
    for t in done:
        if t.exception() is not None:
            result.worker_error += f"producer: {t.exception()!r}; "
    ids = [j for tag in tags for j in ids_of[tag]]
    # the direct client is blocking: poll it in a thread so the worker's loop runs on
    await asyncio.to_thread(wait_drained, lambda: direct.zcard(q.keys.completed), len(ids),
                            lambda: not wtask.done(), deadline)
    chaos.stop()
    chaos.join()
    result.cuts = dict(chaos.cuts)
    worker.stop()
    try:
        await asyncio.wait_for(wtask, 30)
    except BaseException as exc:  # noqa: BLE001 - reported in the verdict
        result.worker_error += f"worker: {exc!r}"
    for t in ptasks:
        t.cancel()
    await conn.aclose()
    return ids


def soak_aio(upstream_port: int, qname: str, n_jobs: int = N_JOBS, seed: int = 2,
             producers: int = 2, concurrency: int = 8, fault: str = "cut c2s/s2c/rst",
             faults: Sequence[str] = ("c2s", "s2c", "rst"),
             gap_s: Sequence[float] = CHAOS_GAP_S, socket_timeout: float = 5.0,
             hold_s: float = 1.0) -> SoakResult:
    """As :func:`soak_sync` with emqfast.aio: producer tasks and an aio Worker."""
    result = SoakResult(fault=fault)
    t0 = time.monotonic()
    deadline = t0 + BUDGET_S
    errors: Counter = Counter()
    untyped: Counter = Counter()
    execs: Counter = Counter()
    direct = redis.Redis(port=upstream_port)
    with FaultProxy(upstream_port, seed=seed) as proxy:
        chaos_opts = {"gap_s": tuple(gap_s), "faults": tuple(faults), "hold_s": hold_s}
        ids = asyncio.run(_soak_aio(proxy, direct, qname, n_jobs, producers, concurrency,
                                    result, execs, errors, untyped, deadline, chaos_opts,
                                    socket_timeout))
    result.producer_errors = dict(errors)
    result.untyped_errors = dict(untyped)
    verdict(direct, qname, ids, execs, result)
    result.seconds = round(time.monotonic() - t0, 1)
    direct.close()
    return result


# --- the tests ------------------------------------------------------------------------------------

def test_soak_reply_lost_storm_runs_every_job_exactly_once(redis_url, qname, backend):
    """Only server->client cuts, every 20-60 ms: each one loses the reply of a command
    Redis RAN (a claim, start, complete, enqueue batch...). The Worker starts after the
    producers, so the cuts made while it drains hit its connections only. Nothing may be
    re-run, double-counted or left leased to nobody."""
    result = soak_sync(upstream_port_of(redis_url), qname, n_jobs=6_000, seed=9,
                       faults=("s2c",), gap_s=(0.02, 0.06), worker_after=True,
                       fault=f"proxy reply-lost storm (sync, {backend})")
    report(result)
    assert result.cuts.get("s2c", 0) >= 5, result.cuts
    assert result.cuts["while_draining"] >= 1, result.cuts  # the Worker's own replies cut
    assert result.problems() == {}, result


def test_soak_late_replies_past_the_socket_timeout_run_every_job_exactly_once(
        redis_url, qname, backend):
    """A reply held past the client's socket timeout (0.3 s) every 50-200 ms: the client
    gives up (TimeoutError: the command may have run) while the reply is still on its way
    on that connection. A connection reused after a timeout would hand its stale reply to
    the next command; nothing may be lost, re-run, double-counted or left leased."""
    result = soak_sync(upstream_port_of(redis_url), qname, n_jobs=5_000, seed=12,
                       faults=("hold",), gap_s=(0.05, 0.2), socket_timeout=0.3, hold_s=0.6,
                       fault=f"proxy late replies (sync, {backend})")
    report(result)
    assert result.cuts.get("hold", 0) >= 5, result.cuts
    assert result.problems() == {}, result


def test_soak_late_replies_aio_run_every_job_exactly_once(redis_url, qname):
    """The late-replies soak with emqfast.aio (redis.asyncio connections time out alike;
    aio bulk calls use redis.asyncio under either backend, so one variant)."""
    result = soak_aio(upstream_port_of(redis_url), qname, n_jobs=5_000, seed=13,
                      faults=("hold",), gap_s=(0.05, 0.2), socket_timeout=0.3, hold_s=0.6,
                      fault="proxy late replies (aio)")
    report(result)
    assert result.cuts.get("hold", 0) >= 5, result.cuts
    assert result.problems() == {}, result


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_soak_through_cut_connections_runs_every_job_exactly_once(redis_url, qname, backend,
                                                                  facade):
    run = soak_sync if facade == "sync" else soak_aio
    result = run(upstream_port_of(redis_url), qname,
                 fault=f"proxy cuts ({facade}, {backend})")
    report(result)
    # the faults happened (a run lasts seconds: 10+ cuts; 5 leaves room for a fast one)
    assert sum(result.cuts.get(f, 0) for f in ("c2s", "s2c", "rst")) >= 5, result.cuts
    assert result.problems() == {}, result


def test_fault_proxy_cuts_a_reply_after_the_server_ran_the_command(fault_proxy, r, qname):
    """The proxy's s2c cut is what the soak relies on: the command ran, its reply is lost."""
    key = f"test:{{{qname}}}:n"
    proxy = fault_proxy  # the ready-made fixture other test modules import
    c = redis.Redis.from_url(proxy.url(), socket_timeout=5, retry=redis.retry.Retry(
        redis.backoff.NoBackoff(), 0))
    c.ping()
    assert proxy.cut("s2c", timeout_s=5)
    with pytest.raises(redis.ConnectionError):
        c.incr(key)
    assert r.get(key) == b"1"  # it ran
    c.ping()  # a fresh connection to cut
    assert proxy.cut("c2s", timeout_s=5)
    with pytest.raises(redis.ConnectionError):
        c.set(key + ":x", "y" * 1000)  # a request cut mid-way never runs
    assert r.get(key + ":x") is None
    c.ping()
    assert proxy.reset() and proxy.live() == 0
    assert c.ping()  # redis-py notices the reset idle connection and reconnects
    assert (proxy.stats["cut_s2c"], proxy.stats["cut_c2s"], proxy.stats["reset"]) == (1, 1, 1)
    c.close()


def test_fault_proxy_delays_pauses_resumes_and_stops_by_itself(redis_url):
    """The proxy's other faults: delay, paused acceptance (held, then dropped), and the
    lifetime bound that stops it even if nobody calls stop()."""
    from waiting import wait_until

    no_retry = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    with FaultProxy(upstream_port_of(redis_url), seed=4) as proxy:
        c = redis.Redis.from_url(proxy.url(), socket_timeout=5, retry=no_retry)
        proxy.delay(0.05)
        c.ping()
        assert proxy.stats["bytes_s2c"] > 0
        proxy.delay(0)
        proxy.pause()
        held = redis.Redis.from_url(proxy.url(), socket_timeout=0.3, retry=no_retry)
        with pytest.raises(redis.TimeoutError):
            held.ping()  # accepted by the kernel, never forwarded while paused
        proxy.resume()
        assert redis.Redis.from_url(proxy.url(), socket_timeout=5).ping()
        proxy.pause(drop=True)
        with pytest.raises(redis.ConnectionError):
            redis.Redis.from_url(proxy.url(), socket_timeout=5, retry=no_retry).ping()
        wait_until(lambda: proxy.stats["dropped_while_paused"] >= 1, 5, "a dropped connection")
        proxy.resume()
        c.close()
        held.close()
    short = FaultProxy(upstream_port_of(redis_url), seed=5, max_lifetime_s=0.2).start()
    live = redis.Redis.from_url(short.url(), socket_timeout=5, retry=no_retry)
    live.ping()
    wait_until(lambda: short._stopped.is_set() and short.live() == 0, 5,
               "the proxy to stop itself at its lifetime")
    with pytest.raises(redis.ConnectionError):
        live.ping()
    short.stop()


def test_fault_proxy_cut_after_exact_reply_bytes(redis_url, r, qname):
    """cut_after(n): the replies of a pipeline are cut after exactly n bytes; every
    command of it ran (the requests had all reached Redis)."""
    key = f"test:{{{qname}}}:n"
    no_retry = redis.retry.Retry(redis.backoff.NoBackoff(), 0)
    with FaultProxy(upstream_port_of(redis_url), seed=6) as proxy:
        c = redis.Redis.from_url(proxy.url(), socket_timeout=5, retry=no_retry)
        c.ping()
        proxy.cut_after(4 * 2 + 1)  # ":1\r\n" ":2\r\n" and one byte of the third reply
        pipe = c.pipeline(transaction=False)
        for _ in range(5):
            pipe.incr(key)
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
        assert r.get(key) == b"5" and proxy.stats["cut_after_s2c"] == 1
        assert c.incr(key) == 6  # one-shot: the next connection is not cut
        c.close()
