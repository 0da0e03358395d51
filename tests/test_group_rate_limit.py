"""Per-group rate limits: at most N jobs of one group claimed in any sliding window of W ms
on the server clock (claim.lua skips the group's lane while its window is full), other
groups are served meanwhile, and a worker held back only by group windows sleeps on the
marker until the earliest one opens."""
from __future__ import annotations

import asyncio

import pytest

import emqfast
import emqfast.aio as emq
from emqfast.worker import calls as worker_core
from emqfast.core.errors import InvalidInput, RangeError
from conftest import dump_queue
from engine_util import make_queue


def _most_in_any_window(times: list, width_ms: float) -> int:
    """Largest number of instants inside any half-open interval of ``width_ms``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= width_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def _finished_jobs(q: emqfast.Queue) -> dict:
    """``{group: [job, ...]}`` of the completed jobs."""
    by: dict = {}
    for job_id in q.job_ids("completed"):
        job = q.get(job_id)
        by.setdefault(job.extra.get("g"), []).append(job)
    return by


def _claim_once(q: emqfast.Queue, groups: list, n: int = 5):
    """One raw claim.lua call serving ``groups``: (now, status, next_due, pairs)."""
    call = worker_core.claim_call(q.keys, n, 10_000, "w", groups)
    return worker_core.parse_claim(call.script(q.redis, call.keys, call.args))


def test_group_limit_caps_its_windows_and_leaves_other_groups_alone(redis_url, qname,
                                                                     backend):
    n, window, a_jobs, b_jobs = 4, 200, 24, 40
    q = make_queue(redis_url, qname)
    q.groups.set_rate_limit("A", n, window)
    assert q.groups.rate_limit("A") == (n, window)
    assert q.groups.rate_limit("B") is None
    q.enqueue_many(list(range(a_jobs)), group="A")
    q.enqueue_many(list(range(b_jobs)), group="B")
    stats = emqfast.Worker(q, lambda job: None, concurrency=8).run_until_idle(timeout_s=60)
    assert stats.completed == a_jobs + b_jobs
    by = _finished_jobs(q)
    a_started = sorted(j.started_ms for j in by["A"])
    assert len(a_started) == a_jobs and len(by["B"]) == b_jobs
    # started_ms is stamped one round trip after the claim the limit counts: a few ms of slack
    assert _most_in_any_window(a_started, window - 20) <= n
    span_s = (a_started[-1] - a_started[0]) / 1000
    achieved = (a_jobs - n) / span_s  # the first n start at once, the rest one window apart
    assert 0.8 * n / (window / 1000) <= achieved <= 1.1 * n / (window / 1000), achieved
    # B is not held to A's pace: all of it is done before A's last few windows even open
    b_done = max(j.finished_ms for j in by["B"])
    assert b_done < a_started[-1] - 3 * window, (b_done, a_started[-1])


def test_a_full_group_window_is_skipped_and_its_opening_marked(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.groups.set_rate_limit("A", 2, 60_000)
    q.enqueue_many(list(range(5)), group="A")
    _, status, _, pairs = _claim_once(q, ["A"])
    assert (status, len(pairs)) == (1, 2)  # the window admits two
    now, status, next_due, pairs = _claim_once(q, ["A"])
    assert (status, pairs) == (2, [])  # held back by A's window only
    assert now < next_due <= now + 60_000
    # the marker says when to wake, so blocked workers need not poll
    assert q.redis.zscore(q.keys.marker, "1") == next_due
    # another group is served while A's window is full
    q.enqueue("b", group="B")
    _, status, _, pairs = _claim_once(q, ["A", "B"])
    assert status == 1 and [q.get(i).extra["g"] for i, _ in pairs] == ["B"]
    assert q.groups.counts("A")["pending"] == 3
    q.groups.clear_rate_limit("A")
    assert q.groups.rate_limit("A") is None
    _, status, _, pairs = _claim_once(q, ["A"])
    assert (status, len(pairs)) == (1, 3)


def test_a_group_limited_worker_sleeps_until_the_window_opens(redis_url, qname, monkeypatch,
                                                              backend):
    n, window, jobs = 3, 150, 18
    q = make_queue(redis_url, qname)
    q.groups.set_rate_limit("A", n, window)
    q.enqueue_many(list(range(jobs)), group="A")
    claims = []
    real = worker_core.claim_call
    monkeypatch.setattr(worker_core, "claim_call",
                        lambda *a, **kw: claims.append(1) or real(*a, **kw))
    stats = emqfast.Worker(q, lambda job: None, concurrency=6).run_until_idle(timeout_s=60)
    assert stats.completed == jobs  # held back, not idle: run_until_idle waited for A
    started = sorted(j.started_ms for j in _finished_jobs(q)["A"])
    assert started[-1] - started[0] >= (jobs // n - 1) * window - 20
    # sleeping until the window opens, not polling: a few claims per window at most
    assert len(claims) <= 4 * (jobs // n + 1), len(claims)


@pytest.mark.parametrize("bad", [("", 1, 100), ("a{b}", 1, 100), ("a\0b", 1, 100),
                                 (5, 1, 100), ("A", 0, 100), ("A", 5, 0), ("A", -1, 100),
                                 ("A", 5, "100"), ("A", True, 100), ("A", 1.5, 100)])
def test_bad_group_rate_limits_write_nothing(redis_url, qname, r, bad):
    q = make_queue(redis_url, qname)
    q.enqueue("x", group="A")
    q.groups.set_rate_limit("A", 2, 1000)
    before = dump_queue(r, qname)
    with pytest.raises((RangeError, InvalidInput)):
        q.groups.set_rate_limit(*bad)
    with pytest.raises(InvalidInput):
        q.groups.clear_rate_limit(bad[0] if bad[0] != "A" else "")
    assert dump_queue(r, qname) == before
    assert q.groups.rate_limit("A") == (2, 1000)


def test_aio_worker_honours_a_group_rate_limit(redis_url, qname):
    n, window, jobs = 4, 150, 16

    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        await q.groups.set_rate_limit("A", n, window)
        await q.enqueue_many(list(range(jobs)), group="A")
        await q.enqueue_many(list(range(jobs)), group="B")
        stats = await emq.Worker(q, lambda job: None, concurrency=8).run_until_idle(timeout_s=60)
        by: dict = {}
        for i in await q.job_ids("completed"):
            job = await q.get(i)
            by.setdefault(job.extra.get("g"), []).append(job)
        await q.aclose()
        return stats, by

    stats, by = asyncio.run(asyncio.wait_for(main(), 90))
    assert stats.completed == 2 * jobs
    times = sorted(j.started_ms for j in by["A"])
    assert _most_in_any_window(times, window - 20) <= n
    assert times[-1] - times[0] >= 3 * window - 20  # 16 jobs of A need four windows
    assert max(j.finished_ms for j in by["B"]) < times[-1] - window  # B is not paced


# --- counts(): grouped jobs waiting in lanes are pending too -------------------------------

def test_counts_include_jobs_waiting_in_group_lanes(redis_url, qname, backend):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(3)))
    q.enqueue_many(list(range(4)), group="A")
    q.enqueue_many(list(range(5)), group="B")
    assert q.counts() == {"scheduled": 0, "pending": 12, "grouped": 9, "active": 0,
                          "completed": 0, "failed": 0, "cancelled": 0, "waiting_deps": 0, "expired": 0}
    _, _, _, pairs = _claim_once(q, ["A", "B"], n=4)
    assert len(pairs) == 4
    c = q.counts()
    assert (c["pending"], c["active"]) == (8, 4)
    assert c["grouped"] == q.groups.counts("A")["pending"] + q.groups.counts("B")["pending"]


def test_counts_of_a_queue_without_groups_stay_one_round_trip(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.enqueue_many(list(range(3)))
    batches = []
    real = q._drive

    def spy(op):
        # count the round trips the counts() generator asks for
        def counting():
            reply = None
            try:
                while True:
                    step = op.send(reply)
                    batches.append(step)
                    reply = yield step
            except StopIteration as done:
                return done.value
        return real(counting())

    q._drive = spy
    assert q.counts()["pending"] == 3 and q.counts()["grouped"] == 0
    assert len(batches) == 2  # one per call
    q.enqueue("g", group="A")
    batches.clear()
    assert q.counts()["grouped"] == 1 and len(batches) == 2  # ring, then its lanes


def test_stats_table_shows_grouped_jobs(redis_url, qname):
    from rich.console import Console

    from emqfast.tools.cli import queue_row
    from emqfast.tools.render import counts_table
    q = make_queue(redis_url, qname)
    q.enqueue("flat")
    q.enqueue_many(list(range(2)), group="A")
    console = Console(record=True, width=200)
    console.print(counts_table([queue_row(q)], 0))
    row = next(line for line in console.export_text().splitlines() if qname in line)
    cells = [p.strip() for p in row.split("│")][1:-1]
    assert cells[1:7] == ["0", "3", "2", "0", "0", "0"]  # scheduled pending grouped ...
