"""Expiry: ``enqueue(..., expires_ms=E)`` on both facades and both backends. A
job not started within E of becoming due (its run-at, or its enqueue when due at once) is
never run: a running Worker's start (start.lua) ends it as ``expired`` — its kept record on
the expired set, an ``expired`` event, the metrics counter, ``counts()``,
``job_ids('expired')``, the CLI's ``--state expired``, the waiters told — and retention
trims those records like cancelled ones. A job that ran once (a retry) no longer expires.
Bad input is typed and leaves Redis byte-identical."""
from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
from typing import Any, Iterator, List

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from emqfast import Backoff, InvalidInput
from emqfast.core.errors import RangeError
from engine_util import running_worker, wait_server_past
from waiting import wait_until

HOUR_MS = 3_600_000


@contextlib.contextmanager
def _running(facade: str, q: Any, ran: List[Any], **opts: Any) -> Iterator[None]:
    """A Worker of ``facade`` serving ``q`` for the block; each run's payload goes to ran."""
    if facade == "sync":
        with running_worker(emqfast.Worker(q, lambda job: ran.append(job.payload), **opts)):
            yield
        return

    async def handler(job: Any) -> None:
        ran.append(job.payload)
    worker = emqfast.aio.Worker(q, handler, **opts)
    thread = threading.Thread(target=lambda: asyncio.run(worker.run()), daemon=True)
    thread.start()
    try:
        yield
    finally:
        wait_until(lambda: worker._loop is not None, 10, "the aio worker to start")
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def _queue(facade: str, name: str, url: str) -> Any:
    if facade == "sync":
        return emqfast.Queue(name, url)
    return emqfast.aio.Queue(name, emqfast.aio.connect(url))


def _do(q: Any, method: str, *args: Any, **kwargs: Any) -> Any:
    out = getattr(q, method)(*args, **kwargs)
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


@pytest.mark.parametrize("facade", ["sync", "aio"])
def test_expired_jobs_never_run_while_a_worker_serves_the_queue(backend, facade, r,
                                                                 redis_url, qname):
    sync = emqfast.Queue(qname, r)
    sync.pause()  # the worker runs but starts nothing until resume: the deadlines pass
    q = _queue(facade, qname, redis_url)
    keep = _do(q, "enqueue", "keep", expires_ms=HOUR_MS)
    plain = _do(q, "enqueue", "plain")
    gone = _do(q, "enqueue", "gone", expires_ms=50)
    later = _do(q, "enqueue_in", "later", 50, expires_ms=50)
    many = _do(q, "enqueue_many", ["m1", "m2"], expires_ms=50)
    grouped = _do(q, "enqueue", "grouped", group="g", expires_ms=50)
    expiring = [gone.id, later.id, *(ref.id for ref in many), grouped.id]
    ran: List[Any] = []
    with _running(facade, q, ran, concurrency=2):
        wait_server_past(r, max(int(r.hget(q.keys.job(i), "exp")) for i in expiring))
        sync.resume()
        wait_until(lambda: sync.counts()["expired"] == 5 and sync.counts()["completed"] == 2,
                   30, "the expired and the completed jobs")
    assert sorted(ran) == ["keep", "plain"]  # the expired ones never ran
    assert {keep.id, plain.id} == set(sync.job_ids("completed"))
    assert set(sync.job_ids("expired")) == set(expiring)
    for job_id in expiring:
        job = sync.get(job_id)
        assert job.state == "expired" and job.attempts == 0 and job.finished_ms
    assert r.zcard(sync.keys.active) == 0 and r.hlen(sync.keys.leases) == 0
    assert sync.metrics().counters["expired"] == 5
    events = sync.read_events(count=1000)
    assert sorted(e.job_id for e in events if e.name == "expired") == sorted(expiring)
    assert not [e for e in events if e.name == "active" and e.job_id in expiring]


def test_a_retried_job_does_not_expire(r, qname):
    q = emqfast.Queue(qname, r)
    ref = q.enqueue("flaky", expires_ms=100, attempts=2, backoff=Backoff.fixed(300))
    runs: List[int] = []

    def handler(job: Any) -> None:
        runs.append(job.attempts)
        if job.attempts == 1:
            raise RuntimeError("first run fails")
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert runs == [1, 2]  # its retry came after its expiry and still ran
    assert q.get(ref.id).state == "completed"


def test_the_cli_lists_expired_jobs_and_a_waiter_is_told(r, redis_url, qname):
    q = emqfast.Queue(qname, r)
    ref = q.enqueue({"x": 1}, expires_ms=20)
    wait_server_past(r, int(r.hget(q.keys.job(ref.id), "exp")))
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    assert q.counts()["expired"] == 1
    with pytest.raises(emqfast.JobExpired):
        ref.wait(timeout_s=10)
    out = subprocess.run([sys.executable, "-m", "emqfast", "--url", redis_url, "jobs", qname,
                          "--state", "expired", "--json"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert ref.id in out.stdout and "expired" in out.stdout
    assert json.dumps(ref.id) in out.stdout


def test_retention_trims_expired_records(r, qname):
    q = emqfast.Queue(qname, r)
    refs = q.enqueue_many(["a", "b", "c"], expires_ms=10)
    wait_server_past(r, int(r.hget(q.keys.job(refs[0].id), "exp")))
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    assert q.counts()["expired"] == 3
    assert q.trim(keep_expired=1) == 2
    assert q.counts()["expired"] == 1 and len([i for i in (ref.id for ref in refs)
                                              if r.exists(q.keys.job(i))]) == 1


def test_bad_expiry_is_typed_and_writes_nothing(backend, r, qname):
    q = emqfast.Queue(qname, r)
    q.enqueue("there")
    before = dump_queue(r, qname)
    for value, error in [(-1, RangeError), (0, RangeError), (1.5, InvalidInput),
                         ("10", InvalidInput)]:
        with pytest.raises(error):
            q.enqueue("p", expires_ms=value)
        with pytest.raises(error):
            q.enqueue_many(["p", "q"], expires_ms=value)
        with pytest.raises(error):
            q.enqueue_in("p", 10, expires_ms=value)
    assert dump_queue(r, qname) == before
