"""promote.lua batches its set commands (one ZRANGEBYSCORE / ZMSCORE / ZREM / ZADD
per chunk of ids) yet keeps the per-job contract: a released job rejoins pending with its
own 'ps' score, a stale / undue / missing / repeated id is skipped, and every released job
gets one 'promoted' event. The script is called directly here, with lists due.lua would
never return, so the fallback paths run too."""
from __future__ import annotations

from typing import List, Sequence

import redis

import emqfast
from emqfast.facade.events import parse_entry
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION
from engine_util import make_queue, server_ms, wait_server_past

PROMOTE = load("promote")


def _promote(q: emqfast.Queue, ids: Sequence[str]) -> int:
    k = q.keys
    return PROMOTE(q.redis, [k.delayed, k.pending, k.marker, k.meta, k.events, *k.jobs(ids)],
                   [KEYSPACE_VERSION, *ids])


def _park(q: emqfast.Queue, n: int, head_start_ms: int) -> tuple:
    """``n`` jobs due ``head_start_ms`` from now (server clock); (ids, run_at)."""
    run_at = server_ms(q.redis) + head_start_ms
    ids = [ref.id for ref in q.enqueue_many(list(range(n)), run_at_ms=run_at)]
    assert q.redis.zcard(q.keys.delayed) == n, "enqueue outran its head start"
    return ids, run_at


def _promoted_events(r: redis.Redis, q: emqfast.Queue) -> List[str]:
    # promote.lua batches its events (one entry per 64 jobs): read them as users do
    return [e.job_id for entry_id, f in r.xrange(q.keys.events)
            for e in parse_entry(entry_id, f) if e.name == "promoted"]


def test_stale_undue_repeated_and_unknown_ids_are_skipped(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    due, run_at = _park(q, 10, 400)
    later = q.enqueue_at("later", run_at + 3_600_000).id
    wait_server_past(r, run_at)
    # due.lua would list due[0..7]; this list is stale: half of it lies outside that head
    listed = [*due[5:], later, due[5], "no-such-job"]
    assert _promote(q, listed) == 5
    assert q.job_ids("pending") == due[5:]
    assert q.job_ids("scheduled") == [*due[:5], later]
    assert [q.get(i).state for i in due] == ["scheduled"] * 5 + ["pending"] * 5
    assert _promoted_events(r, q) == due[5:]  # one each, in list order, none for the skipped
    assert not r.exists(q.keys.job("no-such-job"))
    assert _promote(q, listed) == 0  # already moved: nothing twice


def test_a_subset_of_the_head_moves_only_itself(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    due, run_at = _park(q, 6, 400)
    wait_server_past(r, run_at)
    assert _promote(q, [due[1], due[3]]) == 2
    assert q.job_ids("pending") == [due[1], due[3]]
    assert q.job_ids("scheduled") == [due[0], due[2], due[4], due[5]]


def test_a_due_id_whose_hash_is_gone_leaves_delayed_unreleased(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    due, run_at = _park(q, 3, 400)
    r.delete(q.keys.job(due[1]))
    wait_server_past(r, run_at)
    assert q.promote() == 2
    assert r.zcard(q.keys.delayed) == 0
    assert q.job_ids("pending") == [due[0], due[2]]
    assert _promoted_events(r, q) == [due[0], due[2]]


def test_thousands_of_ids_move_with_their_own_scores(redis_url, qname, r):
    """8,000 jobs (a call takes at most 4,000 ids): the first call lists only
    ids outside the due head (every fallback runs), then Queue.promote the head itself."""
    q = make_queue(redis_url, qname)
    q.configure_events(1 << 20)  # keep every event, to count them
    ids, run_at = _park(q, 8_000, 3_000)
    ps = {i: float(v) for i, v in zip(ids, (r.hget(q.keys.job(i), "ps") for i in ids))}
    wait_server_past(r, run_at)
    assert _promote(q, ids[4_000:]) == 4_000
    assert r.zcard(q.keys.delayed) == 4_000
    assert q.promote(limit=10_000) == 4_000
    assert r.zcard(q.keys.delayed) == 0
    pending = r.zrange(q.keys.pending, 0, -1, withscores=True)
    assert [m.decode() for m, _ in pending] == ids  # one tier: mint order
    assert all(score == ps[m.decode()] for m, score in pending)
    assert _promoted_events(r, q) == [*ids[4_000:], *ids[:4_000]]
    assert {q.get(i).state for i in ids[::97]} == {"pending"}


def test_promoted_events_respect_the_cap_or_are_off(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.configure_events(0)
    _, run_at = _park(q, 50, 400)
    wait_server_past(r, run_at)
    assert q.promote() == 50
    assert not r.exists(q.keys.events)

    q.configure_events(100)
    _, run_at = _park(q, 5_000, 1_500)
    wait_server_past(r, run_at)
    assert q.promote(limit=10_000) == 5_000
    # trimmed like MAXLEN ~ (whole 100-entry nodes): near the cap, newest kept
    assert 100 <= r.xlen(q.keys.events) < 400
    assert _promoted_events(r, q)[-1] == q.job_ids("pending")[-1]


def test_a_head_whose_last_score_repeats_after_it_moves_only_itself(redis_url, qname, r):
    """Past 4,096 jobs in one ms the delayed slot saturates: the members after a head
    share its last score, so the fast path must not find the head by score."""
    q = make_queue(redis_url, qname)
    ids, run_at = _park(q, 4_200, 3_000)
    wait_server_past(r, run_at)
    assert _promote(q, ids[:200]) == 200
    head = ids[200:4_150]  # the due head now; it ends among the saturated members
    assert _promote(q, head) == 3_950
    assert q.job_ids("scheduled") == ids[4_150:]
    assert q.job_ids("pending") == ids[:4_150]
    assert _promote(q, ids[4_150:4_160]) == 10  # a short list (its head read with scores)
    assert q.job_ids("scheduled") == ids[4_160:]
    assert _promote(q, ids[4_160:]) == 40
    assert r.zcard(q.keys.delayed) == 0


def test_a_head_spanning_milliseconds_stamps_each_job_its_own_run_at(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    first, run_at = _park(q, 3, 400)
    second = [q.enqueue_at(i, run_at + 7).id for i in range(2)]
    wait_server_past(r, run_at + 7)
    assert _promote(q, [*first, *second]) == 5
    stamps = [int(r.hget(q.keys.job(i), "run_at")) for i in [*first, *second]]
    assert stamps == [run_at] * 3 + [run_at + 7] * 2
    assert r.zcard(q.keys.delayed) == 0


def test_one_ms_head_is_stamped_its_run_at_and_an_empty_list_moves_nothing(redis_url,
                                                                           qname, r):
    q = make_queue(redis_url, qname)
    ids, run_at = _park(q, 5, 400)
    wait_server_past(r, run_at)
    assert _promote(q, []) == 0
    assert _promote(q, ids) == 5
    assert {int(r.hget(q.keys.job(i), "run_at")) for i in ids} == {run_at}
    assert _promote(q, ids) == 0  # re-sent: nothing twice
    assert q.job_ids("pending") == ids
