"""Queue-wide rate limits: at most N jobs claimed in any sliding window of W ms on the
server clock (claim.lua), and a limited worker sleeps on the marker until the window opens."""
from __future__ import annotations

import asyncio

import pytest

import emqfast
import emqfast.aio as emq
from emqfast.worker import calls as worker_core
from emqfast.core.errors import InvalidInput, RangeError
from conftest import dump_queue
from engine_util import claim, make_queue


def _started(q: emqfast.Queue) -> list:
    ids = q.job_ids("completed")
    return sorted(q.get(i).started_ms for i in ids)


def _most_in_any_window(times: list, width_ms: float) -> int:
    """Largest number of instants inside any half-open interval of ``width_ms``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= width_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def test_rate_limit_caps_every_window_and_achieves_the_rate(redis_url, qname, monkeypatch,
                                                            backend):
    n, window = 5, 200
    q = make_queue(redis_url, qname)
    q.set_rate_limit(n, window)
    assert q.rate_limit() == (n, window)
    jobs = 40
    q.enqueue_many(list(range(jobs)))
    claims = []
    real = worker_core.claim_call
    monkeypatch.setattr(worker_core, "claim_call",
                        lambda *a, **kw: claims.append(1) or real(*a, **kw))
    stats = emqfast.Worker(q, lambda job: None, concurrency=8).run_until_idle(timeout_s=60)
    assert stats.completed == jobs
    started = _started(q)
    # started_ms is stamped one round trip after the claim the limit counts: a few ms of slack
    assert _most_in_any_window(started, window - 20) <= n
    span_s = (started[-1] - started[0]) / 1000
    achieved = (jobs - n) / span_s  # the first n start at once, the rest one window apart
    assert 0.8 * n / (window / 1000) <= achieved <= 1.1 * n / (window / 1000), achieved
    # sleeping until the window opens, not polling: a few claims per window at most
    assert len(claims) <= 4 * (jobs // n + 1), len(claims)


def test_a_partial_window_claims_only_what_is_left(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.set_rate_limit(3, 60_000)
    q.enqueue_many(list(range(10)))
    assert len(claim(q, "w1", lease_ms=10_000, n=2)) == 2
    assert len(claim(q, "w2", lease_ms=10_000, n=5)) == 1  # one left in this window
    reply = worker_core.claim_call(q.keys, 5, 10_000, "w3")
    now, status, next_due, pairs = worker_core.parse_claim(reply.script(q.redis, reply.keys,
                                                                        reply.args))
    assert (status, pairs) == (2, [])
    assert now < next_due <= now + 60_000  # when the window next admits a job
    # the marker says when to wake, so blocked workers need not poll
    assert q.redis.zscore(q.keys.marker, "1") == next_due
    q.clear_rate_limit()
    assert q.rate_limit() is None
    assert len(claim(q, "w4", lease_ms=10_000, n=10)) == 7


def test_an_empty_limited_queue_is_idle_not_limited(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.set_rate_limit(1, 60_000)
    q.enqueue("only")
    assert len(claim(q, "w", lease_ms=10_000)) == 1
    reply = worker_core.claim_call(q.keys, 5, 10_000, "w")
    _, status, _, _ = worker_core.parse_claim(reply.script(q.redis, reply.keys, reply.args))
    assert status == 1  # nothing waits: run_until_idle may end


def test_bad_rate_limits_write_nothing(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    before = dump_queue(r, qname)
    for bad in ((0, 100), (5, 0), (-1, 100), (5, "100"), (True, 100)):
        with pytest.raises((RangeError, InvalidInput)):
            q.set_rate_limit(*bad)
    assert dump_queue(r, qname) == before


def test_aio_worker_respects_the_rate_limit(redis_url, qname):
    n, window = 4, 150

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.set_rate_limit(n, window)
        await q.enqueue_many(list(range(16)))
        stats = await emq.Worker(q, lambda job: None, concurrency=8).run_until_idle(timeout_s=60)
        ids = await q.job_ids("completed")
        times = sorted([(await q.get(i)).started_ms for i in ids])
        await q.aclose()
        return stats, times

    stats, times = asyncio.run(asyncio.wait_for(main(), 90))
    assert stats.completed == 16
    assert _most_in_any_window(times, window - 20) <= n
    assert times[-1] - times[0] >= 3 * window - 20  # 16 jobs need four windows
