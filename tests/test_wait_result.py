"""Waiting for a result: ``ref.wait(timeout_s)``, ``q.wait_many``, ``wait_all``
on both facades and both backends. A worker in another process ends the jobs while the
waiters wait (registered first: the test sees their counts in the waiters hash), so every
answer comes from the job's own end on its done channel; the scripts and the finish hook
are real, on a real redis-server."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

import pytest
import redis
import redis.asyncio

import emqfast
import emqfast.aio
from conftest import dump_queue
from emqfast import JobFailed, JobNotFound, WaitTimeout
from waiting import wait_until

pytestmark = pytest.mark.timeout(120)
PROCS = str(Path(__file__).with_name("wait_procs.py"))


def _env() -> dict:
    return {**os.environ, "EMQFAST_BACKEND": emqfast.backend()}


def work(url: str, qname: str) -> None:
    """A Worker in another process drains the queue (tests/wait_procs.py)."""
    proc = subprocess.run([sys.executable, PROCS, "work", url, qname], env=_env(),
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr


class Waits:
    """Waits on ``ids`` from a thread in the facade under test, each by its own
    ``ref.wait`` (``many=False``) or all by one ``wait_many``; :meth:`results` joins."""

    def __init__(self, facade: str, conn: Callable[[], Any], qname: str,
                 ids: Sequence[str], timeout_s: Optional[float], many: bool = False):
        self.out: List[Any] = []
        self.error: Optional[BaseException] = None

        async def aio() -> List[Any]:
            q = emqfast.aio.Queue(qname, conn())
            if many:
                return await q.wait_many(ids, timeout_s, return_exceptions=True)
            return await asyncio.gather(*[q.ref(i).wait(timeout_s) for i in ids],
                                        return_exceptions=True)

        def sync() -> List[Any]:
            q = emqfast.Queue(qname, conn())
            if many:
                return q.wait_many(ids, timeout_s, return_exceptions=True)
            out: List[Any] = [None] * len(ids)

            def one(i: int) -> None:
                try:
                    out[i] = q.ref(ids[i]).wait(timeout_s)
                except Exception as exc:  # noqa: BLE001 - the outcome under test
                    out[i] = exc
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(ids))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            return out

        def run() -> None:
            try:
                self.out = asyncio.run(aio()) if facade == "aio" else sync()
            except BaseException as exc:  # noqa: BLE001 - reported by results()
                self.error = exc
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def results(self) -> List[Any]:
        self.thread.join(90)
        assert not self.thread.is_alive(), "the waits never returned"
        if self.error is not None:
            raise self.error
        return self.out


@pytest.fixture(params=["sync", "aio"])
def facade(request, backend):
    return request.param


def _conn(facade: str, url: str, **kw: Any) -> Callable[[], Any]:
    """A connection factory for the facade (made inside the waiting thread's loop)."""
    if facade == "aio":
        return lambda: redis.asyncio.Redis.from_url(url, **kw) if kw else url
    return lambda: redis.Redis.from_url(url, **kw) if kw else url


def registered(r: redis.Redis, q: emqfast.Queue, ids: Sequence[str], each: int = 1) -> bool:
    """Whether every id has ``each`` waiters registered (its count in the waiters hash)."""
    counts = r.hmget(q.keys.waiters, list(dict.fromkeys(ids)))
    return all(c is not None and int(c) >= each for c in counts)


# --- the outcomes, across processes -------------------------------------------------------

def test_each_outcome_wakes_its_waiter_across_processes(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    fast = emqfast.Backoff.fixed(10)
    ok = q.enqueue({"ok": {"grade": "A", "n": [1, 2]}})
    raw = q.enqueue({"bytes": "certificate.pdf"})
    bad = q.enqueue({"fail": "rubric missing"}, attempts=1)
    late = q.enqueue({"fail": "still broken"}, attempts=2, backoff=fast)
    ids = [ok.id, raw.id, bad.id, late.id]
    waits = Waits(facade, _conn(facade, redis_url), qname, ids, 60)
    wait_until(lambda: registered(r, q, ids), what="the four waiters registered")
    work(redis_url, qname)
    value, data, failed, retried = waits.results()
    assert value == {"grade": "A", "n": [1, 2]}
    assert data == b"certificate.pdf"
    assert isinstance(failed, JobFailed) and failed.job_id == bad.id
    assert "rubric missing" in failed.error and "RuntimeError" in failed.traceback
    # a failed attempt that retries is no end: the waiter saw the last one only
    assert isinstance(retried, JobFailed) and "still broken" in retried.error
    assert q.get(late.id).attempts == 2
    assert r.exists(q.keys.waiters) == 0  # the hook took every count


def test_many_refs_share_one_pubsub_connection(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    refs = q.enqueue_many([{"ok": i} for i in range(1000)])
    ids = [ref.id for ref in refs]
    before = {c["id"] for c in r.client_list(_type="pubsub")}  # (other tests' readers)
    waits = Waits(facade, _conn(facade, redis_url), qname, ids, 60, many=True)
    wait_until(lambda: r.hlen(q.keys.waiters) == 1000, what="1000 waiters registered")
    subs = [int(c["sub"]) for c in r.client_list(_type="pubsub") if c["id"] not in before]
    assert len(subs) == 1 and subs[0] >= 1000, subs  # one new connection holds them all
    channels = [q.keys.done_channel(i) for i in ids[::97]]
    assert {n for _, n in r.pubsub_numsub(*channels)} == {1}
    work(redis_url, qname)
    assert waits.results() == list(range(1000))
    assert r.exists(q.keys.waiters) == 0


def test_the_same_job_waited_many_times_at_once(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"ok": 7})
    waits = Waits(facade, _conn(facade, redis_url), qname, [ref.id] * 3, 60)
    many = Waits(facade, _conn(facade, redis_url), qname, [ref.id, ref.id], 60, many=True)
    wait_until(lambda: registered(r, q, [ref.id], each=5), what="five waiters registered")
    work(redis_url, qname)
    assert waits.results() == [7, 7, 7]
    assert many.results() == [7, 7]
    assert r.exists(q.keys.waiters) == 0


def test_a_waiter_in_another_process(redis_url, qname, r, backend):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"ok": ["lesson", 3]})
    waiter = subprocess.Popen([sys.executable, PROCS, "wait", redis_url, qname, ref.id, "60"],
                              env=_env(), stdout=subprocess.PIPE, text=True)
    wait_until(lambda: registered(r, q, [ref.id]), what="the other process registered")
    emqfast.Worker(q, lambda job: job.payload["ok"]).run_until_idle(timeout_s=30)
    out, _ = waiter.communicate(timeout=60)
    assert out.split(" ", 1)[0] == "ok" and json.loads(out.split(" ", 1)[1]) == ["lesson", 3]


def test_decode_responses_client(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url, decode_responses=True))
    ok, bad = q.enqueue({"ok": "é"}), q.enqueue({"fail": "no"}, attempts=1)
    waits = Waits(facade, _conn(facade, redis_url, decode_responses=True), qname,
                  [ok.id, bad.id], 60)
    wait_until(lambda: registered(r, q, [ok.id, bad.id]), what="waiters registered")
    work(redis_url, qname)
    value, failed = waits.results()
    assert value == "é" and isinstance(failed, JobFailed) and failed.error == "RuntimeError: no"


# --- already ended, timeouts, cancel ---------------------------------------------------------

def test_a_job_that_ended_before_the_wait_is_answered_at_once(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    ok, bad = q.enqueue({"ok": 1}), q.enqueue({"fail": "x"}, attempts=1)
    work(redis_url, qname)
    value, failed = Waits(facade, _conn(facade, redis_url), qname, [ok.id, bad.id],
                          5).results()
    assert value == 1 and isinstance(failed, JobFailed)
    assert r.exists(q.keys.waiters) == 0  # nothing was registered
    assert ok.wait(0) == 1  # the ref enqueue returned waits too, even with no time at all


def test_timeout_is_typed_and_takes_the_registration_back(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"ok": 1})
    [err] = Waits(facade, _conn(facade, redis_url), qname, [ref.id], 0.3).results()
    assert isinstance(err, WaitTimeout) and isinstance(err, TimeoutError)
    assert err.job_ids == [ref.id]
    assert r.exists(q.keys.waiters) == 0
    assert q.get(ref.id).state == "pending"  # waiting changed nothing of the job
    with pytest.raises(WaitTimeout):
        emqfast.wait_all([ref, q.enqueue(2)], timeout_s=0.1)
    assert r.exists(q.keys.waiters) == 0


def test_a_cancelled_job_wakes_its_waiter(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue_in({"ok": 1}, 3_600_000)
    waits = Waits(facade, _conn(facade, redis_url), qname, [ref.id], 60)
    wait_until(lambda: registered(r, q, [ref.id]), what="the waiter registered")
    assert q.cancel(ref.id)
    [err] = waits.results()
    assert isinstance(err, emqfast.Cancelled) and err.job_id == ref.id
    assert r.exists(q.keys.waiters) == 0


def test_an_expired_job_is_typed(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"ok": 1})
    r.hset(q.keys.job(ref.id), "state", "expired")  # as the expiry records it
    [err] = Waits(facade, _conn(facade, redis_url), qname, [ref.id], 5).results()
    assert isinstance(err, emqfast.JobExpired) and err.job_id == ref.id


# --- bad input, unknown jobs ------------------------------------------------------------------

def test_an_unknown_job_is_typed_and_writes_nothing(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    known = q.enqueue({"ok": 1})
    before = dump_queue(r, qname)
    missing = "JOB" + "0" * 23
    [err] = Waits(facade, _conn(facade, redis_url), qname, [missing], 5).results()
    assert isinstance(err, JobNotFound) and missing in str(err)
    with pytest.raises(JobNotFound):  # one unknown refuses the whole wait
        q.wait_many([known.id, missing], 5)
    assert dump_queue(r, qname) == before


@pytest.mark.parametrize("bad", [-1, float("nan"), "1", True])
def test_a_bad_timeout_is_typed_before_anything_is_sent(bad):
    q = emqfast.Queue("t-dead", "redis://127.0.0.1:1/0")  # nothing listens there
    with pytest.raises(emqfast.InvalidInput):
        q.ref("JOB" + "1" * 23).wait(bad)


def test_refs_that_cannot_wait_are_typed():
    with pytest.raises(emqfast.InvalidInput):
        emqfast.JobRef("JOB" + "1" * 23, "pending").wait(1)  # made by hand: no queue
    with pytest.raises(emqfast.InputTypeError):
        emqfast.wait_all(["JOB" + "1" * 23])
    aq = emqfast.aio.Queue("t-dead", "redis://127.0.0.1:1/0")
    with pytest.raises(emqfast.InputTypeError, match="emqfast.aio.wait_all"):
        emqfast.wait_all([aq.ref("JOB" + "1" * 23)])
    with pytest.raises(emqfast.KindError):
        aq.ref("not-a-job-id")


def test_aio_refs_from_enqueue_wait(redis_url, qname, r, backend):
    async def main() -> None:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        ref = await q.enqueue({"ok": 5})
        refs = await q.enqueue_many([{"ok": 1}, {"ok": 2}])
        task = asyncio.ensure_future(emqfast.aio.wait_all([ref, *refs], timeout_s=60))
        while not registered(r, q, [ref.id, *[x.id for x in refs]]):
            await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, work, redis_url, qname)
        assert await task == [5, 1, 2]
        assert await ref.wait(0) == 5
        await q.aclose()
    asyncio.run(main())


def test_refs_still_pickle_without_their_queue(redis_url, qname):
    import pickle
    q = emqfast.Queue(qname, redis_url)
    ref = q.enqueue({"ok": 1})
    copy = pickle.loads(pickle.dumps(ref))  # e.g. handed to another process
    assert copy == ref and repr(copy) == repr(ref)
    with pytest.raises(emqfast.InvalidInput, match="q.ref"):
        copy.wait(0)
    assert emqfast.wait_all([]) == []


def test_an_unreachable_server_is_typed_not_a_hang(facade):
    async def aio() -> None:
        q = emqfast.aio.Queue("t-dead", "redis://127.0.0.1:1/0")  # nothing listens there
        await q.ref("JOB" + "1" * 23).wait()
    with pytest.raises(emqfast.ConnectionFailed):  # no timeout given: it must not hang
        if facade == "aio":
            asyncio.run(aio())
        else:
            emqfast.Queue("t-dead", "redis://127.0.0.1:1/0").ref("JOB" + "1" * 23).wait()


# --- the other endings: expiry, dependencies, dedupe -------------------------------------

def test_real_endings_expired_dependency_failed_and_deduplicated(facade, redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    flash = q.enqueue({"ok": "sale"}, expires_ms=50)
    dep = q.enqueue({"fail": "grader crashed"}, attempts=1)
    cert = q.enqueue({"ok": "certificate"}, depends_on=[dep])  # on_dep_failure="fail"
    first = q.enqueue({"ok": "welcome"}, dedupe_key="welcome:7")
    again = q.enqueue({"ok": "welcome"}, dedupe_key="welcome:7")
    assert again.status == "deduplicated" and again.id == first.id
    ids = [flash.id, cert.id, again.id]
    waits = Waits(facade, _conn(facade, redis_url), qname, ids, 60)
    wait_until(lambda: registered(r, q, ids), what="the waiters registered")
    created = q.get(flash.id).created_ms
    wait_until(lambda: q.server_time_ms() > created + 60, what="the flash sale's expiry")
    emqfast.Worker(q, lambda job: job.payload["ok"] if "ok" in job.payload
                   else 1 / 0).run_until_idle(timeout_s=30)
    expired, failed, welcome = waits.results()
    assert isinstance(expired, emqfast.JobExpired) and expired.job_id == flash.id
    assert isinstance(failed, JobFailed) and "dependency failed" in failed.error
    assert welcome == "welcome"
    assert r.exists(q.keys.waiters) == 0


def test_a_cancelled_aio_wait_takes_its_registration_back(redis_url, qname, r):
    async def main() -> None:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        ref = await q.enqueue({"ok": 1})
        task = asyncio.ensure_future(ref.wait())  # no timeout: cancelled from outside
        while not registered(r, q, [ref.id]):
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert r.exists(q.keys.waiters) == 0
        with pytest.raises(asyncio.TimeoutError):  # asyncio's own timeout, the same way
            await asyncio.wait_for(ref.wait(), 0.2)
        assert r.exists(q.keys.waiters) == 0
        await q.aclose()
    asyncio.run(main())


def test_finished_waits_leave_nothing_behind(redis_url, qname, r):
    """A long-lived process: after many waits, its reader holds no channel and no count,
    its connection is subscribed to its own wake channel only, Redis holds no waiter."""
    from emqfast.facade.wait_reader import registry_for
    q = emqfast.Queue(qname, redis_url)
    before = {c["id"] for c in r.client_list(_type="pubsub")}
    worker = emqfast.Worker(q, lambda job: job.payload)
    t = threading.Thread(target=worker.run)
    t.start()
    try:
        for i in range(20):
            assert q.enqueue(i).wait(10) == i
        with pytest.raises(WaitTimeout):
            q.enqueue_in(0, 60_000).wait(0.05)
    finally:
        worker.stop()
        t.join(30)
    reg = registry_for(q.redis)
    assert reg._book.idle()
    wait_until(lambda: [c["sub"] for c in r.client_list(_type="pubsub")
                        if c["id"] not in before] == ["1"], what="only the wake channel left")
    assert r.exists(q.keys.waiters) == 0


def test_an_outcome_this_client_does_not_know_is_not_mistaken_for_another():
    from emqfast.facade.job_wait import settle
    job_id = "JOB" + "2" * 23
    assert settle("q", job_id, [b"completed", b'{"a": 1}', None, None]) == {"a": 1}
    assert isinstance(settle("q", job_id, [b"expired", None, None, None]), emqfast.JobExpired)
    gone = settle("q", job_id, [b"deleted", None, None, None])  # e.g. a later version's
    assert isinstance(gone, JobNotFound) and "'deleted'" in str(gone)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_waits_with_its_own_reader(redis_url, qname, r):
    q = emqfast.Queue(qname, redis_url)
    first = q.enqueue({"ok": 1})
    waits = Waits("sync", lambda: redis_url, qname, [first.id], 60)  # a parent reader runs
    wait_until(lambda: registered(r, q, [first.id]), what="the parent's waiter")
    second = q.enqueue({"ok": 2})
    pid = os.fork()
    if pid == 0:  # the child: waits on its own pub/sub connection, reports by exit code
        code = 1
        try:
            code = 0 if q.ref(second.id).wait(60) == 2 else 2
        finally:
            os._exit(code)
    wait_until(lambda: registered(r, q, [second.id]), what="the child's waiter")
    work(redis_url, qname)
    assert waits.results() == [1]
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
