"""Dependencies and outcomes say one thing however they are spelled:

- a flow job that depends on itself, in any spelling (its FlowJob, its id, a
  ``(queue, id)`` pair, a JobRef), is ``DependencyCycle``; a pair naming another job of
  the flow is an edge inside it, never an unknown dependency;
- a job that completed does not keep an earlier attempt's error and traceback;
- ``retry()`` of a job failed because a dependency did not complete is refused
  (``DependencyFailed``, a ``JobStateError``), naming the dependency, nothing written.
"""
from __future__ import annotations

import pytest

import emqfast
from emqfast.core.errors import DependencyCycle, DependencyFailed, JobStateError

from engine_util import claim, complete, fail, make_queue


def _spellings(flow: emqfast.Flow, q: emqfast.Queue, job: emqfast.FlowJob):
    yield "flow job", job
    yield "id", job.id
    yield "pair", (q.name, job.id)
    yield "ref", emqfast.JobRef(job.id, "ref")
    yield "bound ref", q.ref(job.id)


def test_a_flow_self_edge_in_any_spelling_is_a_cycle(redis_url, qname):
    q = make_queue(redis_url, qname)
    flow = emqfast.Flow(q.redis)
    a = flow.add(q, "a")
    for how, spelled in _spellings(flow, q, a):
        with pytest.raises(DependencyCycle):
            flow.depend(a, on=[spelled])
        with pytest.raises(DependencyCycle):  # named in add, before it exists
            flow.add(q, how, job_id=f"JOBself{len(flow)}",
                     after=[(q.name, f"JOBself{len(flow)}")])
    assert q.counts()["pending"] == 0  # nothing was sent


def test_a_pair_naming_a_job_of_the_flow_is_an_edge_inside_it(redis_url, qname):
    q = make_queue(redis_url, qname)
    flow = emqfast.Flow(q.redis)
    a, b = flow.add(q, "a"), flow.add(q, "b")
    flow.depend(a, on=[(q.name, b.id)])  # b was added later: only the flow knows it
    flow.depend(b, on=[a.id])
    with pytest.raises(DependencyCycle):
        flow.enqueue()
    flow2 = emqfast.Flow(q.redis)
    first, then = flow2.add(q, "first"), flow2.add(q, "then")
    flow2.depend(first, on=[(q.name, then.id)])
    refs = flow2.enqueue()
    assert [r.status for r in refs] == ["waiting_deps", "pending"]


def test_a_completed_job_does_not_keep_an_earlier_attempts_error(redis_url, qname):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("x", attempts=2)
    [(job_id, token)] = claim(q, "w", 60_000)
    fail(q, job_id, token, delay=0, error="boom", tb="Traceback: boom")
    assert q.get(job_id).error == "boom"
    [(job_id, token)] = claim(q, "w", 60_000)
    complete(q, job_id, token, b'"ok"')
    job = q.get(ref.id)
    assert (job.state, job.result, job.error, job.traceback) == ("completed", "ok", None,
                                                                 None)


def test_a_worker_completing_a_retry_clears_its_error(redis_url, qname):
    q = make_queue(redis_url, qname)
    ref = q.enqueue("x", attempts=2, backoff=emqfast.Backoff.fixed(0))
    runs = []

    def handler(job: emqfast.Job) -> str:
        runs.append(job.id)
        if len(runs) == 1:
            raise RuntimeError("first attempt fails")
        return "ok"
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    job = q.get(ref.id)
    assert (job.state, job.error, job.traceback) == ("completed", None, None)


def test_retry_of_a_job_failed_by_its_dependency_is_refused(redis_url, qname):
    q = make_queue(redis_url, qname)
    dep = q.enqueue("dep")
    child = q.enqueue("child", depends_on=[dep])
    [(job_id, token)] = claim(q, "w", 60_000)
    fail(q, job_id, token, error="dep broke")
    q.settle_dependencies()
    job = q.get(child.id)
    assert (job.state, job.error) == ("failed", "dependency failed")
    before = q.redis.hgetall(q.keys.job(child.id))
    with pytest.raises(DependencyFailed) as refused:
        q.retry(child.id)
    assert isinstance(refused.value, JobStateError)
    assert dep.id in str(refused.value) and refused.value.dependencies == [(q.name, dep.id)]
    assert q.redis.hgetall(q.keys.job(child.id)) == before
    assert set(q.job_ids("failed")) == {dep.id, child.id}
    q.retry(dep.id)  # the dependency itself can be retried
    assert q.get(dep.id).state == "pending"
