"""Runs one peer (bullmq, rq, arq, saq) on one workload and prints a JSON line.

Executed by that peer's own virtualenv (see peers.py), never imported by
emqfast: ``python peer_driver.py <peer> <workload> <redis url> <n>``.
Workloads: ``enqueue`` (bulk-add n tiny jobs), ``drain`` (one worker process
runs n no-op jobs; how many ran, how many twice and how many never are
reported, not asserted: a peer that double-runs a job is shown doing so; so is
the count of completed jobs the peer itself keeps, ``peer_completed``),
``memory-pending`` / ``memory-delayed`` / ``memory-prioritized`` (BullMQ's Redis
bytes per job, payload "{}" excluded; BullMQ keeps priority-0 jobs in a list,
prioritized ones in a zset).
"""
import asyncio
import json
import sys
import time
import uuid
from importlib.metadata import version

import redis

SEEN = []  # ids the no-op handlers saw, once per run (exactly-once check)
PAYLOAD_BYTES = 2  # data {} is stored as "{}"
IN_FLIGHT = 32  # enqueues awaited together by peers without a bulk add (arq, SAQ)
CONCURRENCY = 8  # jobs one worker process runs at once, as emqfast's default Worker
DRAIN_TIMEOUT_S = 600
CLOSE_TIMEOUT_S = 20  # a worker's close, after the drain was timed


def noop(*args, **kwargs):
    """RQ's job function (in-process SimpleWorker, so SEEN is this module's list)."""
    from rq import get_current_job
    SEEN.append(get_current_job().id)


def drained(ids, n, seconds, config):
    """The drain's figures: rate, and runs / duplicates / losses against the ids enqueued."""
    ids = set(ids)
    ran = [i for i in SEEN if i in ids]
    distinct = len(set(ran))
    return {"jobs_per_s": n / seconds, "runs": len(ran), "distinct": distinct,
            "duplicates": len(ran) - distinct, "lost": n - distinct, "config": config}


async def wait_drained(ids, finished, what):
    """Poll until every id ran and ``finished()`` (the peer's own count) says all are done."""
    ids = set(ids)
    deadline = time.perf_counter() + DRAIN_TIMEOUT_S
    while len(ids.intersection(SEEN)) < len(ids) or not await finished():
        if time.perf_counter() > deadline:
            raise SystemExit(f"{what} drain timed out: {len(ids.intersection(SEEN))} ran")
        await asyncio.sleep(0.005)


async def gather_in_slices(n, enqueue_one):
    """``enqueue_one()`` n times, IN_FLIGHT awaited together (no bulk API)."""
    out = []
    for start in range(0, n, IN_FLIGHT):
        out += await asyncio.gather(*[enqueue_one() for _ in range(min(IN_FLIGHT, n - start))])
    return out


# --- BullMQ -----------------------------------------------------------------------
async def bullmq_run(workload, url, n):
    from bullmq import Queue, Worker

    name = f"bench-peer-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, {"connection": url})
    plain = redis.Redis.from_url(url)
    out = {"version": version("bullmq")}
    try:
        if workload == "enqueue":
            t0 = time.perf_counter()
            jobs = await queue.addBulk([{"name": "noop", "data": {}} for _ in range(n)])
            dt = time.perf_counter() - t0
            waiting = await queue.getWaitingCount()
            assert len(jobs) == n and waiting == n, f"{waiting} of {n} waiting"
            out.update(jobs_per_s=n / dt, verified=f"{waiting}/{n} waiting")
        elif workload.startswith("memory"):
            state = workload.split("-", 1)[1]  # pending / delayed / prioritized
            opts = {"delayed": {"delay": 3_600_000}, "prioritized": {"priority": 1}}.get(state, {})
            where = {"delayed": "delayed", "prioritized": "prioritized"}.get(state, "waiting")
            await queue.add("warm", {})
            before = int(plain.info("memory")["used_memory"])
            await queue.addBulk([{"name": "noop", "data": {}, "opts": opts} for _ in range(n)])
            after = int(plain.info("memory")["used_memory"])
            counts = await queue.getJobCounts(where)
            stored = counts[where] - (1 if where == "waiting" else 0)
            assert stored == n, f"{counts} after adding {n}"
            out.update(bytes_per_job=(after - before) / n - PAYLOAD_BYTES,
                       verified=f"{n}/{n} stored")
        else:  # drain
            jobs = await queue.addBulk([{"name": "noop", "data": {}} for _ in range(n)])

            async def process(job, token):
                SEEN.append(job.id)

            async def finished():
                return await queue.getCompletedCount() >= n

            t0 = time.perf_counter()
            worker = Worker(name, process, {"connection": url, "concurrency": CONCURRENCY})
            await wait_drained([j.id for j in jobs], finished, "bullmq")
            dt = time.perf_counter() - t0
            out.update(drained([j.id for j in jobs], n, dt, f"Worker concurrency={CONCURRENCY}"))
            try:  # after the clock: BullMQ-py's close now and then never returns
                await asyncio.wait_for(worker.close(), CLOSE_TIMEOUT_S)
            except asyncio.TimeoutError:
                out["close_timed_out"] = True
    finally:
        await queue.obliterate(force=True)
        await queue.close()
        plain.close()
    return out


# --- RQ ------------------------------------------------------------------------------
def rq_run(workload, url, n):
    from rq import Queue, SimpleWorker

    conn = redis.Redis.from_url(url)
    q = Queue(f"bench-peer-{uuid.uuid4().hex[:8]}", connection=conn)
    out = {"version": version("rq")}
    jobs, worker_keys = [], []
    if not conn.exists("rq:clean_groups"):  # RQ's own lock: delete it if this run sets it
        worker_keys.append("rq:clean_groups")
    try:
        data = [Queue.prepare_data(noop, result_ttl=3600) for _ in range(n)]
        if workload == "enqueue":
            t0 = time.perf_counter()
            with conn.pipeline() as pipe:  # RQ's bulk path: one pipeline for all n
                jobs = q.enqueue_many(data, pipeline=pipe)
                pipe.execute()
            dt = time.perf_counter() - t0
            assert len(jobs) == n and q.count == n, f"{q.count} of {n} queued"
            out.update(jobs_per_s=n / dt, verified=f"{q.count}/{n} queued")
        else:
            with conn.pipeline() as pipe:
                jobs = q.enqueue_many(data, pipeline=pipe)
                pipe.execute()
            w = SimpleWorker([q], connection=conn)
            worker_keys.append(w.key)
            t0 = time.perf_counter()
            w.work(burst=True, logging_level="WARNING")
            dt = time.perf_counter() - t0
            out.update(drained([j.id for j in jobs], n, dt, "SimpleWorker (in-process, no fork), burst"),
                       peer_completed=q.finished_job_registry.count)
    finally:
        q.delete(delete_jobs=True)
        keys = worker_keys + list(conn.scan_iter(match=f"rq:*{q.name}*", count=1000))
        for job in jobs:
            keys += [f"rq:job:{job.id}", f"rq:results:{job.id}"]
        for start in range(0, len(keys), 1000):
            conn.delete(*keys[start:start + 1000])
        conn.close()
    return out


# --- arq -----------------------------------------------------------------------------
async def arq_noop(ctx):
    SEEN.append(ctx["job_id"])


async def arq_run(workload, url, n):
    from arq import create_pool
    from arq.connections import RedisSettings
    from arq.worker import Worker

    name = f"bench-peer-{uuid.uuid4().hex[:8]}"
    settings = RedisSettings.from_dsn(url)
    pool = await create_pool(settings)
    out = {"version": version("arq")}
    ids = []

    async def enqueue_all():
        jobs = await gather_in_slices(n, lambda: pool.enqueue_job("arq_noop", _queue_name=name))
        ids.extend(j.job_id for j in jobs)

    try:
        if workload == "enqueue":
            t0 = time.perf_counter()
            await enqueue_all()
            dt = time.perf_counter() - t0
            queued = await pool.zcard(name)
            assert queued == n, f"{queued} of {n} queued"
            out.update(jobs_per_s=n / dt, verified=f"{queued}/{n} queued")
        else:
            await enqueue_all()
            w = Worker(functions=[arq_noop], redis_settings=settings, queue_name=name,
                       burst=True, handle_signals=False, max_jobs=CONCURRENCY)
            t0 = time.perf_counter()
            await w.main()
            dt = time.perf_counter() - t0
            out.update(drained(ids, n, dt, f"Worker max_jobs={CONCURRENCY}, burst"),
                       peer_completed=w.jobs_complete)
            await w.close()
    finally:
        keys = [name] + [f"arq:job:{i}" for i in ids] + [f"arq:result:{i}" for i in ids]
        for start in range(0, len(keys), 1000):
            await pool.delete(*keys[start:start + 1000])
        await pool.aclose() if hasattr(pool, "aclose") else await pool.close()
    return out


# --- SAQ -----------------------------------------------------------------------------
async def saq_noop(ctx):
    SEEN.append(ctx["job"].key)


async def saq_run(workload, url, n):
    from saq import Queue, Worker

    name = f"bench-peer-{uuid.uuid4().hex[:8]}"
    queue = Queue.from_url(url, name=name)
    await queue.connect()
    plain = redis.Redis.from_url(url)
    before = set(plain.scan_iter(match="saq:*", count=1000))  # SAQ's worker keys: ours are new
    out = {"version": version("saq")}

    async def enqueue_all():
        jobs = await gather_in_slices(n, lambda: queue.enqueue("saq_noop"))
        assert all(jobs), "an enqueue was refused"
        return [j.key for j in jobs]

    try:
        if workload == "enqueue":
            t0 = time.perf_counter()
            await enqueue_all()
            dt = time.perf_counter() - t0
            queued = await queue.count("queued")
            assert queued == n, f"{queued} of {n} queued"
            out.update(jobs_per_s=n / dt, verified=f"{queued}/{n} queued")
        else:
            keys = await enqueue_all()

            async def finished():
                return await queue.count("incomplete") == 0

            worker = Worker(queue, functions=[saq_noop], concurrency=CONCURRENCY)
            worker.SIGNALS = []  # the driver is stopped by its parent, not by a signal
            t0 = time.perf_counter()
            running = asyncio.create_task(worker.start())
            await wait_drained(keys, finished, "saq")
            dt = time.perf_counter() - t0
            await worker.stop()
            await running
            out.update(drained(keys, n, dt, f"Worker concurrency={CONCURRENCY}"))
    finally:
        await queue.disconnect()
        stale = list(set(plain.scan_iter(match="saq:*", count=1000)) - before)
        for start in range(0, len(stale), 1000):
            plain.delete(*stale[start:start + 1000])
        plain.close()
    return out


def main(argv):
    peer, workload, url, n = argv[0], argv[1], argv[2], int(argv[3])
    if peer == "bullmq":
        out = asyncio.run(bullmq_run(workload, url, n))
    elif peer == "rq":
        out = rq_run(workload, url, n)
    elif peer == "arq":
        out = asyncio.run(arq_run(workload, url, n))
    elif peer == "saq":
        out = asyncio.run(saq_run(workload, url, n))
    else:
        raise SystemExit(f"unknown peer {peer}")
    out.update(peer=peer, workload=workload, n=n)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
