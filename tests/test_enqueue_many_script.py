"""enqueue_many.lua admits a chunk of jobs per call exactly as one enqueue.lua
call per job would (fields, counter values, scores, replies, events), both backends frame
the same calls (identical Redis state), bad input refuses the whole call before any write,
and a re-sent call writes nothing twice."""
from __future__ import annotations

import importlib
from typing import Any, Dict, List

import pytest
import redis

import emqfast
import emqfast.aio
from emqfast import InvalidInput, KindError, Queue, RangeError
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade import enqueue_batch
from emqfast.facade.events import parse_entry

from conftest import dump_queue, require_native
from engine_util import server_ms

SCRIPT = load("enqueue_many")
CHUNK = 7  # jobs per enqueue_many.lua call in these tests: several calls per batch


def state(r: redis.Redis, qname: str) -> Dict[str, Any]:
    """Every key of a queue by suffix, with its contents in order (the creation instant
    and the events' stream ids, both server clock readings, left out; the events as
    readers get them)."""
    out: Dict[str, Any] = {}
    for key in sorted(r.scan_iter(match=f"emq:{{{qname}}}:*", count=1000)):
        suffix = key.decode().split("}:", 1)[1]
        kind = r.type(key)
        if kind == b"hash":
            out[suffix] = [(f, b"<now>" if f == b"created" else v)
                           for f, v in r.hgetall(key).items()]
        elif kind == b"zset":
            out[suffix] = r.zrange(key, 0, -1, withscores=True)
        elif kind == b"stream":  # as readers see it: enqueue_many batches its entries
            out[suffix] = [(e.name, e.job_id, e.fields)
                           for entry_id, fields in r.xrange(key)
                           for e in parse_entry(entry_id, fields)]
        else:
            out[suffix] = r.get(key)
    return out


def jobs(n: int) -> List[Any]:
    """Payloads of both encodings (bytes and JSON): each call carries per-job encodings."""
    return [f"b{i}".encode() if i % 3 == 0 else {"n": i} for i in range(n)]


def _options(r: redis.Redis, mode: str) -> Dict[str, Any]:
    if mode == "at":  # a fixed instant: the one-by-one twin lands on the same scores
        return {"run_at_ms": server_ms(r) + 3_600_000}
    if mode == "priority":
        return {"priority": 7, "attempts": 4}
    return {}


@pytest.mark.parametrize("mode", ["now", "at", "priority"])
def test_a_batch_lands_as_one_enqueue_per_job_would(backend, r, qname, monkeypatch, mode):
    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    opts = _options(r, mode)
    payloads = jobs(40)
    ids = [f"JOBid{i:04d}" for i in range(40)]
    ids[9] = ids[3]     # a duplicate inside the same call
    ids[30] = ids[12]   # and one across calls
    many, one = Queue(qname + "-many", r), Queue(qname + "-one", r)
    for q in (many, one):  # an id that exists before the batch
        q.enqueue({"old": 1}, job_id=ids[20])
    refs = many.enqueue_many(payloads, job_ids=ids, **opts)
    singles = [one.enqueue(p, job_id=j, **opts) for p, j in zip(payloads, ids)]
    assert [(x.id, x.status) for x in refs] == [(x.id, x.status) for x in singles]
    assert [x.status for x in refs].count("duplicate") == 3
    assert state(r, many.name) == state(r, one.name)


def test_the_c_and_python_backends_write_identical_state(r, qname, monkeypatch):
    require_native()
    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    backend = importlib.import_module("emqfast.backend")
    previous = backend.current()
    run_at = server_ms(r) + 3_600_000
    ids = [f"JOBpar{i:04d}" for i in range(33)]
    got = {}
    try:
        for name in ("python", "c"):
            backend.use(name)
            q = Queue(f"{qname}-{name}", r)
            refs = q.enqueue_many(jobs(33), job_ids=ids, priority=3)
            refs += q.enqueue_many([b"x"] * 10, job_ids=[f"JOBd{i}" for i in range(10)],
                                   run_at_ms=run_at)
            got[name] = ([(x.id, x.status) for x in refs], state(r, q.name))
    finally:
        backend.use(previous)
    assert got["python"] == got["c"]


def _call(r: redis.Redis, q: Queue, ids: List[str], *, priority: Any = "0", mode: str = "now",
          value: Any = "0", extra: List[Any] = ()) -> Any:
    keys = [q.keys.pending, q.keys.delayed, q.keys.marker, q.keys.meta, q.keys.counter,
            q.keys.events, *(q.keys.job(j) for j in ids)]
    args = [KEYSPACE_VERSION, "1", "", priority, mode, value, "b"]
    for j in ids:
        args += [j, b"payload"]
    return SCRIPT(r, keys, [*args, *extra])


@pytest.mark.parametrize("bad, error", [
    ({"ids": ["JOBa", "JOBb", "XOBc", "JOBd"]}, KindError),   # one bad id, mid-call
    ({"priority": "-1"}, RangeError),
    ({"priority": "1.5"}, RangeError),
    ({"mode": "soon"}, InvalidInput),
    ({"value": "-5", "mode": "in"}, RangeError),
    ({"extra": [b"stray"]}, InvalidInput),                   # ARGV not 2 values per job
    ({"ids": []}, InvalidInput),
    ({"ids": [f"JOB{i}" for i in range(4001)]}, InvalidInput),
])
def test_bad_input_refuses_the_whole_call_and_writes_nothing(r, qname, bad, error):
    q = Queue(qname, r)
    q.enqueue("before")  # a queue with state, so "nothing written" is checked on real keys
    before = dump_queue(r, qname)
    kw = dict(bad)
    ids = kw.pop("ids", ["JOBa", "JOBb", "JOBc"])
    with pytest.raises(error):
        _call(r, q, ids, **kw)
    assert dump_queue(r, qname) == before


def test_a_resent_call_reports_its_jobs_as_there_and_writes_nothing(r, qname):
    q = Queue(qname, r)
    ids = [f"JOBr{i}" for i in range(600)]  # more than one EXISTS chunk of 500 keys
    assert _call(r, q, ids) == [1] * 600
    before = dump_queue(r, qname)
    assert _call(r, q, ids) == [0] * 600
    assert dump_queue(r, qname) == before
    # a call some of whose jobs landed before admits only the others
    more = ids[590:] + ["JOBr-new1", "JOBr-new2"]
    assert _call(r, q, more) == [0] * 10 + [1, 1]
    assert r.zcard(q.keys.pending) == 602
    assert int(r.get(q.keys.counter)) == 602


def test_an_all_duplicate_call_does_not_even_stamp_the_fence(r, qname):
    q = Queue(qname, r)
    r.hset(q.keys.job("JOBx"), "payload", "p")
    assert _call(r, q, ["JOBx", "JOBx"]) == [0, 0]
    assert not r.exists(q.keys.meta)


def test_each_admitted_job_has_its_enqueued_event(backend, r, qname, monkeypatch):
    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    q = Queue(qname, r)
    refs = q.enqueue_many(jobs(20))
    again = q.enqueue_many(jobs(2), job_ids=[refs[0].id, "JOBnew"], delay_ms=60_000)
    events = list(q.events())
    assert [(e.name, e.job_id, e.fields["state"]) for e in events] == \
        [("enqueued", x.id, "pending") for x in refs] + [("enqueued", "JOBnew", "scheduled")]
    assert [x.status for x in again] == ["duplicate", "scheduled"]


def test_ids_minted_together_share_an_entry_per_hundred_jobs(backend, r, qname):
    """The bulk path's events cost one XADD per 100 jobs, and read back as one
    event per admitted job, in job order, whatever ids a batch holds."""
    q = Queue(qname, r)
    refs = q.enqueue_many(jobs(250))  # minted together: one head, 4-character tails
    assert r.xlen(q.keys.events) == 3
    n = r.xlen(q.keys.events)
    odd = ["JOBodd-1", "JOBodd-22", "JOBodd-3"]  # lengths differ: one entry per job
    wide = ["JOBwé01", "JOBwé02"]  # not ASCII: one entry per job
    dup = [refs[0].id, "JOBtwin0001", "JOBtwin0002"]  # a duplicate leaves the others a run
    for ids in (odd, wide, dup):
        q.enqueue_many(jobs(len(ids)), job_ids=ids)
    assert r.xlen(q.keys.events) - n == len(odd) + len(wide) + 1
    events = list(q.events())
    assert [e.job_id for e in events] == \
        [x.id for x in refs] + odd + wide + ["JOBtwin0001", "JOBtwin0002"]
    assert {(e.name, e.fields["state"]) for e in events} == {("enqueued", "pending")}


def test_a_batch_goes_in_calls_of_the_chunk_size(backend, r, qname, monkeypatch):
    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    q = Queue(qname, r)
    q.enqueue("warm")  # scripts loaded: no NOSCRIPT re-send counted below

    def calls() -> int:
        stats = r.info("commandstats").get("cmdstat_evalsha", {})
        return int(stats.get("calls", 0))
    before = calls()
    refs = q.enqueue_many(jobs(3 * CHUNK + 2))
    assert calls() - before == 4
    assert {x.status for x in refs} == {"pending"} and r.zcard(q.keys.pending) == 3 * CHUNK + 3


def test_aio_enqueue_many_sends_the_same_calls(r, redis_url, qname, monkeypatch):
    import asyncio

    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    ids = [f"JOBaio{i}" for i in range(20)]
    sync = Queue(qname + "-sync", r)
    sync.enqueue_many(jobs(20), job_ids=ids, priority=2)

    async def main() -> List[Any]:
        client = emqfast.aio.connect(redis_url)
        try:
            q = emqfast.aio.Queue(qname + "-aio", client)
            return await q.enqueue_many(jobs(20), job_ids=ids, priority=2)
        finally:
            await client.aclose()
    refs = asyncio.run(main())
    assert [x.status for x in refs] == ["pending"] * 20
    assert state(r, qname + "-aio") == state(r, qname + "-sync")


def test_a_flushed_script_cache_reloads_and_sends_every_chunk_once(backend, r, qname,
                                                                     monkeypatch):
    monkeypatch.setattr(enqueue_batch, "MANY_CHUNK", CHUNK)
    q = Queue(qname, r)
    q.enqueue_many(["warm"])
    r.script_flush()  # every call of the next batch meets NOSCRIPT, then is re-sent once
    refs = q.enqueue_many(jobs(3 * CHUNK + 1))
    assert {x.status for x in refs} == {"pending"}
    assert r.zcard(q.keys.pending) == 3 * CHUNK + 2
    assert int(r.get(q.keys.counter)) == 3 * CHUNK + 2


@pytest.mark.parametrize("denied", ["xadd", "incrby", "hset"])
def test_a_user_denied_a_command_it_writes_with_gets_nothing_written(backend, r, redis_url,
                                                                     qname, denied):
    import uuid

    from emqfast.errors import PermissionDenied

    user = "emq-many-" + uuid.uuid4().hex[:8]
    r.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["emq:*"],
                  commands=["+@all", f"-{denied}"])
    try:
        client = redis.Redis.from_url(redis_url, username=user, password="pw")
        with pytest.raises(PermissionDenied):
            Queue(qname, client).enqueue_many(["a", "b"])
        client.close()
        assert dump_queue(r, qname) == {}
    finally:
        r.acl_deluser(user)
