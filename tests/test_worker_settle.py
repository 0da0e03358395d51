"""A claim or start cut short by the cancellation of ``run()``: the jobs it leased go back at once instead of waiting out their
leases. The cut is made deterministic by holding the reply of the call after it ran."""
from __future__ import annotations

import asyncio

import pytest

import emqfast.aio as emq
from emqfast.backends import drive, scripts
from waiting import wait_until_async


@pytest.mark.parametrize("script", ["claim", "start"])
def test_cancelled_run_hands_back_the_jobs_of_a_cut_short_call(redis_url, qname, monkeypatch,
                                                               script):
    original, original_batch = scripts.Script.call_async, drive.send_async
    ran = {"n": 0}

    async def hold(name, reply):
        if name == script and isinstance(reply, list) and len(reply) > 3 and not ran["n"]:
            ran["n"] += 1  # the first only
            await asyncio.sleep(30)  # cancelled here: the call ran, its reply is never read

    async def held_reply(self, client, keys, args):
        reply = await original(self, client, keys, args)
        await hold(self.name, reply)
        return reply

    async def held_batch(client, calls, *rest):  # (the starts go as one pipeline)
        replies = await original_batch(client, calls, *rest)
        for call, reply in zip(calls, replies):
            await hold(call[0].name, reply)
        return replies
    monkeypatch.setattr(scripts.Script, "call_async", held_reply)
    monkeypatch.setattr(drive, "send_async", held_batch)

    async def handler(job):
        raise AssertionError("no handler may run")

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.enqueue_many(list(range(5)))
        w = emq.Worker(q, handler, concurrency=5, lease_ms=60_000)
        task = asyncio.create_task(w.run())
        await wait_until_async(lambda: ran["n"] == 1, what=f"{script} ran")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)
        counts = await q.counts()
        leases = await q.redis.hlen(q.keys.leases)
        await q.aclose()
        return counts, leases, w.stats
    counts, leases, stats = asyncio.run(asyncio.wait_for(main(), 60))
    assert leases == 0 and counts["active"] == 0 and counts["pending"] == 5, counts
    assert stats.released == 5 and stats.completed == stats.failed == 0
