"""Flows: ``emqfast.Flow`` / ``emqfast.aio.Flow`` admit a DAG of jobs across
queues in topological order, so no job runs while a dependency is missing; a re-run after a
crash completes the same graph; cycles, unknown dependencies and wrong types are typed
errors that write nothing. Real Redis, both facades."""
from __future__ import annotations

from typing import Any

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from emqfast.core.errors import DependencyCycle, InputTypeError, InvalidInput, UnknownDependency
from emqfast.facade import deps
from test_contract_facades import Facade, _Blocking


class Killed(Exception):
    """Stands for the producer dying at that point (raised inside the operation)."""


@pytest.fixture(params=["sync", "async"])
def facade(request, redis_url):
    f = Facade(request.param, redis_url)
    yield f
    f.close()


def make_flow(facade: Facade) -> Any:
    if facade._loop is None:
        return emqfast.Flow(facade.url)
    return _Blocking(emqfast.aio.Flow(emqfast.aio.connect(facade.url)), facade._loop)


@pytest.fixture
def queues(facade, qname):
    return facade.queue(qname + "-lessons"), facade.queue(qname + "-certs")


def _recording(r: Any, log_key: str) -> Any:
    def handler(job: Any) -> Any:
        r.rpush(log_key, job.payload["name"])
        return {"name": job.payload["name"], "deps": sorted(job.dependency_results())}
    return handler


def test_a_flow_runs_each_job_after_its_dependencies(facade, queues, r, qname):
    lessons, certs = queues
    flow = make_flow(facade)
    grades = [flow.add(lessons, {"name": f"grade{i}"}) for i in range(3)]
    cert = flow.add(certs, {"name": "certificate"}, after=grades)
    mail = flow.add(lessons, {"name": "mail"}, after=[cert], priority=3)
    refs = flow.enqueue()
    assert [ref.id for ref in refs] == [g.id for g in grades] + [cert.id, mail.id]
    assert [ref.status for ref in refs] == ["pending"] * 3 + ["waiting_deps"] * 2
    assert certs.get(cert.id).state == lessons.get(mail.id).state == "waiting_deps"
    log_key = f"log:{qname}"
    handler = _recording(r, log_key)
    facade.worker(lessons, handler).run_until_idle(timeout_s=30)
    facade.worker(certs, handler).run_until_idle(timeout_s=30)
    facade.worker(lessons, handler).run_until_idle(timeout_s=30)
    order = [x.decode() for x in r.lrange(log_key, 0, -1)]
    assert sorted(order[:3]) == ["grade0", "grade1", "grade2"]
    assert order[3:] == ["certificate", "mail"]
    assert certs.get(cert.id).result == {"name": "certificate",
                                         "deps": sorted(g.id for g in grades)}
    r.delete(log_key)


def test_a_re_run_admits_the_same_graph_and_nothing_twice(facade, queues, r):
    lessons, certs = queues
    flow = make_flow(facade)
    a = flow.add(lessons, {"name": "a"})
    flow.add(certs, {"name": "b"}, after=[a])
    flow.enqueue()
    snapshot = (dump_queue(r, lessons.name), dump_queue(r, certs.name))
    again = flow.enqueue()
    assert [ref.status for ref in again] == ["duplicate", "duplicate"]
    assert (dump_queue(r, lessons.name), dump_queue(r, certs.name)) == snapshot


def test_a_crash_part_way_leaves_no_job_runnable_early_and_a_re_run_completes(
        facade, queues, r, monkeypatch, qname):
    lessons, certs = queues
    flow = make_flow(facade)
    a = flow.add(lessons, {"name": "a"})
    b = flow.add(certs, {"name": "b"}, after=[a])
    c = flow.add(lessons, {"name": "c"}, after=[b])
    real = deps.link_call

    def crash(dep: Any, dependent: str) -> Any:  # the producer dies before linking b
        raise Killed("killed between the write and the links")
    monkeypatch.setattr(deps, "link_call", crash)
    with pytest.raises(Killed):
        flow.enqueue()
    monkeypatch.setattr(deps, "link_call", real)
    assert lessons.get(a.id).state == "pending"
    assert certs.get(b.id).state == "waiting_deps"   # written, unlinked: cannot run
    assert lessons.get(c.id) is None                 # never written
    log_key = f"log:{qname}"
    handler = _recording(r, log_key)
    facade.worker(lessons, handler).run_until_idle(timeout_s=30)
    assert certs.get(b.id).state == "waiting_deps"   # a ran; b not linked to it yet
    refs = flow.enqueue()                            # the re-run completes the graph
    assert [ref.status for ref in refs] == ["duplicate", "duplicate", "waiting_deps"]
    assert certs.get(b.id).state == "pending"        # its link found a done: released
    facade.worker(certs, handler).run_until_idle(timeout_s=30)
    facade.worker(lessons, handler).run_until_idle(timeout_s=30)
    assert [x.decode() for x in r.lrange(log_key, 0, -1)] == ["a", "b", "c"]
    r.delete(log_key)


def test_cycles_unknown_dependencies_and_wrong_types_write_nothing(facade, queues, r):
    lessons, certs = queues
    known = lessons.enqueue({"name": "known"})
    before = (dump_queue(r, lessons.name), dump_queue(r, certs.name))
    flow = make_flow(facade)
    a = flow.add(lessons, {"name": "a"})
    b = flow.add(certs, {"name": "b"}, after=[a, known])
    flow.depend(a, [b])                      # closes the cycle a -> b -> a
    with pytest.raises(DependencyCycle):
        flow.enqueue()
    lone = make_flow(facade)
    lone.add(lessons, {"name": "x"}, after=[(certs.name, "JOB-missing")])
    with pytest.raises(UnknownDependency):
        lone.enqueue()
    assert (dump_queue(r, lessons.name), dump_queue(r, certs.name)) == before
    other = make_flow(facade)
    foreign = other.add(lessons, {"name": "f"})
    with pytest.raises(InputTypeError):
        flow.add("not a queue", {"name": "x"})
    with pytest.raises(InputTypeError):
        flow.add(lessons, {"name": "x"}, after=a.id)
    with pytest.raises(InvalidInput):
        flow.depend(foreign, [a])
    with pytest.raises(InvalidInput):
        flow.add(lessons, {"name": "x"}, job_id=a.id)
    with pytest.raises(InvalidInput):
        flow.add(lessons, {"name": "x"}, on_dep_failure="later")
    assert (dump_queue(r, lessons.name), dump_queue(r, certs.name)) == before


def test_the_admission_order_is_topological_for_edges_added_later(facade, queues):
    lessons, _ = queues
    flow = make_flow(facade)
    first = flow.add(lessons, {"name": "first"})
    second = flow.add(lessons, {"name": "second"})
    flow.depend(first, [second])             # first now waits for a job added after it
    order = flow.order()
    assert order == [1, 0]
    refs = flow.enqueue()
    assert [ref.status for ref in refs] == ["waiting_deps", "pending"]


def test_a_wide_flow_goes_in_pipelined_rounds(redis_url, qname, r):
    from emqfast.facade import flow as flow_mod
    a, b = emqfast.Queue(qname + "-a", r), emqfast.Queue(qname + "-b", r)
    flow = emqfast.Flow(redis_url)
    width = flow_mod.ADMIT_CHUNK + 100       # a round spans two pipelines
    roots = [flow.add(a, {"name": f"r{i}"}) for i in range(width)]
    mids = [flow.add(b, {"name": f"m{i}"}, after=[roots[i], roots[(i + 1) % width]])
            for i in range(width)]
    top = flow.add(a, {"name": "top"}, after=mids)
    assert [len(level) for level in flow.levels()] == [width, width, 1]
    refs = flow.enqueue()
    assert {ref.status for ref in refs[:width]} == {"pending"}
    assert {ref.status for ref in refs[width:]} == {"waiting_deps"}
    assert b.counts()["waiting_deps"] == width and r.zcard(
        deps.deplink_key(b.keys)) == 0
    log_key = f"log:{qname}"
    handler = _recording(r, log_key)
    for q in (a, b, a):
        emqfast.Worker(q, handler, concurrency=8).run_until_idle(timeout_s=60)
    assert a.get(top.id).state == "completed"
    assert r.lrange(log_key, -1, -1) == [b"top"] and r.llen(log_key) == 2 * width + 1
    r.delete(log_key)


def test_a_refused_edge_list_adds_no_edge(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    flow = emqfast.Flow(redis_url)
    a, b = flow.add(q, 1), flow.add(q, 2)
    with pytest.raises(InputTypeError):
        flow.depend(a, [b, 42])              # the bad item refuses the whole list
    with pytest.raises(InputTypeError):
        flow.depend(a, 7)
    assert flow.levels() == [[0, 1]]          # b did not become a's dependency
