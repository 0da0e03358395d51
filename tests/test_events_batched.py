"""Batched events: promote.lua, start.lua and complete.lua write one stream entry
per 16 jobs, and every reader still sees one event per job, with its own fields, in order."""
from __future__ import annotations

import emqfast
from engine_util import make_queue, server_ms, wait_server_past


def _by_name(q):
    seen = {}
    for event in q.events(since="0-0", count=7):  # small reads: entries split across reads
        seen.setdefault(event.name, []).append(event)
    return seen


def test_a_drained_batch_reads_as_one_event_per_job(redis_url, qname):
    q = make_queue(redis_url, qname)
    run_at = server_ms(q.redis) + 300
    ids = [r.id for r in q.enqueue_many(list(range(40)), run_at_ms=run_at)]
    wait_server_past(q.redis, run_at)
    assert q.promote() == 40
    emqfast.Worker(q, lambda job: job.payload).run_until_idle(timeout_s=30)
    seen = _by_name(q)
    for name in ("enqueued", "promoted", "active", "completed"):
        assert sorted(e.job_id for e in seen[name]) == sorted(ids), name
    assert [e.job_id for e in seen["promoted"]] == ids  # release order is mint order
    assert {e.attempt for e in seen["active"] + seen["completed"]} == {1}
    # far fewer stream entries than events: the batching is real
    assert q.redis.xlen(q.keys.events) < 40 + 3 * 40 // 4
    # one entry's events share its stream id; positions still resume a read exactly
    first = q.read_events("0-0", count=1000)
    middle = first[len(first) // 2].id
    rest = q.read_events(middle, count=1000)
    assert [e for e in first if e.id > middle] == rest or [
        (e.id, e.job_id) for e in first if tuple(map(int, e.id.split("-"))) >
        tuple(map(int, middle.split("-")))] == [(e.id, e.job_id) for e in rest]


def test_events_off_writes_no_batched_entries(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.configure_events(0)
    q.enqueue_many(list(range(20)))
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    assert q.redis.exists(q.keys.events) == 0


def test_a_batch_of_mixed_attempts_gives_each_job_its_own(redis_url, qname):
    """One entry's jobs on different attempts (a retry started beside first runs): each
    event carries its job's attempt, as when all share one."""
    from engine_util import claim
    q = make_queue(redis_url, qname)
    ids = [r.id for r in q.enqueue_many(["a", "b", "c"])]
    q.redis.hset(q.keys.job(ids[1]), "attempts", "2")  # as a job that ran twice before
    assert sorted(i for i, _ in claim(q, "w", lease_ms=60_000, n=3)) == sorted(ids)
    active = {e.job_id: e.attempt for e in _by_name(q)["active"]}
    assert active == {ids[0]: 1, ids[1]: 3, ids[2]: 1}
