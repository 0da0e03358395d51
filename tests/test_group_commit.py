"""Group commit of concurrent single enqueues (threads on the sync facade): jobs that
arrive while their queue's call is in flight share the next call, and each caller still
gets its own ref or its own typed error.

To make sharing certain rather than likely, a test holds the first call in flight with
``CLIENT PAUSE ... WRITE`` on the server (EVALSHA waits unanswered), waits until the
others are queued behind it, then lets the server go: the waiting jobs leave as one call.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List

import pytest
import redis

import emqfast
from emqfast import errors
from emqfast.backends import gather
from emqfast.backends.drive import run
from emqfast.core import ids
from emqfast.facade.admission import Job
from emqfast.facade.group_commit import UNMINTED, Entry, flush_op
from waiting import wait_until


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def queued(q: emqfast.Queue, client: Any = None) -> int:
    """How many enqueues wait behind ``q``'s call in flight on its client."""
    gate = gather._registry.get(client if client is not None else q.redis, {}).get(
        q._gather_key)
    return len(gate.queue) if gate is not None else 0


@contextmanager
def writes_paused(r: redis.Redis) -> Iterator[None]:
    r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    try:
        yield
    finally:
        r.execute_command("CLIENT", "UNPAUSE")


class Threads(List[threading.Thread]):
    """Started threads, and what each call returned or raised."""

    results: List[Any]


def in_threads(calls: List[Callable[[], Any]]) -> Threads:
    out: List[Any] = [None] * len(calls)

    def runner(i: int) -> None:
        try:
            out[i] = calls[i]()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            out[i] = exc

    threads = Threads(threading.Thread(target=runner, args=(i,), daemon=True)
                      for i in range(len(calls)))
    threads.results = out
    for t in threads:
        t.start()
    return threads


def joined(threads: Threads, timeout: float = 30) -> List[Any]:
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        assert not t.is_alive(), "an enqueue never returned"
    return threads.results


def shared_round(r: redis.Redis, q: emqfast.Queue, first: Callable[[], Any],
                 rest: List[Callable[[], Any]], queued_want: int) -> List[Any]:
    """Run ``first`` (held in flight by a write pause), then ``rest`` (of which
    ``queued_want`` queue behind it), then let the server go; every outcome, in order."""
    with writes_paused(r):
        lead = in_threads([first])
        wait_until(lambda: gather._registry.get(q.redis, {}).get(q._gather_key) is not None
                   and gather._registry[q.redis][q._gather_key].busy, what="the first call")
        others = in_threads(rest)
        wait_until(lambda: queued(q) == queued_want, what=f"{queued_want} enqueues queued")
    return joined(lead) + joined(others)


def test_concurrent_enqueues_share_one_call_each_job_written_once(backend, r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")  # connected, scripts loaded (a NOSCRIPT reply counts as a call)
    q.enqueue_many(["warm"])
    before = evalsha_calls(r)
    got = shared_round(r, q, lambda: q.enqueue({"n": 0}),
                       [lambda i=i: q.enqueue({"n": i}) for i in range(1, 16)], 15)
    assert all(isinstance(ref, emqfast.JobRef) for ref in got), got
    assert [ref.status for ref in got] == ["pending"] * 16
    assert len({ref.id for ref in got}) == 16
    assert evalsha_calls(r) - before == 2  # the first alone, the fifteen together
    pending = {m.decode() for m in r.zrange(q.keys.pending, 0, -1)}
    assert len(pending) == 18 and {ref.id for ref in got} <= pending
    for ref in got:  # each job's own payload, and the ref bound to its queue
        job = q.get(ref.id)
        assert job is not None and job.state == "pending"
    assert sorted(q.get(ref.id).payload["n"] for ref in got) == list(range(16))


def test_many_threads_free_running(backend, redis_url, r, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    threads, per = 16, 40
    calls = [lambda t=t: [q.enqueue({"t": t, "i": i}) for i in range(per)]
             for t in range(threads)]
    got = joined(in_threads(calls), timeout=60)
    refs = [ref for batch in got for ref in batch]
    assert len(refs) == threads * per and len({ref.id for ref in refs}) == threads * per
    assert {ref.status for ref in refs} == {"pending"}
    assert r.zcard(q.keys.pending) == threads * per
    assert sorted(r.zrange(q.keys.pending, 0, -1)) == sorted(ref.id.encode() for ref in refs)


def test_mixed_options_in_one_flush(backend, r, redis_url, qname):
    """Delayed, prioritized, grouped and expiring jobs waiting together: each lands as if
    enqueued alone."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    rest = [lambda: q.enqueue("a"), lambda: q.enqueue("b"),
            lambda: q.enqueue("late", delay_ms=3_600_000),
            lambda: q.enqueue("urgent", priority=0), lambda: q.enqueue("low", priority=9),
            lambda: q.enqueue("lane", group="g1"), lambda: q.enqueue("exp", expires_ms=60_000),
            lambda: q.enqueue(b"raw")]
    got = shared_round(r, q, lambda: q.enqueue("first"), rest, len(rest))  # all queued
    statuses = [ref.status for ref in got]
    assert statuses == ["pending", "pending", "pending", "scheduled", "pending", "pending",
                        "pending", "pending", "pending"], got
    by_payload = {q.get(ref.id).payload: q.get(ref.id) for ref in got}
    assert by_payload["late"].state == "scheduled"
    assert by_payload["low"].priority == 9
    assert r.zscore(q.keys.group_pending("g1"), got[6].id) is not None
    assert r.hget(q.keys.job(got[7].id), "exp") is not None
    assert by_payload[b"raw"].payload == b"raw"
    assert r.zcard(q.keys.pending) == 1 + 7  # warm + the pending ones outside the lane


def test_a_bad_job_fails_alone_and_writes_nothing(backend, r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url), max_payload_bytes=100)
    q.enqueue("warm")
    rest = [lambda i=i: q.enqueue({"n": i}) for i in range(6)]
    bad = [lambda: q.enqueue("x" * 500), lambda: q.enqueue("p", priority=-1),
           lambda: q.enqueue("k", job_id="NOTJOB")]
    with writes_paused(r):
        lead = in_threads([lambda: q.enqueue("first")])
        wait_until(lambda: gather._registry.get(q.redis, {}).get(q._gather_key) is not None
                   and gather._registry[q.redis][q._gather_key].busy, what="the first call")
        others = in_threads(rest + bad)
        wait_until(lambda: queued(q) == len(rest), what="the good jobs queued")
        # refused before joining the others: they return while the shared call waits
        wait_until(lambda: not any(t.is_alive() for t in others[len(rest):]),
                   what="the bad jobs refused")
    got = joined(lead) + joined(others)
    assert [type(x) for x in got[-3:]] == [errors.PayloadError, errors.RangeError,
                                           errors.KindError]
    refs = got[:-3]
    assert all(isinstance(ref, emqfast.JobRef) and ref.status == "pending" for ref in refs)
    assert r.zcard(q.keys.pending) == 1 + len(refs)
    assert not r.exists(q.keys.job("NOTJOB"))


def test_a_job_the_script_refuses_fails_alone_in_a_shared_call(backend, r, redis_url, qname):
    """A job the shared enqueue_many.lua call refuses (the whole call, before any write) is
    sent again alone with the rest one by one: only it fails, typed."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    shared = q._shared(0, None, None, None, None, None)
    good = ids.new_ids(4)
    entries = [Entry(Job(j, b'"ok"', "j"), shared) for j in good[:2]]
    entries.append(Entry(Job("BAD1", b'"bad"', "j"), shared))  # no JOB brand: EMQKIND
    entries += [Entry(Job(j, b'"ok"', "j"), shared) for j in good[2:]]
    out = run(q.redis, flush_op(q.keys, None, entries), batcher=q._live_batcher)
    assert isinstance(out[2], errors.KindError)
    assert [o.status for i, o in enumerate(out) if i != 2] == ["pending"] * 4
    assert r.zcard(q.keys.pending) == 5 and not r.exists(q.keys.job("BAD1"))


def test_ids_a_flush_mints_are_the_ones_its_jobs_are_written_and_re_sent_under(
        backend, r, redis_url, qname):
    """Jobs without an id (an asyncio plain enqueue's) get theirs from their flush; when
    the shared call is refused and its jobs are sent again one by one, each goes under the
    id it was given, so every ref names its own job."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    shared = q._shared(0, None, None, None, None, None)
    entries = [Entry(Job(UNMINTED, f'"ok{i}"'.encode(), "j"), shared) for i in range(2)]
    entries.append(Entry(Job("BAD1", b'"bad"', "j"), shared))  # no JOB brand: EMQKIND
    entries += [Entry(Job(UNMINTED, f'"ok{i}"'.encode(), "j"), shared) for i in range(2, 4)]
    out = run(q.redis, flush_op(q.keys, None, entries), batcher=q._live_batcher)
    assert isinstance(out[2], errors.KindError)
    refs = [o for i, o in enumerate(out) if i != 2]
    assert [ref.status for ref in refs] == ["pending"] * 4
    assert len({ref.id for ref in refs}) == 4 and all(ref.id.startswith("JOB") for ref in refs)
    assert [q.get(ref.id).payload for ref in refs] == [f"ok{i}" for i in range(4)]
    assert r.zcard(q.keys.pending) == 5


def test_same_job_id_from_many_callers_is_one_job(backend, r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    job_id = ids.new_id()
    got = shared_round(r, q, lambda: q.enqueue("v0", job_id=job_id),
                       [lambda i=i: q.enqueue(f"v{i}", job_id=job_id) for i in range(1, 10)], 9)
    assert [ref.id for ref in got] == [job_id] * 10
    assert [ref.status for ref in got] == ["pending"] + ["duplicate"] * 9
    assert r.zcard(q.keys.pending) == 2 and q.get(job_id).payload == "v0"
    # the same in a shared call whose ids are new: the first listed is written, once
    other = ids.new_id()
    got = shared_round(r, q, lambda: q.enqueue("first"),
                       [lambda i=i: q.enqueue(f"w{i}", job_id=other) for i in range(5)], 5)
    assert sorted(ref.status for ref in got[1:]) == ["duplicate"] * 4 + ["pending"]
    assert r.zcard(q.keys.pending) == 4


def test_dedupe_keys_hold_under_concurrency(backend, r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    calls = [lambda i=i: q.enqueue({"i": i}, dedupe_key="user-7") for i in range(12)]
    calls += [lambda i=i: q.enqueue({"plain": i}) for i in range(12)]
    got = joined(in_threads(calls))
    keyed, plain = got[:12], got[12:]
    admitted = [ref for ref in keyed if ref.status == "pending"]
    assert len(admitted) == 1, keyed
    assert all(ref.status == "deduplicated" and ref.id == admitted[0].id
               for ref in keyed if ref is not admitted[0])
    assert {ref.status for ref in plain} == {"pending"}
    assert r.zcard(q.keys.pending) == 1 + 1 + 12
    assert r.hget(q.keys.dedupe, "user-7").decode() == admitted[0].id


def test_decode_responses_client(backend, r, redis_url, qname):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    q = emqfast.Queue(qname, client)
    q.enqueue("warm")
    got = shared_round(r, q, lambda: q.enqueue("first"),
                       [lambda i=i: q.enqueue({"i": i}) for i in range(8)], 8)
    assert [ref.status for ref in got] == ["pending"] * 9
    assert client.zcard(q.keys.pending) == 10
    assert sorted(q.get(ref.id).payload["i"] for ref in got[1:]) == list(range(8))


def test_wait_replicas_per_job(backend, r, redis_url, qname):
    """With wait_replicas (no replica here) every caller of a shared call gets its own
    NotReplicated naming its own written job."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url), wait_replicas=1,
                      wait_timeout_ms=10)
    got = shared_round(r, q, lambda: q.enqueue("first"),
                       [lambda i=i: q.enqueue({"i": i}) for i in range(5)], 5)
    assert all(isinstance(e, errors.NotReplicated) for e in got), got
    ids_named = [e.landed[0].id for e in got]
    assert len(set(ids_named)) == 6 and all(len(e.landed) == 1 for e in got)
    assert r.zcard(q.keys.pending) == 6


def test_group_commit_off_sends_each_job_alone(backend, r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url), group_commit=False)
    q.enqueue("warm")
    before = evalsha_calls(r)
    got = joined(in_threads([lambda i=i: q.enqueue(i) for i in range(8)]))
    assert {ref.status for ref in got} == {"pending"}
    assert evalsha_calls(r) - before == 8
    with pytest.raises(errors.InputTypeError):
        emqfast.Queue(qname, r, group_commit=1)  # type: ignore[arg-type]


def test_a_forked_child_never_joins_the_parents_gathering(backend, r, redis_url, qname):
    """A fork while the parent's enqueues are in flight and queued: the child's enqueue
    goes out on its own (an inherited gate would leave it waiting for a leader that does
    not exist in the child) and the parent's jobs all land."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    with writes_paused(r):
        lead = in_threads([lambda: q.enqueue("parent-first")])
        wait_until(lambda: gather._registry.get(q.redis, {}).get(q._gather_key) is not None
                   and gather._registry[q.redis][q._gather_key].busy, what="the first call")
        others = in_threads([lambda i=i: q.enqueue(f"parent-{i}") for i in range(5)])
        wait_until(lambda: queued(q) == 5, what="the parent's enqueues queued")
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                ref = q.enqueue("child")
                code = 0 if ref.status == "pending" and queued(q) == 0 else 2
            finally:
                os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        assert time.monotonic() < deadline, "the forked child's enqueue never returned"
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    parent = joined(lead) + joined(others)
    assert [ref.status for ref in parent] == ["pending"] * 6
    payloads = sorted(q.get(m.decode()).payload for m in r.zrange(q.keys.pending, 0, -1))
    assert payloads == sorted(["warm", "child", "parent-first"]
                              + [f"parent-{i}" for i in range(5)])


class _Interrupted(Exception):
    """Raised into a waiting thread from outside (as a signal handler's exception would)."""


def test_waiters_interrupted_as_they_wake_still_wake_the_rest(r, redis_url, qname):
    """Each waiter of a flush wakes the next: one that is interrupted as it wakes still
    passes the wake on (every thread returns) and every job sent lands once."""
    import ctypes

    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("warm")
    with writes_paused(r):
        lead = in_threads([lambda: q.enqueue("first")])
        wait_until(lambda: gather._registry.get(q.redis, {}).get(q._gather_key) is not None
                   and gather._registry[q.redis][q._gather_key].busy, what="the first call")
        others = in_threads([lambda i=i: q.enqueue(f"w{i}") for i in range(5)])
        wait_until(lambda: queued(q) == 5, what="five enqueues queued")
        for t in others:  # delivered when each runs again, right after it is woken
            assert ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(t.ident), ctypes.py_object(_Interrupted)) == 1
    got = joined(lead) + joined(others)
    assert got[0].status == "pending"
    assert all(isinstance(x, _Interrupted) for x in got[1:]), got
    payloads = sorted(q.get(m.decode()).payload for m in r.zrange(q.keys.pending, 0, -1))
    assert payloads == ["first", "w0", "w1", "w2", "w3", "w4", "warm"]


def test_lost_reply_of_a_shared_call_is_recovered_by_reading(r, redis_url, qname):
    """The shared call ran but its reply was cut: a read finds every job written."""
    from fault_proxy import FaultProxy, upstream_port_of

    with FaultProxy(upstream_port_of(redis_url), seed=3) as proxy:
        q = emqfast.Queue(qname, redis.Redis(port=proxy.port))
        q.enqueue("warm")
        entries = _entries(q, 6)
        before = evalsha_calls(r)
        proxy.cut_after(0)  # the server runs it; not one byte of its reply comes back
        out = run(q.redis, flush_op(q.keys, None, entries), batcher=q._live_batcher)
        assert [o.status for o in out] == ["recovered"] * 6, out
        assert evalsha_calls(r) - before == 1  # read, not sent again
        assert r.zcard(q.keys.pending) == 7


def test_lost_request_of_a_shared_call_is_sent_again_once(r, redis_url, qname):
    """The shared call never reached the server (cut on its way): the read finds no job,
    so each is sent once more with its id, and lands once."""
    from fault_proxy import FaultProxy, upstream_port_of

    with FaultProxy(upstream_port_of(redis_url), seed=3) as proxy:
        q = emqfast.Queue(qname, redis.Redis(port=proxy.port))
        q.enqueue("warm")
        entries = _entries(q, 6)
        proxy.cut_after(0, direction="c2s")
        out = run(q.redis, flush_op(q.keys, None, entries), batcher=q._live_batcher)
        assert [o.status for o in out] == ["pending"] * 6, out
        assert r.zcard(q.keys.pending) == 7
        assert [o.id for o in out] == [e.job.id for e in entries]


@pytest.mark.parametrize("direction", ["s2c", "c2s"])
def test_expiring_jobs_in_a_shared_call_keep_their_expiry_after_a_cut(r, redis_url, qname,
                                                                       direction):
    """Jobs with an expiry share calls too: a cut reply is read back (each written once,
    its expiry with it); a cut request is sent again once, the expiry still set."""
    from fault_proxy import FaultProxy, upstream_port_of

    from emqfast.facade.dedupe import extras

    with FaultProxy(upstream_port_of(redis_url), seed=3) as proxy:
        q = emqfast.Queue(qname, redis.Redis(port=proxy.port))
        q.enqueue("warm")
        expiring = [e._replace(shared=e.shared._replace(extras=extras(False, None, None,
                                                                      60_000)))
                    for e in _entries(q, 6)]
        proxy.cut_after(0, direction=direction)
        out = run(q.redis, flush_op(q.keys, None, expiring), batcher=q._live_batcher)
        want = "recovered" if direction == "s2c" else "pending"
        assert [o.status for o in out] == [want] * 6, out
        assert [o.id for o in out] == [e.job.id for e in expiring]
        assert r.zcard(q.keys.pending) == 7
        assert all(r.hget(q.keys.job(e.job.id), "exp") is not None for e in expiring)


def test_unreachable_server_after_a_lost_reply_says_unknown(r, redis_url, qname):
    """(C backend: its connection stays up while new ones are refused.)"""
    from conftest import require_native
    from fault_proxy import FaultProxy, upstream_port_of

    require_native()
    if emqfast.backend() != "c":
        pytest.skip("needs the C backend live")

    with FaultProxy(upstream_port_of(redis_url), seed=3) as proxy:
        client = redis.Redis(port=proxy.port, socket_connect_timeout=1)
        q = emqfast.Queue(qname, client)
        q.enqueue("warm")
        entries = _entries(q, 4)
        client.connection_pool.disconnect()
        proxy.pause(drop=True)  # the read after it cannot connect
        proxy.cut_after(0)
        out = run(q.redis, flush_op(q.keys, None, entries), batcher=q._live_batcher)
        assert all(isinstance(o, errors.ReplyLost) for o in out), out
        assert len({id(o) for o in out}) == 4  # each caller its own exception
        proxy.resume()


def _entries(q: emqfast.Queue, n: int) -> List[Entry]:
    shared = q._shared(0, None, None, None, None, None)
    return [Entry(Job(j, b'"p"', "j"), shared) for j in ids.new_ids(n)]


def test_gates_are_per_client_and_key(r, redis_url, qname):
    """Two queues on one client never share a flush (their scripts differ), each queue's
    jobs still land once."""
    client = redis.Redis.from_url(redis_url)
    a, b = emqfast.Queue(qname + "a", client), emqfast.Queue(qname + "b", client)
    calls: List[Callable[[], Any]] = []
    for i in range(10):
        calls += [lambda i=i: a.enqueue(i), lambda i=i: b.enqueue(i)]
    got = joined(in_threads(calls))
    assert {ref.status for ref in got} == {"pending"}
    assert r.zcard(a.keys.pending) == 10 and r.zcard(b.keys.pending) == 10
    gates: Dict[Any, Any] = gather._registry[client]
    assert set(gates) == {a._gather_key, b._gather_key}
