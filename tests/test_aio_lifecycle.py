"""The asyncio Worker's lifecycle: cancellation, loop teardown, signals, a Queue
reused across event loops, stop before run, lease renewals racing acks, loop stalls.

Signals and ``asyncio.run``'s teardown are tested in subprocesses."""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import redis

import emqfast
import emqfast.aio as emq
from emqfast.backends import scripts
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def _script(tmp_path, text):
    path = tmp_path / f"s{uuid.uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(text))
    return path


def _spawn(path, *args):
    # tests/ too: the scripts wait with tests/waiting.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "tests")])}
    return subprocess.Popen([sys.executable, str(path), *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


# --- a handler raising CancelledError -------------------------------------------------------

async def _raises(job):
    raise asyncio.CancelledError()


async def _awaits_cancelled_subtask(job):
    sub = asyncio.ensure_future(asyncio.sleep(30))
    asyncio.get_running_loop().call_later(0.01, sub.cancel)  # something else cancels it
    await sub


def _plain_raises(job):
    raise concurrent.futures.CancelledError()


@pytest.mark.parametrize("handler", [_raises, _awaits_cancelled_subtask, _plain_raises],
                         ids=["raises", "cancelled-subtask", "plain-concurrent"])
def test_handler_cancelled_error_is_a_failure_not_a_wedged_slot(redis_url, qname, handler):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url), attempts=1)
        refs = [await q.enqueue(i) for i in range(3)]
        w = emq.Worker(q, handler, concurrency=1, shutdown_timeout_s=2)
        stats = await w.run_until_idle(timeout_s=20)
        states = [(await q.get(r.id)).state for r in refs]
        counts = await q.counts()
        await q.aclose()
        return stats, states, counts
    stats, states, counts = run(main())
    assert states == ["failed"] * 3  # every job ran in turn: the one slot never wedged
    assert stats.failed == 3 and counts["active"] == 0


def test_thread_worker_records_a_cancelled_error_as_a_failure_too(redis_url, qname):
    """The same rule on the one worker core, driven by threads: a handler raising a
    BaseException (CancelledError) fails its job and frees its slot."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url), attempts=1)
    refs = [q.enqueue(i) for i in range(3)]
    stats = emqfast.Worker(q, _plain_raises, concurrency=1,
                           shutdown_timeout_s=2).run_until_idle(timeout_s=20)
    assert [q.get(r.id).state for r in refs] == ["failed"] * 3
    assert stats.failed == 3 and q.counts()["active"] == 0


# --- main() returning: asyncio.run's teardown cancels everything -----------------------------

_TEARDOWN = """
    import asyncio, sys, time
    import emqfast.aio as emq
    from waiting import wait_until_async

    url, qname, mode, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    started = finished = 0
    gate = None

    async def quick(job):  # all start, then all finish at once: outcomes queued together
        global started, finished
        started += 1
        await gate.wait()
        finished += 1
        return job.payload

    async def slow(job):
        global started
        started += 1
        await asyncio.sleep(60)

    def plain(job):  # a thread cannot be cancelled: teardown waits for it, then writes it
        global started
        started += 1
        time.sleep(1.0)
        return "done"

    async def main():
        global gate
        gate = asyncio.Event()
        q = emq.Queue(qname, emq.connect(url))
        handler = {"quick": quick, "slow": slow, "plain": plain}[mode]
        w = emq.Worker(q, handler, concurrency=want, shutdown_timeout_s=30, keep_completed=10_000)
        asyncio.ensure_future(w.run())  # never stopped nor awaited: main just returns
        await wait_until_async(lambda: started >= want, 30, "every handler to start",
                               interval=0.001)
        gate.set()
        if mode == "quick":
            await wait_until_async(lambda: finished >= want, 30, "every handler to finish",
                                   interval=0)
        print("returning", started, finished, flush=True)

    asyncio.run(main())
    print("exited", flush=True)
"""


@pytest.mark.parametrize("mode,jobs,in_flight", [("quick", 1200, 1200), ("slow", 20, 8),
                                                 ("plain", 10, 4)])
def test_main_returning_writes_outcomes_and_releases_in_flight(redis_url, qname, r, tmp_path,
                                                               mode, jobs, in_flight):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue_many(list(range(jobs)))
    proc = _spawn(_script(tmp_path, _TEARDOWN), redis_url, qname, mode, in_flight)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "exited" in out, out
    counts = q.counts()
    assert counts["active"] == 0, (counts, out)  # nothing left to wait for lease expiry
    assert r.hlen(q.keys.leases) == 0
    if mode == "quick":  # every finished handler's outcome was written
        assert counts["completed"] == 1200, counts
    elif mode == "plain":  # the running threads finished, their outcomes were written
        assert counts["completed"] == in_flight and counts["pending"] == jobs - in_flight
    else:  # the cancelled handlers ended: their jobs are back, ready for another worker
        assert counts["pending"] == jobs and counts["completed"] == 0, counts


# --- cancelling run() twice ---------------------------------------------------------------------

def _named_connections(r, name):
    return sum(1 for c in r.client_list() if c.get("name") == name)


def test_cancelling_run_twice_leaves_nothing_running(redis_url, qname, r):
    name = f"lc-{qname}"

    async def main():
        before = asyncio.all_tasks()
        q = emq.Queue(qname, emq.connect(redis_url, client_name=name))
        await q.enqueue_many(list(range(4)))
        started = asyncio.Event()

        async def hung(job):
            started.set()
            await asyncio.sleep(3600)

        w = emq.Worker(q, hung, concurrency=2, lease_ms=600, shutdown_timeout_s=30)
        task = asyncio.create_task(w.run())
        await asyncio.wait_for(started.wait(), 15)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()  # the second cancel: the shutdown hurries, still ends everything
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        others = list(asyncio.all_tasks() - before)
        counts = await q.counts()
        marker_conns = [c for c in await q.redis.client_list()
                        if c.get("name") == name and c.get("cmd") == "bzpopmin"]
        await asyncio.sleep(1.0)  # a lease loop still running would renew within this
        leases = await q.redis.hlen(q.keys.leases)
        await q.aclose()
        return others, counts, marker_conns, leases
    others, counts, marker_conns, leases = run(main())
    assert others == []  # no acker, lease loop or job task left behind
    assert counts["active"] == 0 and counts["pending"] == 4  # the hung jobs were released
    assert marker_conns == [] and leases == 0


# --- several Workers, one SIGTERM ---------------------------------------------------------------

_MANY = """
    import asyncio, signal, sys
    import emqfast.aio as emq

    async def handler(job):
        await asyncio.sleep(0.3)

    async def main():
        q = emq.Queue(sys.argv[2], emq.connect(sys.argv[1]))
        workers = [emq.Worker(q, handler, concurrency=2, name=f"w{i}") for i in range(3)]
        # the first worker ends early: its exit must not take the others' signal handler
        quitter = emq.Worker(q, handler, concurrency=1, name="quitter")
        quitter.stop()
        tasks = [asyncio.ensure_future(w.run()) for w in workers]
        await quitter.run()
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        print("serving", flush=True)
        stats = await asyncio.gather(*tasks)
        print("stopped", [s.completed for s in stats], flush=True)

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the workers serve
    asyncio.run(main())
"""


def test_one_sigterm_stops_every_worker_gracefully(redis_url, qname, tmp_path):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue_many(list(range(200)))
    proc = _spawn(_script(tmp_path, _MANY), redis_url, qname)
    try:
        first = []  # (a log line may come first, e.g. which backend loaded)
        while len(first) < 3 and "serving" not in first:
            first.append(proc.stdout.readline().strip())
        assert "serving" in first, first
        wait_until(lambda: q.counts()["active"] >= 4, timeout=15, what="jobs in flight")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "stopped" in out, out  # graceful, all three workers
    assert q.counts()["active"] == 0


# --- one Queue, several event loops -------------------------------------------------------------

_NEEDS_LOOP_39 = pytest.mark.skipif(
    sys.version_info < (3, 10),
    reason="redis-py 7 (the last for Python 3.9) makes asyncio locks when a client is built; "
           "on 3.9 that needs a current event loop, so build emqfast.aio clients inside one")


@_NEEDS_LOOP_39
def test_queue_reused_across_event_loops_and_threads(redis_url, qname):
    q = emq.Queue(qname, emq.connect(redis_url))  # made outside any loop, as at import time

    async def enqueue(i):
        return (await q.enqueue({"i": i})).id

    ids = [asyncio.run(enqueue(i)) for i in range(4)]
    from_thread = []
    t = threading.Thread(target=lambda: from_thread.append(asyncio.run(enqueue(99))))
    t.start()
    t.join(30)

    async def drain():
        return await emq.Worker(q, lambda job: None).run_until_idle(timeout_s=20)
    stats = asyncio.run(drain())
    assert len(set(ids + from_thread)) == 5 and stats.completed == 5

    async def count():
        return (await q.counts())["completed"]
    assert asyncio.run(count()) == 5  # each job exactly once: nothing was sent twice


@_NEEDS_LOOP_39
def test_an_uncopiable_client_fails_on_another_loop_before_sending(redis_url, qname, r):
    client = emq.connect(redis_url, single_connection_client=True)
    q = emq.Queue(qname, client)

    async def enqueue():
        return await q.enqueue(1)
    asyncio.run(enqueue())
    with pytest.raises(emqfast.InvalidInput, match="event loop"):
        asyncio.run(enqueue())
    assert emqfast.Queue(qname, r).counts()["pending"] == 1


# --- stop() before run() ----------------------------------------------------------------------

def test_stop_before_run_is_honoured_by_both_workers(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        w = emq.Worker(q, lambda job: None)
        w.stop()
        await asyncio.wait_for(w.run(), 10)  # returns: the stop was not forgotten
        await q.aclose()
    run(main())

    sync_worker = emqfast.Worker(emqfast.Queue(qname, redis.Redis.from_url(redis_url)),
                                 lambda job: None)
    sync_worker.stop()
    t = threading.Thread(target=sync_worker.run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()


# --- no false "lease lost" warnings --------------------------------------------------------------

def test_no_lease_lost_warning_for_a_job_being_acked(redis_url, qname, caplog, monkeypatch):
    original = scripts.Script.call_async

    async def slow_extend(self, client, keys, args):  # an extend that lands after the ack
        if self.name == "extend":
            await asyncio.sleep(0.25)
        return await original(self, client, keys, args)
    monkeypatch.setattr(scripts.Script, "call_async", slow_extend)

    async def handler(job):
        await asyncio.sleep(0.2)  # a renewal falls due (lease 400 ms: a third used)

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(40)))
        stats = await emq.Worker(q, handler, concurrency=20, lease_ms=400).run_until_idle(20)
        await q.aclose()
        return stats
    with caplog.at_level(logging.WARNING, logger="emqfast"):
        stats = run(main())
    assert stats.completed == 40 and stats.lease_lost == 0
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]


def test_thread_worker_gives_no_lease_lost_warning_for_a_job_being_acked(redis_url, qname,
                                                                        caplog, monkeypatch):
    original = scripts.Script.__call__

    def slow_extend(self, client, keys, args):  # an extend that lands after the job's ack
        if self.name == "extend":
            time.sleep(0.25)
        return original(self, client, keys, args)
    monkeypatch.setattr(scripts.Script, "__call__", slow_extend)

    def handler(job):
        time.sleep(0.2)  # a renewal falls due (lease 400 ms: a third used)

    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue_many(list(range(40)))
    with caplog.at_level(logging.WARNING, logger="emqfast"):
        stats = emqfast.Worker(q, handler, concurrency=20, lease_ms=400).run_until_idle(20)
    assert stats.completed == 40 and stats.lease_lost == 0
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]


# --- a handler blocking the loop -----------------------------------------------------------------

def test_a_handler_blocking_the_loop_is_named_in_a_warning(redis_url, qname, caplog):
    async def handler(job):
        if job.payload == "hog":
            time.sleep(0.4)  # blocks the loop: 80 % of the lease
        else:
            await asyncio.sleep(0.5)

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("other")
        hog = await q.enqueue("hog")
        await emq.Worker(q, handler, concurrency=2, lease_ms=500).run_until_idle(20)
        await q.aclose()
        return hog.id
    with caplog.at_level(logging.WARNING, logger="emqfast"):
        hog_id = run(main())
    assert [r for r in caplog.records
            if hog_id in r.getMessage() and "blocked the event loop" in r.getMessage()]


# --- start/stop 100 times in one loop -------------------------------------------------------------

def test_start_stop_100_times_leaves_no_task_connection_or_lease(redis_url, qname, r):
    name = f"lc-{qname}"

    async def handler(job):
        await asyncio.sleep(0.05 if job.payload % 2 else 30)

    async def main():
        before = asyncio.all_tasks()
        q = emq.Queue(qname, emq.connect(redis_url, client_name=name))
        await q.enqueue_many(list(range(400)))
        peak = 0
        for cycle in range(100):
            w = emq.Worker(q, handler, concurrency=4, lease_ms=2000, shutdown_timeout_s=0.02)
            task = asyncio.create_task(w.run())
            await asyncio.sleep(0.02)  # claims, starts, handlers in flight
            if cycle % 2:
                w.stop()
                await asyncio.wait_for(task, 30)
            else:
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await asyncio.wait_for(task, 30)
            peak = max(peak, _named_connections(r, name))
        others = list(asyncio.all_tasks() - before)
        leases = await q.redis.hlen(q.keys.leases)
        active = (await q.counts())["active"]
        conns = _named_connections(r, name)
        await q.aclose()
        return others, leases, active, conns, peak
    # a hang is caught per cycle (30 s each, above); the whole run, ~8 s alone, may take
    # many times that on a loaded 2-core machine: bounded only below pytest's own timeout
    others, leases, active, conns, peak = run(main(), timeout=280)
    assert others == [] and leases == 0 and active == 0
    assert conns <= 6 and peak <= 8, (conns, peak)  # the pool's few, no marker conn per run
