"""A backlog of due jobs released by ``Queue.promote`` on both facades and both backends:
its rounds go out as streamed bulks of promote.lua calls (PROMOTE_BATCH ids each), and
every job still rejoins pending with its own score, is stamped its run-at and gets one
'promoted' event, in mint order, the same on every path."""
from __future__ import annotations

import asyncio
from typing import Any, List

import pytest

import emqfast
import emqfast.aio
from emqfast.core.ops import PROMOTE_BATCH
from engine_util import server_ms, wait_server_past


@pytest.fixture(params=["sync", "aio"])
def facade(request, redis_url, backend):
    """``facade(name)``: a Queue of the facade under test, and ``promote(q, limit)``."""
    def make(name: str) -> Any:
        if request.param == "sync":
            return emqfast.Queue(name, redis_url)
        return emqfast.aio.Queue(name, emqfast.aio.connect(redis_url))

    def promote(q: Any, limit: int) -> int:
        out = q.promote(limit=limit)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out
    make.promote = promote  # type: ignore[attr-defined]
    return make


def _park(q: emqfast.Queue, run_at: int) -> List[str]:
    """Jobs of two bulk enqueues (two id heads) and two single ones, all due at run_at."""
    ids = [r.id for r in q.enqueue_many(list(range(PROMOTE_BATCH + 7)), run_at_ms=run_at)]
    ids.append(q.enqueue_at("one", run_at).id)
    ids += [r.id for r in q.enqueue_many(list(range(PROMOTE_BATCH + 30)), run_at_ms=run_at)]
    ids.append(q.enqueue_at("two", run_at, job_id="JOBchosen-id").id)
    assert q.redis.zcard(q.keys.delayed) == len(ids), "enqueue outran its head start"
    return ids


def test_a_backlog_moves_whole_with_scores_stamps_and_events(redis_url, qname, facade, r):
    sync = emqfast.Queue(qname, redis_url)
    run_at = server_ms(r) + 1_500
    ids = _park(sync, run_at)
    ps = {i: float(r.hget(sync.keys.job(i), "ps")) for i in ids}
    wait_server_past(r, run_at)
    q = facade(qname)
    assert facade.promote(q, 10_000) == len(ids)
    assert facade.promote(q, 10_000) == 0  # nothing twice
    assert r.zcard(sync.keys.delayed) == 0
    pending = r.zrange(sync.keys.pending, 0, -1, withscores=True)
    assert [m.decode() for m, _ in pending] == ids  # one tier: mint order
    assert all(score == ps[m.decode()] for m, score in pending)
    assert {r.hget(sync.keys.job(i), "run_at") for i in ids} == {str(run_at).encode()}
    promoted = [e.job_id for e in sync.read_events("0-0", count=100_000)
                if e.name == "promoted"]
    assert promoted == ids


def test_a_limit_below_the_backlog_moves_that_many_oldest_first(redis_url, qname, facade, r):
    sync = emqfast.Queue(qname, redis_url)
    run_at = server_ms(r) + 1_500
    ids = _park(sync, run_at)
    wait_server_past(r, run_at)
    q = facade(qname)
    first = PROMOTE_BATCH + 3  # more than one call's worth, less than the backlog
    assert facade.promote(q, first) == first
    assert sync.job_ids("pending") == ids[:first]
    assert sync.job_ids("scheduled") == ids[first:]
    assert facade.promote(q, 10_000) == len(ids) - first
    assert sync.job_ids("pending") == ids
