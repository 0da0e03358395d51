"""pause() pauses, across worker processes.

The promise: once ``pause()`` has returned, no job is started anywhere (start.lua, which
stamps a job's ``started`` time on the server clock, is fenced by the pause), and jobs a
worker holds beyond its running ones (prefetched) go back to the queue instead of
waiting to run. A job is started only into a free handler slot, so the only handlers
that may begin after pause() returned are those whose job was started just before it,
at most one per slot. Running handlers finish.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import emqfast
from engine_util import server_ms
from waiting import wait_until

PROCS = str(Path(__file__).with_name("pause_procs.py"))
SLOTS = 2 + 2 + 4  # two thread workers at concurrency 2, one asyncio worker at 4


def _start(mode: str, redis_url: str, qname: str, begins: str, ready: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PROCS, mode, redis_url, qname, begins, ready],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_no_job_starts_after_pause_returns_across_processes(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    begins, ready = f"test:{qname}:begins", f"test:{qname}:ready"
    refs = q.enqueue_many([{"n": i} for i in range(400)])
    procs = [_start(m, redis_url, qname, begins, ready) for m in ("thread", "thread", "aio")]
    try:
        wait_until(lambda: len(r.keys(ready + ":*")) == 3, 60, "three workers serving")
        # the thread workers hold prefetched jobs beyond their running ones by now
        wait_until(lambda: r.hlen(begins) >= 40, 60, "40 handlers begun")
        q.pause()
        paused_at = server_ms(r)
        # held jobs go back; running handlers (20 ms each) finish
        wait_until(lambda: r.zcard(q.keys.active) == 0, 30, "no job active or held")
        done = r.hgetall(begins)
        late = {jid.decode() for jid, ms in done.items() if int(ms) > paused_at}
        assert len(late) <= SLOTS, f"{len(late)} handlers began after pause() returned"
        for jid in late:  # each was started before pause() returned, into a free slot
            assert int(r.hget(q.keys.job(jid), "started")) <= paused_at
        counts = q.counts()
        assert counts["active"] == 0 and counts["pending"] == 400 - len(done) - counts["scheduled"]
        # nothing starts while paused, however long
        seen = len(done)
        q.promote()
        wait_until(lambda: r.zcard(q.keys.delayed) == 0, 10, "parked jobs back on pending")
        assert r.hlen(begins) == seen and q.counts()["pending"] == 400 - seen
        q.resume()
        wait_until(lambda: q.counts()["completed"] == 400, 60, "all 400 done after resume")
    finally:
        _stop(procs)
    runs = r.hgetall(begins + ":runs")
    assert len(runs) == 400 and all(int(n) == 1 for n in runs.values())  # each ran once
    assert {ref.id for ref in refs} == {jid.decode() for jid in runs}
