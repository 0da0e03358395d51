"""Runs one peer (bullmq, rq, arq) on one workload and prints a JSON line.

Executed by the peers' own virtualenv (see peers.py), never imported by
emqfast: ``python peer_driver.py <peer> <workload> <redis url> <n>``.
Workloads: ``enqueue`` (bulk-add n tiny jobs), ``drain`` (one worker process
runs n no-op jobs; each must run exactly once), ``memory-pending`` /
``memory-delayed`` / ``memory-prioritized`` (BullMQ's Redis bytes per job, payload
"{}" excluded; BullMQ keeps priority-0 jobs in a list, prioritized ones in a zset).
"""
import asyncio
import json
import sys
import time
import uuid
from importlib.metadata import version

import redis

SEEN = []  # ids the no-op handlers saw (exactly-once check)
PAYLOAD_BYTES = 2  # data {} is stored as "{}"


def noop(*args, **kwargs):
    """RQ's job function (in-process SimpleWorker, so SEEN is this module's list)."""
    from rq import get_current_job
    SEEN.append(get_current_job().id)


def wait_for(predicate, timeout_s, what):
    """Poll with a deadline."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


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
            await queue.addBulk([{"name": "noop", "data": {}} for _ in range(n)])
            seen = []

            async def process(job, token):
                seen.append(job.id)

            t0 = time.perf_counter()
            worker = Worker(name, process, {"connection": url, "concurrency": 8})
            while len(seen) < n or await queue.getCompletedCount() < n:
                await asyncio.sleep(0.005)
                if time.perf_counter() - t0 > 3600:
                    raise SystemExit("bullmq drain timed out")
            dt = time.perf_counter() - t0
            await worker.close()
            assert len(seen) == n and len(set(seen)) == n, "not exactly once"
            out.update(jobs_per_s=n / dt, verified=f"{n}/{n} completed exactly once",
                       config="Worker concurrency=8")
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
    try:
        data = [Queue.prepare_data(noop, result_ttl=3600) for _ in range(n)]
        if workload == "enqueue":
            t0 = time.perf_counter()
            jobs = q.enqueue_many(data)
            dt = time.perf_counter() - t0
            assert len(jobs) == n and q.count == n, f"{q.count} of {n} queued"
            out.update(jobs_per_s=n / dt, verified=f"{q.count}/{n} queued")
        else:
            jobs = q.enqueue_many(data)
            w = SimpleWorker([q], connection=conn)
            worker_keys.append(w.key)
            t0 = time.perf_counter()
            w.work(burst=True, logging_level="WARNING")
            dt = time.perf_counter() - t0
            done = q.finished_job_registry.count
            assert len(SEEN) == n and len(set(SEEN)) == n and done == n, \
                f"ran {len(SEEN)} ({len(set(SEEN))} distinct), finished {done} of {n}"
            out.update(jobs_per_s=n / dt, verified=f"{n}/{n} finished exactly once",
                       config="SimpleWorker (no fork), burst")
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
        for start in range(0, n, 32):  # arq has no bulk add: gather small slices (pool size)
            jobs = await asyncio.gather(*[pool.enqueue_job("arq_noop", _queue_name=name)
                                          for _ in range(min(32, n - start))])
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
                       burst=True, handle_signals=False, max_jobs=8)
            t0 = time.perf_counter()
            await w.main()
            dt = time.perf_counter() - t0
            assert len(SEEN) == n and len(set(SEEN)) == n and w.jobs_complete == n, \
                f"ran {len(SEEN)}, complete {w.jobs_complete} of {n}"
            out.update(jobs_per_s=n / dt, verified=f"{n}/{n} complete exactly once",
                       config="Worker max_jobs=8, burst")
            await w.close()
    finally:
        keys = [name] + [f"arq:job:{i}" for i in ids] + [f"arq:result:{i}" for i in ids]
        for start in range(0, len(keys), 1000):
            await pool.delete(*keys[start:start + 1000])
        await pool.aclose() if hasattr(pool, "aclose") else await pool.close()
    return out


def main(argv):
    peer, workload, url, n = argv[0], argv[1], argv[2], int(argv[3])
    if peer == "bullmq":
        out = asyncio.run(bullmq_run(workload, url, n))
    elif peer == "rq":
        out = rq_run(workload, url, n)
    elif peer == "arq":
        out = asyncio.run(arq_run(workload, url, n))
    else:
        raise SystemExit(f"unknown peer {peer}")
    out.update(peer=peer, workload=workload, n=n)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
