"""The server matrix: scripts/servermatrix.sh runs a compat subset of the suite
against Redis 7.0, Redis 6.2 and Valkey (``EMQ_REDIS_SERVER`` names the binary the session
fixture starts, ``EMQ_EXPECT_SERVER`` what it must be), this module last.

- the server the session runs on is the one asked for (a matrix that silently ran everything
  on the default redis-server would prove nothing);
- a tour drives every Lua script in ``lua/`` through the library under each backend, after
  a ``SCRIPT FLUSH``, and then finds every script loaded on this server: each of them ran
  here (a NOSCRIPT reply loads a script only when it is called).
"""
from __future__ import annotations

import os
import threading
import time

import pytest
import redis

import emqfast
from emqfast import Backoff
from emqfast.core import lua
from emqfast.core.keys import QueueKeys
from emqfast.facade.deps import deplink_key
from emqfast.worker import calls as core
from waiting import wait_until


def _server(r: redis.Redis) -> str:
    """``"<name> <version>"`` of the server, e.g. ``"redis 6.2.14"``, ``"valkey 9.1.2"``."""
    info = r.info("server")
    if "valkey_version" in info:
        return f"valkey {info['valkey_version']}"
    return f"{info.get('server_name', 'redis')} {info['redis_version']}"


def _server_ms(r: redis.Redis) -> int:
    seconds, micros = r.time()
    return seconds * 1000 + micros // 1000


def test_the_session_server_is_the_one_asked_for(r):
    want = os.environ.get("EMQ_EXPECT_SERVER")
    if not want:
        pytest.skip("EMQ_EXPECT_SERVER not set (scripts/servermatrix.sh sets it)")
    assert _server(r).startswith(want), f"asked for {want}, the session runs on {_server(r)}"


def _scripts():
    return sorted(p.stem for p in lua.lua_dir().glob("*.lua"))


def _tour(q: emqfast.Queue, conn: redis.Redis) -> None:
    """Every move once, through the library (by hand: a claim, one of its jobs released,
    the other's lease left to expire and reaped)."""
    q.configure_events(1000)                                    # configure
    q.set_rate_limit(1000, 1000)                                # configure
    q.enqueue({"n": 1})                                         # enqueue
    q.enqueue_many([{"n": i} for i in range(2, 40)])            # enqueue / enqueue_many
    keys = QueueKeys(q.name)                                    # claim + release by hand
    claim = core.claim_call(keys, 2, 50, "matrix-tour")
    _, _, _, pairs = core.parse_claim(claim.script(conn, claim.keys, claim.args))
    release = core.release_call(keys, *pairs[0])
    release.script(conn, release.keys, release.args)
    wait_until(lambda: q.reap()[0] > 0, 10, "the other lease to expire and be reaped")
    q.enqueue({"n": 40}, group="tenant")                        # enqueue_group
    q.enqueue_many([{"n": 41}, {"n": 42}], group="tenant")
    q.groups.set_concurrency("tenant", 2)                       # group_limit
    q.groups.set_rate_limit("tenant", 100, 1000)                # group_rate
    q.enqueue_in({"n": 43}, 0, attempts=2, backoff=Backoff.fixed(10))
    q.enqueue_in({"n": 44}, 100, group="tenant")                # promote + group_join
    q.schedules.upsert("tick", every_ms=60_000, start_at_ms=0,  # schedule_upsert
                       payload={"n": "tick"})
    q.schedules.pump()                                          # schedule_mint
    q.pause(); q.resume()                                       # pause

    def handler(job):                                           # start, extend, progress
        job.extend_lease(30_000)
        job.progress({"pct": 50})
        if job.payload == {"n": 43} and job.attempts == 1:
            raise ValueError("once")                            # fail (a retry)
        if job.payload == {"n": 2}:
            raise emqfast.Unrecoverable("for good")             # fail (final)
        return job.payload                                      # complete, metrics_add
    stats = emqfast.Worker(q, handler, concurrency=4).run_until_idle(timeout_s=60,
                                                                  wait_scheduled=True)
    assert stats.completed >= 40 and stats.failed == 1, stats  # due, group_free, heartbeat
    (failed,) = q.job_ids("failed")
    q.retry(failed)                                             # retry
    assert q.cancel(q.enqueue_in({"n": "late"}, 3_600_000).id)  # cancel
    early = q.enqueue_in({"n": "early"}, 3_600_000).id
    assert q.promote_job(early)                                 # promote_one
    assert emqfast.promote_many(conn, [q]) == {q.name: 0}       # due_many
    plain = emqfast.Queue(q.name + "-plain", conn)  # never grouped: many queues per call
    soon = plain.enqueue_in({"n": "soon"}, 1)
    wait_until(lambda: _server_ms(conn) > plain.get(soon.id).run_at_ms, 10, "soon to be due")
    assert emqfast.promote_many(conn, [plain]) == {plain.name: 1}  # promote_many
    plain.obliterate()
    assert q.delete(early)                                      # delete
    q.trim(keep_completed=1, keep_failed=1)                     # trim
    assert q.schedules.remove("tick")                           # schedule_remove
    _tour_flows(q)
    spread = emqfast.Queue(q.name + "-spread", conn, partitions=2)  # partitions
    spread.enqueue_many([{"n": i} for i in range(4)])
    assert spread.counts()["pending"] == 4
    spread.obliterate()


def _tour_flows(q: emqfast.Queue) -> None:
    """Dependencies, waiting for results, cancelling a running job."""
    first = q.enqueue({"n": "dep"})
    after = q.enqueue({"n": "after"}, depends_on=[first])       # dep_enqueue + dep_link
    doomed = q.enqueue({"n": "doomed"}, depends_on=[first])
    assert q.cancel(doomed.id)                                  # dep_cancel
    with pytest.raises(emqfast.WaitTimeout):                    # wait_register/unregister
        first.wait(timeout_s=0.05)
    hold = threading.Event()

    def handler(job):
        if job.payload == {"n": "hold"}:
            hold.set()
            while not job.cancelled:
                time.sleep(0.005)
        return job.payload
    held = q.enqueue({"n": "hold"})
    w = emqfast.Worker(q, handler, concurrency=2)
    runner = threading.Thread(target=w.run, daemon=True)
    runner.start()
    try:
        assert first.wait(timeout_s=30) == {"n": "dep"}         # dep_resolve (the drain)
        assert after.wait(timeout_s=30) == {"n": "after"}
        assert hold.wait(30)
        assert q.cancel(held.id) == "requested"                 # cancel_active
        with pytest.raises(emqfast.Cancelled):
            held.wait(timeout_s=30)
    finally:
        w.stop()
        runner.join(30)
    # a producer that died between writing a dependent and linking it leaves its mark
    later = q.enqueue({"n": "later"}, delay_ms=3_600_000)
    stuck = q.enqueue({"n": "stuck"}, depends_on=[later])
    q.redis.zadd(deplink_key(q.keys), {stuck.id: 0})
    assert q.settle_dependencies(grace_ms=0).relinked == 1      # dep_stale + dep_sweep


@pytest.mark.parametrize("backend", ["python", "c"], indirect=True)
def test_a_tour_runs_every_script_on_this_server(r, redis_url, qname, backend):
    r.script_flush()
    conn = redis.Redis.from_url(redis_url)
    q = emqfast.Queue(qname, conn)
    _tour(q, conn)
    wait_until(lambda: q.counts()["active"] == 0, 10, "the tour's jobs to settle")
    names = _scripts()
    loaded = r.script_exists(*[lua.read(name).sha for name in names])
    missing = [name for name, ok in zip(names, loaded) if not ok]
    assert not missing, f"never ran on {_server(r)}: {missing}"
    q.obliterate()
