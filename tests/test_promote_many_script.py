"""promote_many.lua: the due jobs of many queues of one standalone server move in
one call per 500 queues, exactly as promote.lua moves them queue by queue (pending scores,
run-at stamps, 'promoted' events), and a call that cannot be carried out in full writes
nothing for any of its queues. Also the popped head of promote.lua's few-id path: a head
that is not the list goes back unchanged."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import pytest
import redis

import emqfast
from emqfast.backends.scripts import load
from emqfast.core.errors import InvalidInput, VersionMismatch
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.events import parse_entry
from engine_util import server_ms, wait_server_past
from test_script_safety import monitored, script_calls

PROMOTE_MANY = load("promote_many")
PROMOTE = load("promote")


def _call(r: redis.Redis, parts: Sequence[Tuple[emqfast.Queue, Sequence[str]]],
          version: str = KEYSPACE_VERSION) -> List[int]:
    """promote_many.lua for ``(queue, ids)`` parts, framed as the library frames it."""
    keys: List[str] = []
    args: List[str] = [version]
    for q, ids in parts:
        k = q.keys
        keys += [k.delayed, k.pending, k.marker, k.meta, k.events, *k.jobs(ids)]
        args += [str(len(ids)), *ids]
    return PROMOTE_MANY(r, keys, args)


def _park(queues: Sequence[emqfast.Queue], per: Sequence[int], head_start_ms: int = 1500
          ) -> Tuple[Dict[str, List[str]], int]:
    """``per[i]`` jobs due on queue i shortly (server clock): ``({name: ids}, run_at)``."""
    r = queues[0].redis
    run_at = server_ms(r) + head_start_ms
    ids = {q.name: [ref.id for ref in q.enqueue_many(list(range(n)), run_at_ms=run_at)]
           for q, n in zip(queues, per)}
    assert server_ms(r) < run_at, "parking outran its head start"
    return ids, run_at


def _snapshot(q: emqfast.Queue) -> Dict[str, object]:
    """What a promote changes: both sets with scores, the jobs' fields, the events."""
    r, k = q.redis, q.keys
    ids = [m.decode() for m in r.zrange(k.delayed, 0, -1) + r.zrange(k.pending, 0, -1)]
    events = [(e.name, e.job_id) for entry_id, f in r.xrange(k.events)
              for e in parse_entry(entry_id, f)]
    return {"delayed": r.zrange(k.delayed, 0, -1, withscores=True),
            "pending": r.zrange(k.pending, 0, -1, withscores=True),
            "jobs": {i: r.hgetall(k.job(i)) for i in ids}, "events": events}


def _counts(args: Sequence[str]) -> List[int]:
    """The id count of each queue of a promote_many.lua call's ARGV."""
    counts, at = [], 1
    while at < len(args):
        counts.append(int(args[at]))
        at += counts[-1] + 1
    return counts


def _queues(client: redis.Redis, qname: str, n: int) -> List[emqfast.Queue]:
    return [emqfast.Queue(f"{qname}-{i}", client) for i in range(n)]


def test_many_queues_move_in_few_calls_exactly_as_queue_by_queue(redis_url, qname, r):
    """1,100 queues x 1-3 due jobs, one with 40 (promote.lua's) and one grouped: promote_many
    moves each as Queue.promote moves its twin, in 3 promote_many.lua calls."""
    client = redis.Redis.from_url(redis_url)
    ours, twins = _queues(client, qname + "-a", 1102), _queues(client, qname + "-b", 1102)
    per = [i % 3 + 1 for i in range(1100)] + [40, 2]
    for q in (ours[-1], twins[-1]):
        q.enqueue_in("grouped", 3_600_000, group="tenant")  # marks the queue grouped
    ids, run_at = _park(ours + twins, per + per, head_start_ms=4000)
    wait_server_past(r, run_at)
    with monitored(redis_url) as seen:
        moved = emqfast.promote_many(client, ours)
    assert moved == {q.name: n for q, n in zip(ours, per)}
    calls = [_counts(args) for _, args in script_calls(seen, "promote_many")]
    assert [len(c) for c in calls] == [500, 500, 100]  # queues per call, 1-3 ids each
    assert [n for c in calls for n in c] == per[:1100]
    assert len(script_calls(seen, "promote")) == 2  # the queue of 40, the grouped one
    for q in twins:
        q.promote()
    for a, b in zip(ours, twins):
        assert a.counts() == b.counts()
        got, want = _snapshot(a), _snapshot(b)
        # the same members and scores (ids differ between twins: compare by position)
        assert [s for _, s in got["pending"]] == [s for _, s in want["pending"]]
        assert [m.decode() for m, _ in got["pending"]] == ids[a.name]
        assert got["events"][-len(ids[a.name]):] == [("promoted", i) for i in ids[a.name]]
        for i in ids[a.name]:
            fields = got["jobs"][i]
            assert int(fields[b"run_at"]) == run_at and b"ps" in fields
    client.close()


def test_a_decode_responses_client_promotes_many(redis_url, qname, r):
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    queues = _queues(client, qname, 30)
    ids, run_at = _park(queues, [2] * 30)
    wait_server_past(r, run_at)
    assert emqfast.promote_many(client, queues) == {q.name: 2 for q in queues}
    assert all(q.job_ids("pending") == ids[q.name] for q in queues)
    client.close()


def test_stale_ids_are_skipped_and_a_popped_head_goes_back_unchanged(redis_url, qname, r):
    queues = _queues(r, qname, 3)
    ids, run_at = _park(queues, [4, 4, 4])
    later = queues[1].enqueue_at("later", run_at + 3_600_000).id
    wait_server_past(r, run_at)
    a, b, c = queues
    before_b = _snapshot(b)
    # a: exactly its head; b: its head's ids out of order, a future job and an unknown id
    # (the pop is undone, then each id looked up); c: a subset after its head's first
    stale_b = [ids[b.name][1], ids[b.name][0], later, "JOBnosuch"]
    assert _call(r, [(a, ids[a.name]), (b, stale_b), (c, ids[c.name][2:])]) == [4, 2, 2]
    assert a.job_ids("pending") == ids[a.name]
    assert b.job_ids("pending") == ids[b.name][:2]  # their own scores: mint order
    after_b = _snapshot(b)
    moved = {ids[b.name][0], ids[b.name][1]}
    assert [(m, s) for m, s in before_b["delayed"] if m.decode() not in moved] \
        == after_b["delayed"]  # the rest of b's delayed set, scores and all, unchanged
    assert c.job_ids("scheduled") == ids[c.name][:2]
    assert _call(r, [(a, ids[a.name])]) == [0]  # moved already: nothing twice


def _state(queues: Sequence[emqfast.Queue]) -> List[Dict[str, object]]:
    return [_snapshot(q) for q in queues]


@pytest.mark.parametrize("bad", ["version", "count", "too_many_ids", "keys", "queues"])
def test_a_call_that_cannot_be_done_in_full_writes_nothing(redis_url, qname, r, bad):
    queues = _queues(r, qname, 3)
    ids, run_at = _park(queues, [2, 2, 2])
    wait_server_past(r, run_at)
    parts = [(q, ids[q.name]) for q in queues]
    before = _state(queues)
    if bad == "version":  # the last queue speaks another major version
        r.hset(queues[2].keys.meta, "version", "emqfast:99.0")
        error = VersionMismatch
    elif bad == "count":
        parts[2] = (queues[2], ids[queues[2].name] * 9)  # 18 ids: more than 16 per queue
        error = InvalidInput
    elif bad == "too_many_ids":
        parts = [(queues[0], ids[queues[0].name] * 8)] * 251  # 16 x 251 > 4000 ids
        error = InvalidInput
    elif bad == "queues":
        parts = [(queues[0], ids[queues[0].name][:1])] * 501
        error = InvalidInput
    else:  # one job key short: the layout does not add up
        keys = [k for q, i in parts for k in (q.keys.delayed, q.keys.pending, q.keys.marker,
                                               q.keys.meta, q.keys.events, *q.keys.jobs(i))]
        args = [KEYSPACE_VERSION] + [a for q, i in parts for a in (str(len(i)), *i)]
        with pytest.raises(InvalidInput):
            PROMOTE_MANY(r, keys[:-1], args)
        assert _state(queues) == before
        return
    with pytest.raises(error):
        _call(r, parts)
    if bad == "version":
        before[2] = _snapshot(queues[2])  # (the meta field set above is not a snapshot part)
    assert _state(queues) == before
