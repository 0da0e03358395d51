"""Invariants of the Lua scripts that keep jobs safe, enforced statically and
against a real Redis.

- **Least privilege**: the set of Redis commands every script can call (its includes
  expanded, ``redis.call('CMD', ...)`` with literal names only) and every command the
  Python side sends is inside the README's least-privilege ACL rule, so the rule cannot
  fall behind the code (a command a script gains and the rule lacks fails here).
- **Check before the first write**: in every script, each argument check that can end
  in an error reply, and the boot fence, come before the first write.
- **Bounded work per call**: promote / reap / trim / promote_many with a
  backlog bigger than one call go in calls of a bounded count (seen in MONITOR), and the
  scripts refuse more than 4,000 ids or a due limit above 4,000, touching nothing.
- **Bad input**: non-integer, negative or huge limits are a typed InvalidInput before
  anything is sent (a client on a dead port proves it) and Redis is untouched.
"""
from __future__ import annotations

import re
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List

import pytest
import redis

import emqfast
from emqfast import InvalidInput, Queue
from emqfast.core.ops import PROMOTE_BATCH, REAP_BATCH, TRIM_BATCH
from emqfast.backends.scripts import all_scripts, load
from emqfast.core.version import KEYSPACE_VERSION

import lua_static
from conftest import _free_port, dump_queue
from engine_util import make_queue, server_ms, wait_server_past

SCRIPTS = all_scripts()
RULE = lua_static.allowed_commands(lua_static.readme_least_privilege())
# Sent by the library, refused without harm by a least-privilege user (each falls back):
OPTIONAL = {
    "client|id": "precise wake-up (emqfast/wake.py): falls back to BZPOPMIN's timeout",
    "client|unblock": "precise wake-up (emqfast/wake.py): falls back to BZPOPMIN's timeout",
    "config|get": "eviction check (emqfast/eviction.py): falls back to INFO memory",
}
# Check-before-write violations in scripts other engineers own, reported to the lead
# (script -> reason); each is an xfail(strict) so its fix is noticed. None today.
KNOWN_VIOLATIONS: dict = {}


# --- least privilege ----------------------------------------------------------------------

def test_every_command_a_script_can_call_is_in_the_readme_rule():
    missing = {}
    for name, script in SCRIPTS.items():
        code = lua_static.strip_comments(script.source)
        used = {cmd for _, cmd in lua_static.commands_in(code, name)}
        if used - RULE:
            missing[name] = sorted(used - RULE)
    assert missing == {}, f"README's least-privilege ACL rule lacks: {missing}"


def test_every_command_the_library_sends_is_in_the_readme_rule(r):
    known = {(c.decode() if isinstance(c, bytes) else c).lower() for c in r.command_list()}
    sent = lua_static.python_commands(known)
    # the reader really sees the Python side (not vacuously empty)
    assert {"evalsha", "bzpopmin", "scan", "watch", "multi", "exec", "xread"} <= set(sent)
    missing = {cmd: sorted(where) for cmd, where in sent.items()
               if cmd not in RULE and cmd not in OPTIONAL}
    assert missing == {}, f"README's least-privilege ACL rule lacks: {missing}"


def test_the_acl_test_runs_the_readme_rule():
    import test_security
    assert test_security.MINIMAL_ACL == lua_static.readme_least_privilege()


def test_a_command_name_that_is_not_a_literal_fails_loudly():
    with pytest.raises(lua_static.LuaReadError, match="not a literal"):
        lua_static.commands_in("local c = 'DEL'\nredis.call(c, KEYS[1])\n", "synthetic")
    assert lua_static.commands_in("redis.pcall( \"zAdd\", KEYS[1], 1, 'x')", "s") == [(1, "zadd")]


# --- check before the first write ---------------------------------------------------------

def _params() -> List[Any]:
    out = []
    for name in SCRIPTS:
        marks = ([pytest.mark.xfail(strict=True, reason=KNOWN_VIOLATIONS[name])]
                 if name in KNOWN_VIOLATIONS else [])
        out.append(pytest.param(name, marks=marks, id=name))
    return out


@pytest.mark.parametrize("name", _params())
def test_checks_come_before_the_fence_and_the_first_write(name):
    order = lua_static.write_order(name, SCRIPTS[name].raw)
    assert order.violations() == []
    if order.first_write is not None:  # every writing script is fenced
        assert order.fence is not None


def test_the_write_order_reader_sees_a_late_check():
    raw = ("-- x.lua\n--@include common\n\n"
           "if not ARGV[1] then return redis.error_reply('EMQINPUT a') end\n"
           "local err = emq_fence(KEYS[2], ARGV[2])\n"
           "if err then return redis.error_reply(err) end\n"
           "emq_wake(KEYS[3])\n"
           "if ARGV[3] == '' then return redis.error_reply('EMQINPUT late') end\n")
    order = lua_static.write_order("x", raw)
    assert order.first_write == (7, "emq_wake()")
    assert [v.split(": ", 1)[0] for v in order.violations()] == ["x.lua:8"]


# --- bounded work per call --------------------------------------------------------------

@contextmanager
def monitored(redis_url: str) -> Iterator[List[List[str]]]:
    """Every command clients (not scripts) send while the block runs, as arg lists."""
    seen: List[List[str]] = []
    token = "emq-monitor-end-" + uuid.uuid4().hex
    mon_client = redis.Redis.from_url(redis_url)
    for script in SCRIPTS.values():  # no NOSCRIPT re-send inside the block: one call, one line
        mon_client.script_load(script.source)
    ready = threading.Event()

    def listen() -> None:
        with mon_client.monitor() as m:
            ready.set()
            while True:
                cmd = m.next_command()
                if cmd.get("client_type") == "lua":
                    continue
                args = cmd["command"].split(" ")
                if args == ["ECHO", token]:
                    return
                seen.append(args)

    t = threading.Thread(target=listen, daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        yield seen
    finally:
        with redis.Redis.from_url(redis_url) as c:
            c.echo(token)
        t.join(20)
        mon_client.close()


def script_calls(seen: List[List[str]], name: str) -> List[List[str]]:
    """The EVALSHA calls of script ``name``: ``[keys..., '|', args...]`` each."""
    sha = load(name).sha
    out = []
    for args in seen:
        if args[0].upper() == "EVALSHA" and args[1] == sha:
            n = int(args[2])
            out.append((args[3:3 + n], args[3 + n:]))
    return out


def _park_due(q: Queue, n: int) -> List[str]:
    run_at = server_ms(q.redis) + 1500
    ids = [ref.id for ref in q.enqueue_many(list(range(n)), run_at_ms=run_at)]
    assert q.redis.zcard(q.keys.delayed) == n, "enqueue outran its head start"
    wait_server_past(q.redis, run_at)
    return ids


def test_promote_of_a_big_backlog_goes_in_bounded_calls(redis_url, qname):
    q = make_queue(redis_url, qname)
    rest = PROMOTE_BATCH // 2
    n = 2 * PROMOTE_BATCH + rest
    _park_due(q, n)
    with monitored(redis_url) as seen:
        assert q.promote(limit=1_000_000) == n
    dues = script_calls(seen, "due")
    promotes = script_calls(seen, "promote")
    assert dues and all(int(args[0]) <= 4000 for _, args in dues)  # due.lua's maximum
    assert [len(args) - 1 for _, args in promotes] == [PROMOTE_BATCH, PROMOTE_BATCH, rest]
    assert q.counts()["pending"] == n and q.counts()["scheduled"] == 0


def test_promote_many_with_a_big_limit_goes_in_bounded_calls(redis_url, qname):
    queues = [make_queue(redis_url, f"{qname}-{i}") for i in range(2)]
    rest = PROMOTE_BATCH // 2
    n = PROMOTE_BATCH + rest
    for q in queues:
        _park_due(q, n)
    with monitored(redis_url) as seen:
        moved = emqfast.promote_many(queues[0].redis, queues, limit=500_000)
    assert moved == {q.name: n for q in queues}
    # one standalone server: due_many.lua reads many queues per call, each limit <= 4000
    reads = script_calls(seen, "due") + script_calls(seen, "due_many")
    assert reads and all(int(limit) <= 4000 for _, args in reads for limit in args)
    sizes = sorted(len(args) - 1 for _, args in script_calls(seen, "promote"))
    assert sizes == [rest, rest, PROMOTE_BATCH, PROMOTE_BATCH]


def _expire_leases(q: Queue, ids: List[str]) -> None:
    """Make ``ids`` (pending) look active with long-expired leases, as after a crash."""
    pipe = q.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.zrem(q.keys.pending, job_id)
        pipe.zadd(q.keys.active, {job_id: 1})
        pipe.hset(q.keys.leases, job_id, "dead-worker:1")
        pipe.hset(q.keys.job(job_id), mapping={"state": "active", "attempts": 1})
    pipe.execute()


def test_reap_of_a_big_backlog_goes_in_bounded_calls(redis_url, qname):
    q = make_queue(redis_url, qname)
    n = 2 * REAP_BATCH + 100
    ids = [ref.id for ref in q.enqueue_many(list(range(n)))]
    _expire_leases(q, ids)
    with monitored(redis_url) as seen:
        assert q.reap(max_stalled=5, limit=1_000_000) == (n, 0)
    assert [len(args) - 2 for _, args in script_calls(seen, "reap")] == \
        [REAP_BATCH, REAP_BATCH, 100]
    assert max(int(args[0]) for _, args in script_calls(seen, "due")) <= REAP_BATCH
    assert q.counts()["pending"] == n and q.counts()["active"] == 0


def _finish(q: Queue, n: int, key: str) -> List[str]:
    """``n`` jobs in a finished set (oldest first), as a worker would have left them."""
    ids = [ref.id for ref in q.enqueue_many(list(range(n)))]
    now = server_ms(q.redis)
    pipe = q.redis.pipeline(transaction=False)
    for i, job_id in enumerate(ids):
        pipe.zrem(q.keys.pending, job_id)
        pipe.zadd(key, {job_id: now - 10 * n + i})
        pipe.hset(q.keys.job(job_id), mapping={"state": "completed", "finished": now})
    pipe.execute()
    return ids


def test_trim_of_a_big_backlog_reads_and_deletes_in_bounded_calls(redis_url, qname):
    q = make_queue(redis_url, qname)
    n = 2 * TRIM_BATCH + 700
    ids = _finish(q, n, q.keys.completed)
    with monitored(redis_url) as seen:
        assert q.trim(keep_completed=200) == n - 200
    reads = [a for a in seen if a[0].upper() in ("ZRANGE", "ZRANGEBYSCORE", "ZREVRANGE")]
    # each read of victims is a bounded head (ZRANGE key 0 n-1, n <= TRIM_BATCH), never
    # "everything but the newest keep" (ZRANGE key 0 -(keep+1): the whole backlog at once)
    assert reads and all(a[0].upper() == "ZRANGE" and int(a[2]) == 0
                         and 0 <= int(a[3]) < TRIM_BATCH for a in reads), reads
    assert max(len(args) - 3 for _, args in script_calls(seen, "trim")) <= TRIM_BATCH
    assert q.job_ids("completed") == ids[-200:][::-1]  # the newest kept
    assert not q.redis.exists(q.keys.job(ids[0])) and q.redis.exists(q.keys.job(ids[-1]))


def test_trim_limit_bounds_one_call_and_the_rest_follows(redis_url, qname):
    q = make_queue(redis_url, qname)
    ids = _finish(q, 1500, q.keys.failed)
    assert q.trim(keep_failed=0, limit=600) == 600
    assert q.job_ids("failed")[-1] == ids[600]
    assert q.trim(keep_failed=0, max_age_ms=0) == 900


def test_trim_script_rechecks_a_stale_list_and_keeps_what_the_rule_keeps(redis_url, qname, r):
    """A concurrent trimmer's list (ids it read before another trim ran) must not delete
    jobs the count rule keeps: trim.lua stops at the first job the rule keeps."""
    q = make_queue(redis_url, qname)
    ids = _finish(q, 10, q.keys.completed)
    trim = load("trim")
    k = q.keys
    assert trim(r, [k.completed, k.meta, k.dedupe, *k.jobs(ids[:8])],
                [KEYSPACE_VERSION, 5, -1, *ids[:8]]) == [5, 0]
    assert q.job_ids("completed") == ids[5:][::-1]
    # a stale list (ids already gone) deletes nothing more
    assert trim(r, [k.completed, k.meta, k.dedupe, *k.jobs(ids[:8])],
                [KEYSPACE_VERSION, 5, -1, *ids[:8]]) == [0, 0]
    assert r.zcard(k.completed) == 5


@pytest.mark.parametrize("name", ["promote", "reap", "trim"])
def test_a_script_refuses_more_than_4000_ids_and_touches_nothing(redis_url, qname, r, name):
    q = make_queue(redis_url, qname)
    q.enqueue("keep me")
    before = dump_queue(r, qname)
    k = q.keys
    ids = [f"JOB{i:020d}" for i in range(4001)]
    fixed = {"promote": ([k.delayed, k.pending, k.marker, k.meta, k.events], [KEYSPACE_VERSION]),
             "reap": ([k.active, k.leases, k.pending, k.failed, k.marker, k.meta, k.events,
                       k.metrics, k.waiters, k.dependents, k.outbox], [1, KEYSPACE_VERSION]),
             "trim": ([k.completed, k.meta, k.dedupe], [KEYSPACE_VERSION, 0, -1])}[name]
    with pytest.raises(InvalidInput, match="at most 4000"):
        load(name)(r, [*fixed[0], *k.jobs(ids)], [*fixed[1], *ids])
    with pytest.raises(InvalidInput):
        load("due")(r, [k.delayed], [4001, 1])
    assert dump_queue(r, qname) == before


def test_extend_refuses_a_fractional_lease_or_too_many_pairs_and_touches_nothing(
        redis_url, qname, r):
    q = make_queue(redis_url, qname)
    q.enqueue("keep me")
    before = dump_queue(r, qname)
    k = q.keys
    pairs = [x for i in range(4001) for x in (f"JOB{i:020d}", f"w:{i}")]
    extend = load("extend")
    with pytest.raises(InvalidInput, match="at most 4000"):
        extend(r, [k.active, k.leases, k.meta], [1000, KEYSPACE_VERSION, *pairs])
    with pytest.raises(InvalidInput, match="whole lease"):
        extend(r, [k.active, k.leases, k.meta], [2.5, KEYSPACE_VERSION, *pairs[:2]])
    assert dump_queue(r, qname) == before


# --- bad input: typed, before anything is sent ---------------------------------------------

BAD = [2.5, "10", -1, True, None, float("nan"), b"7"]  # wrong for every limit below
# (name, call, further bad values: past the maximum, and 0 where 0 is not allowed)
ENTRY_POINTS: List[Any] = [
    ("promote", lambda q, v: q.promote(limit=v), [0, 10**7]),
    ("reap limit", lambda q, v: q.reap(limit=v), [0, 10**7]),
    ("reap max_stalled", lambda q, v: q.reap(max_stalled=v), [10**7]),
    ("trim limit", lambda q, v: q.trim(limit=v), [0, 10**7]),
    ("trim keep", lambda q, v: q.trim(keep_completed=v), [1 << 41]),
    ("trim max_age", lambda q, v: q.trim(max_age_ms=-1 if v is None else v), [1 << 60]),
    ("promote_many", lambda q, v: emqfast.promote_many(q.redis, [q], limit=v), [0, 10**7]),
    ("schedules.pump", lambda q, v: q.schedules.pump(limit=v), [0, 10**7]),
    ("groups.set_concurrency",
     lambda q, v: q.groups.set_concurrency("g", 2.5 if v is None else v), [0, 1 << 32]),
    ("groups.set_rate_limit", lambda q, v: q.groups.set_rate_limit("g", v, 1000), [0, 1 << 32]),
    ("set_rate_limit", lambda q, v: q.set_rate_limit(10, v), [0, 1 << 60]),
    ("configure_events", lambda q, v: q.configure_events(v), [1 << 41]),
]


@pytest.mark.parametrize("what,call,more", ENTRY_POINTS, ids=[e[0] for e in ENTRY_POINTS])
def test_bad_limits_are_typed_and_never_reach_redis(redis_url, qname, r, what, call, more):
    live = make_queue(redis_url, qname)
    live.enqueue("x")
    live.enqueue_in("later", 60_000)
    before = dump_queue(r, qname)
    dead = Queue(qname, redis.Redis(port=_free_port(), socket_connect_timeout=0.5))
    for value in BAD + more:
        for q in (live, dead):  # on the dead port, anything sent would be a connection error
            with pytest.raises(InvalidInput):
                call(q, value)
    assert dump_queue(r, qname) == before


def test_pause_and_schedule_upsert_refuse_bad_arguments_before_any_write(redis_url, qname, r):
    """pause.lua took any ARGV[1] but '1' as resume (writing the wake marker);
    schedule_upsert.lua unpack()ed a caller-sized option list after its generation INCR,
    so 5,000 pairs failed half-way (counter bumped). Both now refuse first."""
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    before = dump_queue(r, qname)
    k = q.keys
    with pytest.raises(InvalidInput):
        load("pause")(r, [k.meta, k.marker], ["yes", KEYSPACE_VERSION])
    options = [v for i in range(5000) for v in (f"field{i}", "v")]
    with pytest.raises(InvalidInput):
        load("schedule_upsert")(r, [k.repeat, k.schedule("s"), k.meta, k.marker, k.counter],
                                ["s", "sig", "set", "", server_ms(r) + 60_000, "",
                                 KEYSPACE_VERSION, *options])
    assert dump_queue(r, qname) == before


def test_schedule_sweep_reads_due_names_in_bounded_calls(redis_url, qname):
    from emqfast.facade.schedules import SWEEP_BATCH
    q = make_queue(redis_url, qname)
    n = SWEEP_BATCH + 200
    start = server_ms(q.redis) - 60_000  # every schedule has a missed slot: due now
    q.schedules.upsert_many([{"name": f"s{i}", "every_ms": 3_600_000, "start_at_ms": start}
                             for i in range(n)])
    with monitored(redis_url) as seen:
        assert q.schedules.pump(limit=100_000) == n
    limits = [int(args[0]) for keys, args in script_calls(seen, "due")]
    assert limits and max(limits) <= SWEEP_BATCH, limits
