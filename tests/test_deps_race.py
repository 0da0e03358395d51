"""Dependencies under racing processes. Four producers enqueue graphs (three
roots, a dependent on another queue, a dependent of that one back on the first) while
four workers (thread and asyncio, two per queue) run them: every job runs exactly once,
and every dependent begins only after each of its dependencies' handlers ended (the
order of a list in Redis that the handlers append to)."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import emqfast
from waiting import wait_until

PROCS = str(Path(__file__).with_name("deps_procs.py"))
PRODUCERS, GROUPS = 4, 25
JOBS = PRODUCERS * GROUPS * 5


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PROCS, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


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


def test_eight_processes_run_each_dependent_once_after_its_dependencies(redis_url, qname, r):
    qa, qb, tag = qname + "-a", qname + "-b", f"test:{qname}"
    a = emqfast.Queue(qa, emqfast.connect(redis_url))
    b = emqfast.Queue(qb, emqfast.connect(redis_url))
    workers = [_start(mode, redis_url, q, tag) for mode, q in
               (("thread", qa), ("aio", qa), ("thread", qb), ("aio", qb))]
    producers = []
    try:
        wait_until(lambda: len(r.keys(tag + ":ready:*")) == 4, 60, "four workers serving")
        producers = [_start("produce", redis_url, qa, qb, tag, str(GROUPS))
                     for _ in range(PRODUCERS)]
        for p in producers:
            assert p.wait(120) == 0, p.stderr.read().decode()[-2000:]
        wait_until(lambda: a.counts()["completed"] + b.counts()["completed"] == JOBS, 120,
                   f"all {JOBS} jobs completed")
    finally:
        _stop(workers + producers)
    log = [x.decode() for x in r.lrange(tag + ":log", 0, -1)]
    starts = [x[2:] for x in log if x.startswith("s:")]
    produced = {x.decode() for x in r.lrange(tag + ":produced", 0, -1)}
    assert len(produced) == JOBS
    assert sorted(starts) == sorted(produced), "a job ran twice or never"
    where = {entry: i for i, entry in enumerate(log)}
    dependents = {k.decode(): v.decode().split(",") for k, v in r.hgetall(tag + ":deps").items()}
    assert len(dependents) == PRODUCERS * GROUPS * 2
    early = [(job, dep) for job, deps in dependents.items() for dep in deps
             if where["s:" + job] < where["e:" + dep]]
    assert early == [], f"dependents began before a dependency ended: {early[:5]}"
    assert a.counts()["waiting_deps"] == b.counts()["waiting_deps"] == 0
    assert a.counts()["failed"] == b.counts()["failed"] == 0
    for key in r.scan_iter(f"test:{qname}*"):
        r.delete(key)
