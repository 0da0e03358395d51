"""Cancelling running jobs. ``q.cancel(id)`` on an active job marks it and tells
the Worker running it (pub/sub, any process); the handler stops (a coroutine's task is
cancelled, a sync handler sees ``job.cancelled``), and the job ends in a kept
``cancelled`` state, never retried, whatever the handler does next. No timed asserts:
the delay from cancel to handler is printed (bench/cancel_latency.py measures its p99)."""
from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from waiting import wait_until, wait_until_async

PROCS = str(Path(__file__).with_name("cancel_procs.py"))



def _started(q, job_id) -> bool:
    """Its run began (start.lua stamped it): a cancel is then ``"requested"``. "active"
    alone also covers a job claimed and held for a handler slot, which a cancel ends at
    once."""
    return q.get(job_id).started_ms is not None

def _start(mode: str, redis_url: str, qname: str, prefix: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PROCS, mode, redis_url, qname, prefix],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ended_cancelled(q, r, job_id: str) -> None:
    """The kept record of a job cancelled while it ran (never retried)."""
    job = q.get(job_id)
    assert job.state == "cancelled" and job.finished_ms is not None
    assert job_id in q.job_ids("cancelled")
    for state in ("pending", "scheduled", "active", "failed", "completed"):
        assert job_id not in q.job_ids(state)
    assert not r.hexists(q.keys.leases, job_id)
    assert job.result is None  # a handler's late return is never recorded
    assert int(r.hget(q.keys.metrics, "cancelled") or 0) >= 1


@pytest.mark.parametrize("mode", ["thread", "aio"])
@pytest.mark.parametrize("do", ["poll", "swallow"])
def test_cancel_reaches_a_running_handler_in_another_process(redis_url, qname, r, mode, do):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    prefix = f"test:{qname}"
    proc = _start(mode, redis_url, qname, prefix)
    try:
        wait_until(lambda: r.get(prefix + ":ready"), 60, "the worker's cancel listener")
        ref = q.enqueue({"do": do}, attempts=3)
        wait_until(lambda: r.hget(prefix + ":started", ref.id), 30, "the handler started")
        asked = time.time()
        assert q.cancel(ref.id) == emqfast.CancelResult.REQUESTED == "requested"
        seen = float(wait_until(lambda: r.hget(prefix + ":seen", ref.id), 30, "handler saw it"))
        print(f"{mode}/{do}: cancel -> handler saw it in {(seen - asked) * 1000:.1f} ms")
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "job cancelled")
        # the worker goes on; the cancelled job never runs again (3 attempts allowed)
        after = q.enqueue({"do": "quick"})
        wait_until(lambda: q.get(after.id).state == "completed", 30, "next job completed")
        _ended_cancelled(q, r, ref.id)
        assert r.hget(prefix + ":runs", ref.id) == b"1" and q.get(ref.id).attempts == 1
        assert q.cancel(ref.id) is False  # cancelled already
        events = [e.get(b"event") for _, e in r.xrange(q.keys.events)]
        assert b"cancel_requested" in events and b"cancelled" in events
    finally:
        _stop(proc)
    assert proc.returncode == 0, proc.stderr.read().decode()[-2000:] if proc.stderr else ""


def _run_until_cancelled(job) -> None:
    """A sync handler that works until it is told to stop, then stops as asked."""
    while not job.cancelled:
        time.sleep(0.001)
    job.raise_if_cancelled()


def _serve(w) -> threading.Thread:
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    wait_until(lambda: w._listener is not None and w._listener.subscribed.is_set(), 30,
               "listener subscribed")
    return t


@pytest.mark.parametrize("ending", ["raises", "returns", "other_error"])
def test_a_sync_handler_ends_cancelled_however_it_ends(redis_url, qname, r, ending):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))

    def handler(job):
        while not job.cancelled:
            time.sleep(0.001)
        assert job.cancel_reason == "cancelled"
        if ending == "raises":
            job.raise_if_cancelled()
        if ending == "other_error":
            raise RuntimeError("cleanup went wrong")
        return "my result"

    w = emqfast.Worker(q, handler, concurrency=2)
    t = _serve(w)
    try:
        ref = q.enqueue("x", attempts=5, backoff=emqfast.Backoff.fixed(1))
        wait_until(lambda: _started(q, ref.id), 30, "job running")
        assert q.cancel(ref.id) == "requested"
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "job cancelled")
    finally:
        w.stop()
        t.join(30)
    _ended_cancelled(q, r, ref.id)
    assert q.get(ref.id).attempts == 1 and w.stats.failed == w.stats.retried == 0


def test_a_sync_handler_that_ignores_the_cancel_is_abandoned_and_keeps_its_slot(
        redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    gate = threading.Event()
    began = []

    def handler(job):
        began.append(job.payload)
        if job.payload == "stubborn":
            gate.wait(30)  # never looks at job.cancelled
            return "late result"
        return job.payload

    w = emqfast.Worker(q, handler, concurrency=1, prefetch=0, cancel_grace_ms=100)
    t = _serve(w)
    try:
        stubborn = q.enqueue("stubborn")
        wait_until(lambda: began == ["stubborn"], 30, "stubborn handler running")
        assert q.cancel(stubborn.id) == "requested"
        # ended after the grace although the handler still runs: the lease is not left
        wait_until(lambda: q.get(stubborn.id).state == "cancelled", 30, "abandoned")
        _ended_cancelled(q, r, stubborn.id)
        nxt = q.enqueue("next")
        # the abandoned thread still holds the only slot: the next job waits for it
        wait_until(lambda: r.zcard(q.keys.pending) == 0 or began != ["stubborn"], 30,
                   "next job claimed or started")
        assert began == ["stubborn"]
        gate.set()  # its late return is ignored; the slot frees
        wait_until(lambda: q.get(nxt.id).state == "completed", 30, "next job ran")
    finally:
        gate.set()
        w.stop()
        t.join(30)
    assert q.get(stubborn.id).state == "cancelled" and q.get(stubborn.id).result is None


def test_a_lost_cancel_message_is_caught_on_the_beat(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    handler = _run_until_cancelled

    w = emqfast.Worker(q, handler, lease_ms=1000)  # a beat every 250 ms
    t = _serve(w)
    try:
        ref = q.enqueue("x")
        wait_until(lambda: _started(q, ref.id), 30, "job running")
        r.hset(q.keys.job(ref.id), "cancel", 1)  # marked, as cancel.lua does, unpublished
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "found on the beat")
    finally:
        w.stop()
        t.join(30)
    _ended_cancelled(q, r, ref.id)


def test_cancel_of_a_waiting_job_is_unchanged(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    ref = q.enqueue("x")
    assert q.cancel(ref.id) is True
    before = dump_queue(r, qname)
    assert q.cancel(ref.id) is False
    assert dump_queue(r, qname) == before


def test_a_grouped_job_cancelled_while_running_frees_its_group_slot(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    q.groups.set_concurrency("g", 1)
    ran = []

    def handler(job):
        ran.append(job.payload)
        while job.payload == "first" and not job.cancelled:
            time.sleep(0.001)
        job.raise_if_cancelled()
        return job.payload

    w = emqfast.Worker(q, handler, concurrency=2)
    t = _serve(w)
    try:
        first = q.enqueue("first", group="g")
        second = q.enqueue("second", group="g")
        # its handler, not only "active" (which also covers a job held for a slot)
        wait_until(lambda: "first" in ran, 30, "first running")
        assert q.cancel(first.id) == "requested"
        wait_until(lambda: q.get(second.id).state == "completed", 30, "second ran")
    finally:
        w.stop()
        t.join(30)
    assert q.get(first.id).state == "cancelled" and ran == ["first", "second"]


@pytest.mark.parametrize("swallow", [False, True])
def test_an_async_handler_task_is_cancelled(redis_url, qname, r, swallow):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        began = asyncio.Event()

        async def handler(job):
            began.set()
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                assert job.cancelled and job.cancel_reason == "cancelled"
                if swallow:
                    return "my result"
                raise

        w = emqfast.aio.Worker(q, handler, concurrency=2)
        task = asyncio.ensure_future(w.run())
        await wait_until_async(lambda: w.cancel_listening is not None
                               and w.cancel_listening.is_set(), 30, "listener subscribed")
        ref = await q.enqueue("x", attempts=3)
        await asyncio.wait_for(began.wait(), 30)
        assert await q.cancel(ref.id) == "requested"

        async def ended():
            return (await q.get(ref.id)).state == "cancelled"
        await wait_until_async(ended, 30, "job cancelled")
        w.stop()
        await task
        return ref.id, w.stats
    job_id, stats = asyncio.run(main())
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    _ended_cancelled(q, r, job_id)
    assert q.get(job_id).attempts == 1 and stats.failed == stats.retried == 0


def test_an_async_handler_that_swallows_and_keeps_running_is_abandoned(redis_url, qname, r):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        began, gate = asyncio.Event(), asyncio.Event()

        async def handler(job):
            began.set()
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                await gate.wait()  # keeps running, cancel or not
                return "late"

        w = emqfast.aio.Worker(q, handler, concurrency=1, cancel_grace_ms=100)
        task = asyncio.ensure_future(w.run())
        ref = await q.enqueue("x", attempts=3)
        await asyncio.wait_for(began.wait(), 30)
        await wait_until_async(lambda: w.cancel_listening is not None
                               and w.cancel_listening.is_set(), 30, "listener subscribed")
        assert await q.cancel(ref.id) == "requested"

        async def ended():
            return (await q.get(ref.id)).state == "cancelled"
        await wait_until_async(ended, 30, "abandoned as cancelled")
        gate.set()  # its late return is ignored
        w.stop()
        await task
        return ref.id
    job_id = asyncio.run(main())
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    _ended_cancelled(q, r, job_id)


def test_a_waiter_learns_the_cancel_of_a_running_job(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    handler = _run_until_cancelled

    w = emqfast.Worker(q, handler)
    t = _serve(w)
    got = []
    try:
        ref = q.enqueue("x")
        wait_until(lambda: _started(q, ref.id), 30, "job running")

        def wait() -> None:
            try:
                ref.wait(timeout_s=30)
            except Exception as exc:  # noqa: BLE001 - what the waiter got
                got.append(exc)
        waiter = threading.Thread(target=wait)
        waiter.start()
        wait_until(lambda: r.hget(q.keys.waiters, ref.id), 30, "waiter registered")
        assert q.cancel(ref.id) == "requested"
        waiter.join(30)
    finally:
        w.stop()
        t.join(30)
    assert len(got) == 1 and isinstance(got[0], emqfast.Cancelled), got


@pytest.mark.parametrize("driver", ["thread", "aio"])
def test_cancel_and_timeout_under_each_backend(backend, redis_url, qname, r, driver):
    """cancel_active.lua and the timeout's fail.lua go through the acker's pipeline: the C
    batcher or its Python twin."""
    handler = _run_until_cancelled

    if driver == "thread":
        q = emqfast.Queue(qname, emqfast.connect(redis_url))
        w = emqfast.Worker(q, handler)
        t = _serve(w)
        try:
            ref = q.enqueue("x")
            slow = q.enqueue("slow", timeout_ms=50, attempts=1)
            wait_until(lambda: _started(q, ref.id), 30, "job running")
            assert q.cancel(ref.id) == "requested"
            wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "job cancelled")
            wait_until(lambda: q.get(slow.id).state == "failed", 30, "job timed out")
        finally:
            w.stop()
            t.join(30)
    else:
        async def main():
            aq = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
            w = emqfast.aio.Worker(aq, handler)  # a plain handler, in the executor
            task = asyncio.ensure_future(w.run())
            ref = await aq.enqueue("x")
            slow = await aq.enqueue("slow", timeout_ms=50, attempts=1)

            async def state(job_id, want):
                return (await aq.get(job_id)).state == want
            await wait_until_async(lambda: state(ref.id, "active"), 30, "job running")
            assert await aq.cancel(ref.id) == "requested"
            await wait_until_async(lambda: state(ref.id, "cancelled"), 30, "job cancelled")
            await wait_until_async(lambda: state(slow.id, "failed"), 30, "job timed out")
            w.stop()
            await task
            return ref, slow
        ref, slow = asyncio.run(main())
        q = emqfast.Queue(qname, emqfast.connect(redis_url))
    _ended_cancelled(q, r, ref.id)
    assert q.get(slow.id).error.startswith("JobTimeout: timeout")


def test_a_cancel_published_while_the_listener_reconnects_is_not_lost(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    handler = _run_until_cancelled

    w = emqfast.Worker(q, handler, lease_ms=60_000)  # beat ~1 s: the re-subscribe finds it
    t = _serve(w)
    try:
        ref = q.enqueue("x")
        wait_until(lambda: _started(q, ref.id), 30, "job running")
        r.client_kill_filter(_type="pubsub")  # the listener's connection drops
        assert q.cancel(ref.id) == "requested"  # published to nobody, maybe
        wait_until(lambda: q.get(ref.id).state == "cancelled", 30, "job cancelled")
        wait_until(lambda: r.pubsub_numsub(q.keys.cancel_channel)[0][1] == 1, 30,
                   "listener subscribed again")
        again = q.enqueue("y")
        wait_until(lambda: _started(q, again.id), 30, "next job running")
        assert q.cancel(again.id) == "requested"
        wait_until(lambda: q.get(again.id).state == "cancelled", 30, "heard after reconnect")
    finally:
        w.stop()
        t.join(30)


def test_the_listener_re_subscribes_at_its_first_step_after_each_recovery(redis_url, qname,
                                                                          r, caplog):
    """Every loss of the cancel listener's connection that follows a successful subscribe
    waits the backoff's first step again: a burst of cuts long ago does not leave cancels
    waiting seconds for the re-subscribe."""
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    w = emqfast.Worker(q, lambda job: None)
    t = _serve(w)
    try:
        with caplog.at_level("WARNING", logger="emqfast.worker"):
            for cut in range(8):
                wait_until(lambda: w._listener.subscribed.is_set()
                           and r.pubsub_numsub(q.keys.cancel_channel)[0][1] == 1, 30,
                           "listener subscribed")
                r.client_kill_filter(_type="pubsub")
                wait_until(lambda: len(_resubscribes(caplog)) > cut, 30, "the loss logged")
        waits = _resubscribes(caplog)
    finally:
        w.stop()
        t.join(30)
    assert waits == ["0.05"] * 8, waits


def _resubscribes(caplog) -> list:
    """The waits the listener announced before each re-subscribe, as logged."""
    return [m.rsplit("re-subscribing in ", 1)[1].rstrip("s") for m in caplog.messages
            if "cancel listener lost its connection" in m]


def _gated_first():
    """(gate, seen, handler): the job "first" holds the Worker's one slot until the gate
    opens; every run records (payload, job.cancelled as its handler began)."""
    gate = threading.Event()
    seen = []

    def handler(job):
        seen.append((job.payload, job.cancelled))
        if job.payload == "first":
            gate.wait(30)
        job.raise_if_cancelled()
        return job.payload
    return gate, seen, handler


@pytest.mark.parametrize("heard", [True, False], ids=["message-heard", "message-not-heard"])
@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "grouped"])
def test_a_job_cancelled_while_held_unstarted_never_reaches_its_handler(redis_url, qname, r,
                                                                       heard, grouped):
    """A held job (claimed, waiting for a free handler slot) cancelled before a slot frees
    is never handed to its handler, whether or not its Worker hears the cancel message
    (``heard`` False: the message in flight or lost). A plain one is cancelled at once
    (``True``): cancel.lua takes its lease, so its Worker cannot start it. A grouped one is
    marked (``"requested"``): its Worker ends it as it starts, without its handler. While
    held it reads ``active`` everywhere, as ``counts()`` counts it."""
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    gate, seen, handler = _gated_first()
    w = emqfast.Worker(q, handler, concurrency=1, prefetch=2)
    if not heard:
        w._cancel_held = lambda job_id: None  # deaf to held cancels: only the mark is left
    t = _serve(w)
    group = {"group": "g"} if grouped else {}
    try:
        first = q.enqueue("first")
        wait_until(lambda: seen, 30, "first running")
        held, after = q.enqueue("held", **group), q.enqueue("after")
        wait_until(lambda: w.stats.claimed == 3, 30, "both claimed and held")
        assert q.get(held.id).state == "active" and q.counts()["active"] == 3
        assert q.cancel(held.id) == ("requested" if grouped else True)
        if not grouped:  # ended here and now, its Worker still busy with "first"
            assert q.get(held.id).state == "cancelled"
        gate.set()
        wait_until(lambda: q.get(after.id).state == "completed", 30, "after completed")
        wait_until(lambda: q.get(held.id).state == "cancelled", 30, "held one cancelled")
        wait_until(w._idle, 30, "the worker let go of every job")
    finally:
        gate.set()
        w.stop()
        t.join(30)
    assert q.get(first.id).state == "completed"
    assert seen[1:] == [("after", False)]  # the cancelled one never reached its handler
    _ended_cancelled(q, r, held.id)
    assert q.counts()["active"] == 0 and r.hlen(q.keys.leases) == 0


def test_a_mixed_ack_batch_ends_each_job_by_its_own_outcome_and_a_resend_is_harmless(
        redis_url, qname, r):
    """A cancelled run and a completed one acked together: cancel_active.lua for the one,
    complete.lua for the other, replies in the batch's order; the same batch re-sent (a
    lost reply) rewrites nothing."""
    from emqfast.backends import select as backend
    from emqfast.worker.outcomes import CancelledRun, success
    from engine_util import claim

    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    a, b = q.enqueue("a"), q.enqueue("b")
    (ja, ta), (jb, tb) = claim(q, "w", lease_ms=60_000, n=2)
    assert {ja, jb} == {a.id, b.id}
    w = emqfast.Worker(q, lambda job: None)
    w._ack_batcher = backend.batcher_for(q.redis)
    batch = [CancelledRun(q.get(ja), ta, emqfast.Cancelled("x"), "", False),
             success(q.get(jb), tb, "result")]
    w._pending_acks = 2
    replies = w._drive(w._write_batch(batch))
    assert replies[0] == 1 and isinstance(replies[1], list)
    assert q.get(ja).state == "cancelled" and q.get(jb).state == "completed"
    assert w._pending_acks == 0
    before = dump_queue(r, qname)
    w._pending_acks = 2
    again = w._drive(w._write_batch(batch))
    assert again[0] == 0 and again[1] == [-1, -1]  # each fenced by its token
    assert dump_queue(r, qname) == before


def test_the_aio_listener_reconnects_and_catches_what_it_missed(redis_url, qname, r):
    async def main():
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))

        async def handler(job):
            await asyncio.sleep(600)

        w = emqfast.aio.Worker(q, handler, lease_ms=60_000)  # beat ~1 s
        task = asyncio.ensure_future(w.run())
        await wait_until_async(lambda: w.cancel_listening is not None
                               and w.cancel_listening.is_set(), 30, "listener subscribed")

        async def state(job_id, want):
            return (await q.get(job_id)).state == want
        ref = await q.enqueue("x")
        await wait_until_async(lambda: state(ref.id, "active"), 30, "job running")
        r.client_kill_filter(_type="pubsub")  # the listener's connection drops
        assert await q.cancel(ref.id) == "requested"
        await wait_until_async(lambda: state(ref.id, "cancelled"), 30, "job cancelled")
        await wait_until_async(lambda: r.pubsub_numsub(q.keys.cancel_channel)[0][1] == 1, 30,
                               "listener subscribed again")
        again = await q.enqueue("y")
        await wait_until_async(lambda: state(again.id, "active"), 30, "next job running")
        assert await q.cancel(again.id) == "requested"
        await wait_until_async(lambda: state(again.id, "cancelled"), 30, "heard again")
        w.stop()
        await task
    asyncio.run(main())
