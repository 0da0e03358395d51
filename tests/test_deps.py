"""Dependencies: ``enqueue(..., depends_on=[...], on_dep_failure=...)`` under both
facades (sync ``emqfast`` and ``emqfast.aio``), against a real Redis.

Each runs under both facades; the main paths also under both backends (C and Python).
A dependent waits as ``waiting_deps`` (counts, get, job_ids) until every dependency
completed, then joins pending at its own priority; a failed dependency fails it with
``dependency failed`` (cascading) or, with ``"run"``, lets it run; the handler reads
``job.dependency_results()``. Bad input is typed and writes nothing; a producer that dies
between writing the dependent and linking it is repaired by the next settle.
"""
from __future__ import annotations

from typing import Any, Dict, List

import pytest
import redis

import emqfast
from conftest import dump_queue
from emqfast.core.errors import (DependencyCycle, InputTypeError, InvalidInput, KindError,
                                 UnknownDependency)
from emqfast.facade import deps
from emqfast.facade.admission import Job
from engine_util import wait_server_past
from test_contract_facades import Facade


@pytest.fixture(params=["sync", "async"])
def facade(request, redis_url):
    f = Facade(request.param, redis_url)
    yield f
    f.close()


@pytest.fixture
def queues(facade, qname):
    return facade.queue(qname + "-a"), facade.queue(qname + "-b")


def run_idle(facade: Facade, q: Any, handler: Any, **opts: Any) -> None:
    facade.worker(q, handler, **opts).run_until_idle(timeout_s=30)


def test_waits_for_every_dependency_then_runs_with_their_results(facade, queues, r, backend):
    a, b = queues
    first = a.enqueue({"n": 1})
    other = b.enqueue({"n": 2})
    dep = a.enqueue("after", depends_on=[first, (b.name, other.id)])
    assert dep.status == "waiting_deps"
    assert a.get(dep.id).state == "waiting_deps"
    assert a.counts()["waiting_deps"] == 1 and a.counts()["pending"] == 1
    assert a.job_ids("waiting_deps") == [dep.id]
    seen: Dict[str, Any] = {}

    def handler(job: Any) -> Any:
        seen[job.id] = job.dependency_results()
        return job.payload["n"] * 10 if isinstance(job.payload, dict) else "done"
    run_idle(facade, a, handler)       # the first dependency; the other still outstanding
    assert a.get(dep.id).state == "waiting_deps" and seen[first.id] == {}
    run_idle(facade, b, handler)       # the second: b's worker releases the dependent in a
    assert a.get(dep.id).state == "pending"
    run_idle(facade, a, handler)
    assert a.get(dep.id).state == "completed"
    assert seen[dep.id] == {first.id: 10, other.id: 20}
    assert a.counts()["waiting_deps"] == 0
    assert r.exists(a.keys.job_deps(dep.id), a.keys.job_dependents(first.id),
                    b.keys.job_dependents(other.id), b.keys.outbox, a.keys.outbox) == 0


def test_a_completed_dependency_counts_at_once(facade, queues):
    a, _ = queues
    done = a.enqueue("x")
    run_idle(facade, a, lambda job: "ok")
    ref = a.enqueue("y", depends_on=[done.id])
    assert ref.status == "pending" and a.get(ref.id).state == "pending"
    assert a.counts()["waiting_deps"] == 0


def test_released_jobs_keep_their_own_priority(facade, queues, r):
    a, b = queues
    gate = b.enqueue("gate")
    low = a.enqueue("low", priority=9, depends_on=[(b.name, gate.id)])
    high = a.enqueue("high", priority=1, depends_on=[(b.name, gate.id)])
    plain = a.enqueue("plain", priority=5)
    run_idle(facade, b, lambda job: None)
    order = [i.decode() for i in r.zrange(a.keys.pending, 0, -1)]
    assert order == [high.id, plain.id, low.id]


def test_a_failed_dependency_fails_its_dependents_in_cascade(facade, queues, backend):
    a, b = queues
    root = a.enqueue("boom", attempts=1)
    mid = b.enqueue("mid", depends_on=[(a.name, root.id)])
    leaf = a.enqueue("leaf", depends_on=[(b.name, mid.id)])
    ran: List[str] = []

    def handler(job: Any) -> Any:
        ran.append(job.payload)
        if job.payload == "boom":
            raise RuntimeError("boom")
    run_idle(facade, a, handler)
    run_idle(facade, b, handler)
    run_idle(facade, a, handler)
    assert ran == ["boom"]
    for q, ref in ((b, mid), (a, leaf)):
        job = q.get(ref.id)
        assert (job.state, job.error) == ("failed", "dependency failed")
        assert ref.id in q.job_ids("failed")
    assert a.counts()["waiting_deps"] == b.counts()["waiting_deps"] == 0


def test_on_dep_failure_run_runs_anyway(facade, queues):
    a, _ = queues
    bad = a.enqueue("boom", attempts=1)
    good = a.enqueue("fine")
    after = a.enqueue("after", depends_on=[bad, good], on_dep_failure="run")
    seen: Dict[str, Any] = {}

    def handler(job: Any) -> Any:
        if job.payload == "boom":
            raise RuntimeError("boom")
        seen[job.payload] = job.dependency_results()
        return job.payload
    run_idle(facade, a, handler)
    assert a.get(after.id).state == "completed"
    assert seen["after"] == {bad.id: None, good.id: "fine"}


def test_bad_input_is_typed_and_writes_nothing(facade, queues, r, backend):
    a, b = queues
    known = a.enqueue("known")
    before = (dump_queue(r, a.name), dump_queue(r, b.name))
    cases = [
        (UnknownDependency, dict(depends_on=["JOB-missing"])),
        (UnknownDependency, dict(depends_on=[known, (b.name, "JOB-nope")])),
        (DependencyCycle, dict(depends_on=["JOB-self"], job_id="JOB-self")),
        (InputTypeError, dict(depends_on=known.id)),
        (InputTypeError, dict(depends_on=[42])),
        (InputTypeError, dict(depends_on=(b.name, known.id))),
        (KindError, dict(depends_on=["not-a-job"])),
        (InvalidInput, dict(depends_on=[known], on_dep_failure="maybe")),
        (InvalidInput, dict(depends_on=[known], delay_ms=10)),
        (InvalidInput, dict(depends_on=[known], group="g")),
        (InvalidInput, dict(depends_on=[])),
        (InvalidInput, dict(depends_on=[f"JOB{i}" for i in range(deps.MAX_DEPS + 1)])),
    ]
    for error, opts in cases:
        with pytest.raises(error):
            a.enqueue("x", **opts)
    assert (dump_queue(r, a.name), dump_queue(r, b.name)) == before
    with pytest.raises(UnknownDependency) as info:
        a.enqueue("x", depends_on=[(b.name, "JOB-nope")])
    assert info.value.missing == [(b.name, "JOB-nope")]
    assert isinstance(info.value, emqfast.EmqError)


def test_a_re_sent_enqueue_is_a_duplicate(facade, queues, r):
    a, _ = queues
    dep = a.enqueue("d")
    first = a.enqueue("w", job_id="JOB-w", depends_on=[dep])
    snapshot = dump_queue(r, a.name)
    again = a.enqueue("w", job_id="JOB-w", depends_on=[dep])
    assert (first.status, again.status) == ("waiting_deps", "duplicate")
    assert dump_queue(r, a.name) == snapshot


def _write_unlinked(r: redis.Redis, q: Any, job_id: str, dep_ids: List[str]) -> None:
    """What a producer leaves when it dies after dep_enqueue.lua, before any dep_link.lua."""
    call = deps.write_call(q.keys, Job(job_id, b'"p"', b"j"), b"", 0,
                           [(q.name, d) for d in dep_ids], "fail")
    assert call.script(r, call.keys, call.args) == 1


def test_a_producer_dead_between_write_and_link_is_repaired(facade, queues, r):
    a, _ = queues
    dep = a.enqueue("dep")
    _write_unlinked(r, a, "JOB-orphan", [dep.id])
    assert r.zscore(deps.deplink_key(a.keys), "JOB-orphan") is not None
    run_idle(facade, a, lambda job: "ok")  # the dependency ends: nobody is linked to it
    assert a.get("JOB-orphan").state == "waiting_deps"
    assert a.settle_dependencies().relinked == 0  # within the grace period: left alone
    settled = a.settle_dependencies(grace_ms=0)
    assert settled.relinked == 1 and a.get("JOB-orphan").state == "pending"
    assert r.zcard(deps.deplink_key(a.keys)) == 0


def test_the_next_worker_repairs_unsent_links(facade, queues, r, monkeypatch):
    a, _ = queues
    monkeypatch.setattr(deps, "REPAIR_GRACE_MS", 0)
    dep = a.enqueue("dep")
    _write_unlinked(r, a, "JOB-orphan2", [dep.id])
    ran: List[str] = []
    run_idle(facade, a, lambda job: ran.append(job.id))
    if a.get("JOB-orphan2").state != "completed":  # repaired on a beat after the dep ran
        run_idle(facade, a, lambda job: ran.append(job.id))
    assert ran == [dep.id, "JOB-orphan2"]


def test_every_step_is_safe_to_repeat(facade, queues, r):
    a, b = queues
    dep = b.enqueue("dep")
    waiting = a.enqueue("w", depends_on=[(b.name, dep.id)])
    me = deps.member(a.name, waiting.id)
    link = deps.link_call((b.name, dep.id), me)
    assert [link.script(r, link.keys, link.args) for _ in range(2)] == [b"linked"] * 2
    assert r.hget(b.keys.dependents, dep.id) == b"1"  # counted once
    run_idle(facade, b, lambda job: "r")
    assert r.llen(b.keys.outbox) == 0 and a.get(waiting.id).state == "pending"
    again = deps.resolve_call(a.keys, waiting.id, deps.member(b.name, dep.id), "failed")
    assert again.script(r, again.keys, again.args) == 0  # resolved already: nothing
    assert a.get(waiting.id).state == "pending"
    assert b.settle_dependencies().told == 0


def test_the_dependency_keys_live_in_their_queue_slot(queues):
    a, _ = queues
    for key in (a.keys.waitdeps, a.keys.dependents, a.keys.outbox, a.keys.job_deps("JOB1"),
                a.keys.job_dependents("JOB1"), deps.deplink_key(a.keys)):
        assert key.startswith(f"emq:{{{a.name}}}:")


def test_a_ref_from_another_queue_names_its_queue(facade, queues):
    a, b = queues
    other = b.enqueue("elsewhere")          # a JobRef of queue b, passed as it is
    waiting = a.enqueue("here", depends_on=[other])
    assert waiting.status == "waiting_deps"
    assert a.get(waiting.id).state == "waiting_deps"
    run_idle(facade, b, lambda job: "ok")
    assert a.get(waiting.id).state == "pending"


def test_a_cancelled_or_expired_dependency_fails_its_dependent(facade, queues, r):
    a, b = queues
    cancelled = b.enqueue("never", delay_ms=60_000)
    doomed = a.enqueue("doomed", depends_on=[(b.name, cancelled.id)])
    assert b.cancel(cancelled.id)
    b.settle_dependencies()
    job = a.get(doomed.id)
    assert (job.state, job.error) == ("failed", "dependency failed")
    stale = b.enqueue("stale", expires_ms=1)
    late = a.enqueue("late", depends_on=[(b.name, stale.id)], on_dep_failure="run")
    sec, usec = r.time()
    wait_server_past(r, sec * 1000 + usec // 1000 + 20)
    run_idle(facade, b, lambda job: "never runs")
    assert b.get(stale.id).state == "expired"
    # expiry is no ack: the outbox waits for the next beat of a running worker, or this
    assert r.llen(b.keys.outbox) == 1 and b.settle_dependencies().told == 1
    assert a.get(late.id).state == "pending"   # "run": an expired dependency lets it run


def test_a_re_run_links_what_the_first_run_stored(facade, queues, r):
    a, b = queues
    first, second = b.enqueue("first"), b.enqueue("second")
    call = deps.write_call(a.keys, Job("JOB-rerun", b'"w"', b"j"), b"", 0,
                           [(b.name, first.id)], "fail")  # then the producer died
    assert call.script(r, call.keys, call.args) == 1
    # the re-run names another dependency: the stored one is what gets linked
    again = a.enqueue("w", job_id="JOB-rerun", depends_on=[(b.name, second.id)])
    assert again.status == "duplicate"
    assert r.sismember(b.keys.job_dependents(first.id), deps.member(a.name, "JOB-rerun"))
    assert not r.exists(b.keys.job_dependents(second.id))
    assert r.zscore(deps.deplink_key(a.keys), "JOB-rerun") is None


def test_the_cli_lists_waiting_jobs(redis_url, qname):
    import json as _json

    from test_cli import emq
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    dep = q.enqueue("dep")
    waiting = q.enqueue("w", depends_on=[dep])
    out = emq("--url", redis_url, "jobs", qname, "--state", "waiting_deps", "--json")
    assert out.returncode == 0, out.stderr
    rows = _json.loads(out.stdout)
    assert [(row["id"], row["state"]) for row in rows] == [(waiting.id, "waiting_deps")]


def test_the_sweep_frees_dependents_of_a_job_that_ended_without_the_hook(facade, queues, r):
    a, b = queues
    dep, gone = b.enqueue("dep"), b.enqueue("gone")
    waiting = a.enqueue("w", depends_on=[(b.name, dep.id)], on_dep_failure="run")
    doomed = a.enqueue("d", depends_on=[(b.name, gone.id)])
    # as a move without the finish hook would leave them: ended (or gone), entry still there
    r.hset(b.keys.job(dep.id), "state", "completed")
    r.zrem(b.keys.pending, dep.id, gone.id)
    r.delete(b.keys.job(gone.id))
    settled = b.settle_dependencies()
    assert (settled.swept, settled.told) == (2, 2)
    assert a.get(waiting.id).state == "pending"
    failed = a.get(doomed.id)
    assert (failed.state, failed.error) == ("failed", "dependency failed")
    assert r.hlen(b.keys.dependents) == 0
    assert b.settle_dependencies().swept == 0  # nothing left to find


def test_a_dependency_failed_by_the_reaper_fails_its_dependent(qname, r):
    from engine_util import claim
    a, b = emqfast.Queue(qname + "-a", r), emqfast.Queue(qname + "-b", r)
    dep = b.enqueue("stalls")
    waiting = a.enqueue("w", depends_on=[(b.name, dep.id)])
    [(job_id, _)] = claim(b, "zombie", lease_ms=50)   # a worker that dies holding it
    assert job_id == dep.id
    wait_server_past(r, int(r.zscore(b.keys.active, dep.id)))
    b.reap(max_stalled=0)                           # fails it as stalled
    assert b.get(dep.id).state == "failed"
    b.settle_dependencies()                         # the finish hook's word, or the sweep's
    job = a.get(waiting.id)
    assert (job.state, job.error) == ("failed", "dependency failed")


def test_a_waiting_job_can_be_cancelled_and_its_dependents_follow(facade, queues, r):
    a, b = queues
    dep = b.enqueue("dep")
    waiting = a.enqueue("w", depends_on=[(b.name, dep.id)])
    after = b.enqueue("after", depends_on=[(a.name, waiting.id)])
    call = deps.cancel_waiting_call(a.keys, waiting.id)
    assert call.script(r, call.keys, call.args) == 1
    assert call.script(r, call.keys, call.args) == 0   # not waiting any more: nothing
    job = a.get(waiting.id)
    assert job.state == "cancelled" and waiting.id in a.job_ids("cancelled")
    assert a.counts()["waiting_deps"] == 0 and not r.exists(a.keys.job_deps(waiting.id))
    a.settle_dependencies()                              # its own dependent follows
    assert (b.get(after.id).state, b.get(after.id).error) == ("failed", "dependency failed")
    run_idle(facade, b, lambda job: "ok")                # its dependency ends later: harmless
    assert a.get(waiting.id).state == "cancelled"
