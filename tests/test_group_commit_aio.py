"""Group commit under :mod:`emqfast.aio`: many tasks ``await q.enqueue`` at once and the
jobs waiting behind a call in flight leave together; each task gets its own ref or
error. The first call is held in flight by ``CLIENT PAUSE ... WRITE`` on the server."""
from __future__ import annotations

import asyncio
from typing import Any, List

import pytest
import redis

import emqfast
import emqfast.aio as emq
from emqfast import errors
from emqfast.backends import gather
from emqfast.core import ids
from waiting import wait_until_async


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def blocked(r: redis.Redis) -> int:
    """Clients the server holds (a write pause holds each script call it received)."""
    return int(r.info("clients")["blocked_clients"])


def gate_of(q: emq.Queue) -> Any:
    return gather._registry.get(q.redis, {}).get(q._gather_key)


async def held_round(r: redis.Redis, q: emq.Queue, first: Any, rest: List[Any],
                     queued_want: int) -> List[Any]:
    """``first`` held in flight by a write pause, ``rest`` started behind it; outcomes."""
    r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
    try:
        lead = asyncio.ensure_future(first)
        await wait_until_async(lambda: gate_of(q) is not None and gate_of(q).busy,
                               what="the first call in flight")
        others = [asyncio.ensure_future(c) for c in rest]
        await wait_until_async(lambda: len(gate_of(q).queue) == queued_want,
                               what=f"{queued_want} enqueues queued")
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    return list(await asyncio.wait_for(
        asyncio.gather(lead, *others, return_exceptions=True), 30))


def test_tasks_share_one_call(r, redis_url, qname):
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        await q.enqueue_many(["warm"])  # scripts loaded: a NOSCRIPT reply counts as a call
        before = evalsha_calls(r)
        got = await held_round(r, q, q.enqueue({"n": 0}),
                               [q.enqueue({"n": i}) for i in range(1, 100)], 99)
        assert all(isinstance(ref, emqfast.JobRef) for ref in got), got
        assert [ref.status for ref in got] == ["pending"] * 100
        assert len({ref.id for ref in got}) == 100
        assert evalsha_calls(r) - before == 2
        assert r.zcard(q.keys.pending) == 102
        payloads = sorted([(await q.get(ref.id)).payload["n"] for ref in got])
        assert payloads == list(range(100))
        await q.aclose()
    asyncio.run(main())


def test_hundred_tasks_free_running(r, redis_url, qname):
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))

        async def producer(t: int) -> List[Any]:
            return [await q.enqueue({"t": t, "i": i}) for i in range(20)]
        got = await asyncio.wait_for(asyncio.gather(*(producer(t) for t in range(100))), 60)
        refs = [ref for batch in got for ref in batch]
        assert len({ref.id for ref in refs}) == 2000
        assert {ref.status for ref in refs} == {"pending"}
        assert sorted(r.zrange(q.keys.pending, 0, -1)) == sorted(ref.id.encode() for ref in refs)
        await q.aclose()
    asyncio.run(main())


def test_flushes_larger_than_a_write_buffer_land_whole_once(r, redis_url, qname):
    """A flush's frames go straight into the connection's buffer while it has room and
    through redis-py's timed send when it has not (here: 30 KB jobs, frames of ~64 KB
    queued back to back): every job lands once, each payload intact."""
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")

        async def producer(t: int) -> List[Any]:
            return [await q.enqueue(f"{t}.{i}." + "x" * 30_000) for i in range(3)]
        got = await asyncio.wait_for(asyncio.gather(*(producer(t) for t in range(40))), 60)
        refs = [ref for batch in got for ref in batch]
        assert len({ref.id for ref in refs}) == 120 and {ref.status for ref in refs} == {"pending"}
        assert r.zcard(q.keys.pending) == 1 + 120
        for t in (0, 17, 39):
            for i, ref in enumerate(got[t]):
                assert (await q.get(ref.id)).payload == f"{t}.{i}." + "x" * 30_000
        await q.aclose()
    asyncio.run(main())


def test_bad_jobs_fail_alone_same_id_is_one_job(r, redis_url, qname):
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url), max_payload_bytes=100)
        await q.enqueue("warm")
        job_id = ids.new_id()
        rest = [q.enqueue(f"v{i}", job_id=job_id) for i in range(5)]
        rest += [q.enqueue({"i": i}) for i in range(5)]
        bad = [q.enqueue("x" * 500), q.enqueue("y", priority=-1)]
        got = await held_round(r, q, q.enqueue("first"), rest + bad, len(rest))
        assert isinstance(got[-2], errors.PayloadError)
        assert isinstance(got[-1], errors.RangeError)
        same = got[1:6]
        assert [ref.id for ref in same] == [job_id] * 5
        assert sorted(ref.status for ref in same) == ["duplicate"] * 4 + ["pending"]
        assert {ref.status for ref in got[6:11]} == {"pending"}
        assert r.zcard(q.keys.pending) == 1 + 1 + 1 + 5
        await q.aclose()
    asyncio.run(main())


def test_a_task_cancelled_while_queued_sends_nothing(r, redis_url, qname):
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            lead = asyncio.ensure_future(q.enqueue("first"))
            await wait_until_async(lambda: gate_of(q) is not None and gate_of(q).busy,
                                   what="the first call in flight")
            keep = [asyncio.ensure_future(q.enqueue(f"keep{i}")) for i in range(3)]
            drop = asyncio.ensure_future(q.enqueue("dropped"))
            await wait_until_async(lambda: len(gate_of(q).queue) == 4, what="four queued")
            drop.cancel()
            with pytest.raises(asyncio.CancelledError):
                await drop
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        refs = await asyncio.wait_for(asyncio.gather(lead, *keep), 30)
        assert [ref.status for ref in refs] == ["pending"] * 4
        names = sorted([(await q.get(m.decode())).payload
                        for m in r.zrange(q.keys.pending, 0, -1)])
        assert names == ["first", "keep0", "keep1", "keep2", "warm"]
        assert not gate_of(q).busy and not gate_of(q).queue
        await q.aclose()
    asyncio.run(main())


def test_decode_responses_client_and_grouped_jobs(r, redis_url, qname):
    async def main() -> None:
        import redis.asyncio as aredis
        client = aredis.Redis.from_url(redis_url, decode_responses=True)
        q = emq.Queue(qname, client)
        await q.enqueue("warm")
        rest = [q.enqueue({"i": i}) for i in range(6)] + [q.enqueue("lane", group="g")]
        got = await held_round(r, q, q.enqueue("first"), rest, len(rest))
        assert [ref.status for ref in got] == ["pending"] * 8
        assert r.zscore(q.keys.group_pending("g"), got[-1].id) is not None
        await client.aclose()
    asyncio.run(main())


def test_tasks_ready_together_share_one_call_with_nothing_in_flight(r, redis_url, qname):
    """Tasks woken in one turn of the loop (as a flush's replies wake its callers) go out
    together: the first lets the others join before it sends."""
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        await q.enqueue_many(["warm"])  # scripts loaded: a NOSCRIPT reply counts as a call
        before = evalsha_calls(r)
        got = await asyncio.wait_for(asyncio.gather(*(q.enqueue({"n": i})
                                                      for i in range(50))), 30)
        assert evalsha_calls(r) - before == 1
        assert [ref.status for ref in got] == ["pending"] * 50
        assert sorted([(await q.get(ref.id)).payload["n"] for ref in got]) == list(range(50))
        await q.aclose()
    asyncio.run(main())


def test_the_first_task_cancelled_before_sending_strands_nobody(r, redis_url, qname):
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        tasks = [asyncio.ensure_future(q.enqueue(f"job{i}")) for i in range(5)]
        await asyncio.sleep(0)  # each ran once: the first waits a turn, four joined it
        assert len(gate_of(q).queue) == 4
        tasks[0].cancel()
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]
        refs = await asyncio.wait_for(asyncio.gather(*tasks[1:]), 30)
        assert [ref.status for ref in refs] == ["pending"] * 4
        names = sorted([(await q.get(m.decode())).payload
                        for m in r.zrange(q.keys.pending, 0, -1)])
        assert names == ["job1", "job2", "job3", "job4", "warm"]
        assert not gate_of(q).busy and not gate_of(q).queue
        await q.aclose()
    asyncio.run(main())


def test_a_lost_reply_of_a_shared_call_is_read_back_not_sent_again(r, redis_url, qname):
    """The shared call ran on the server and its reply was lost: each caller's job is read
    back as ``recovered``; nothing is sent twice, and the callers queued behind it get
    their own refs."""
    from fault_proxy import FaultProxy, upstream_port_of

    async def main(proxy: FaultProxy) -> None:
        q = emq.Queue(qname, emq.connect(proxy.url(), socket_timeout=1))
        await q.enqueue("warm")
        await q.enqueue_many(["warm"])  # scripts loaded: a NOSCRIPT reply counts as a call
        before, held = evalsha_calls(r), blocked(r)
        r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            first = [asyncio.ensure_future(q.enqueue(f"a{i}")) for i in range(3)]
            await wait_until_async(lambda: blocked(r) == held + 1, what="the call held")
            assert proxy.live() == 1
            proxy.half_open()  # the request is in: its reply will never come
            behind = [asyncio.ensure_future(q.enqueue(f"b{i}")) for i in range(4)]
            await wait_until_async(lambda: len(gate_of(q).queue) == 4, what="four queued")
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        refs = await asyncio.wait_for(asyncio.gather(*first, *behind), 30)
        assert [ref.status for ref in refs] == ["recovered"] * 3 + ["pending"] * 4, refs
        assert evalsha_calls(r) - before == 2
        assert [(await q.get(ref.id)).payload for ref in refs] == \
            [f"a{i}" for i in range(3)] + [f"b{i}" for i in range(4)]
        assert r.zcard(q.keys.pending) == 2 + 7
        await q.aclose()

    with FaultProxy(upstream_port_of(redis_url), seed=5) as proxy:
        asyncio.run(main(proxy))


def test_a_lost_request_of_a_shared_call_is_sent_again_once(r, redis_url, qname):
    """The shared call never reached the server (its connection went silent): the read
    finds no job, so each is sent once more with its id and lands once."""
    from fault_proxy import FaultProxy, upstream_port_of

    async def main(proxy: FaultProxy) -> None:
        q = emq.Queue(qname, emq.connect(proxy.url(), socket_timeout=1))
        await q.enqueue("warm")
        await q.enqueue_many(["warm"])
        assert proxy.live() == 1
        before = evalsha_calls(r)
        proxy.half_open()  # the pooled connection: what it sends now is swallowed
        refs = await asyncio.wait_for(asyncio.gather(*(q.enqueue(f"a{i}")
                                                       for i in range(5))), 30)
        assert [ref.status for ref in refs] == ["pending"] * 5, refs
        assert evalsha_calls(r) - before == 5  # one re-send per job; the first never came
        assert [(await q.get(ref.id)).payload for ref in refs] == [f"a{i}" for i in range(5)]
        assert r.zcard(q.keys.pending) == 2 + 5
        await q.aclose()

    with FaultProxy(upstream_port_of(redis_url), seed=5) as proxy:
        asyncio.run(main(proxy))


def test_a_task_cancelled_while_its_job_is_in_a_flush_lands_once(r, redis_url, qname):
    """Cancelling a caller whose job is already in a flush on the wire: its job is written
    once (the flush is not its task's, so it is never cut half-way), the caller gets
    CancelledError at once, and the other callers of that flush get their refs."""
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        await q.enqueue_many(["warm"])  # scripts loaded: a NOSCRIPT reply counts as a call
        held = blocked(r)
        r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            # ready together: the first lets the others join, one flush of five is sent
            tasks = [asyncio.ensure_future(q.enqueue(f"job{i}")) for i in range(5)]
            await wait_until_async(lambda: blocked(r) == held + 1, what="the flush held")
            assert not gate_of(q).queue  # all five are in the flush, none waits
            tasks[2].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[2]
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        kept = await asyncio.wait_for(asyncio.gather(*tasks[:2], *tasks[3:]), 30)
        assert [ref.status for ref in kept] == ["pending"] * 4
        names = sorted([(await q.get(m.decode())).payload
                        for m in r.zrange(q.keys.pending, 0, -1)])
        assert names == ["job0", "job1", "job2", "job3", "job4", "warm", "warm"]
        await wait_until_async(lambda: not gate_of(q).busy, what="the gate idle")
        await q.aclose()
    asyncio.run(main())


def test_plain_and_optioned_enqueues_share_a_flush_each_with_its_own_ref(r, redis_url, qname):
    """Jobs without options (minted by their flush) and jobs with options or their own id
    (the general operation) queued together: one ref each, the given id kept, every job
    written once with its own options."""
    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        job_id = ids.new_id()
        rest = [q.enqueue("plain0"), q.enqueue("own-id", job_id=job_id),
                q.enqueue("urgent", priority=5), q.enqueue("plain1")]
        got = await held_round(r, q, q.enqueue("first"), rest, len(rest))
        assert [ref.status for ref in got] == ["pending"] * 5
        assert got[2].id == job_id and len({ref.id for ref in got}) == 5
        assert [(await q.get(ref.id)).payload for ref in got] == \
            ["first", "plain0", "own-id", "urgent", "plain1"]
        assert (await q.get(got[3].id)).priority == 5
        assert r.zcard(q.keys.pending) == 1 + 5
        await q.aclose()
    asyncio.run(main())


def test_a_forked_child_enqueues_while_the_parents_flush_is_in_flight(r, redis_url, qname):
    """A fork while the parent's flush is held on the wire and jobs wait behind it: the
    child's enqueue (on a loop of its own) goes out at once, never behind the parent's
    gate, and the parent's jobs all land."""
    import os
    import threading

    async def main() -> None:
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue("warm")
        r.execute_command("CLIENT", "PAUSE", 20_000, "WRITE")
        try:
            lead = asyncio.ensure_future(q.enqueue("parent-first"))
            await wait_until_async(lambda: gate_of(q) is not None and gate_of(q).busy,
                                   what="the first call in flight")
            others = [asyncio.ensure_future(q.enqueue(f"parent-{i}")) for i in range(3)]
            await wait_until_async(lambda: len(gate_of(q).queue) == 3, what="three queued")
            pid = os.fork()
            if pid == 0:  # pragma: no cover - child
                code = [1]

                def child() -> None:
                    async def one() -> None:
                        r.execute_command("CLIENT", "UNPAUSE")
                        ref = await asyncio.wait_for(q.enqueue("child"), 20)
                        code[0] = 0 if ref.status == "pending" else 2
                    asyncio.run(one())
                try:
                    t = threading.Thread(target=child)
                    t.start()
                    t.join(30)
                finally:
                    os._exit(code[0])
            for _ in range(3000):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("the forked child's enqueue never returned")
            assert os.waitstatus_to_exitcode(status) == 0
        finally:
            r.execute_command("CLIENT", "UNPAUSE")
        parent = await asyncio.wait_for(asyncio.gather(lead, *others), 30)
        assert [ref.status for ref in parent] == ["pending"] * 4
        names = sorted([(await q.get(m.decode())).payload
                        for m in r.zrange(q.keys.pending, 0, -1)])
        assert names == sorted(["warm", "child", "parent-first"]
                               + [f"parent-{i}" for i in range(3)])
        await q.aclose()
    asyncio.run(main())
