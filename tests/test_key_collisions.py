"""Job ids and the keys derived from them never meet, against a real Redis.

A job's dependency sets extend its hash key: ``emq:{q}:job:<id>:deps`` (what it waits on)
and ``emq:{q}:job:<id>:dependents`` (who waits on it). A caller's id holding a ``:`` could
name one of another job's sets, so ids of new jobs never hold one: the facades refuse it
(``InvalidInput``) and so does every script that creates a job (``EMQINPUT``), before
anything is written. A deps set key that holds another type already is refused before the
dependent's hash is written.
"""
from __future__ import annotations

from typing import Any, Callable, List

import pytest

import emqfast
from conftest import dump_queue
from emqfast.backends import scripts
from emqfast.core.errors import InvalidInput, KeyTypeConflict
from emqfast.core.keys import QueueKeys
from emqfast.core.version import KEYSPACE_VERSION
from emqfast.facade.deps import deplink_key
from test_contract_facades import Facade


@pytest.fixture(params=["sync", "async"])
def facade(request, redis_url):
    f = Facade(request.param, redis_url)
    yield f
    f.close()


def _collision(suffix: str, parent: str, child: str) -> str:
    """The id that names a set of the pair: the child's deps, or the parent's dependents."""
    return (child if suffix == ":deps" else parent) + suffix


def _run_all(facade: Facade, q: Any) -> List[Any]:
    seen: List[Any] = []

    def handler(job: Any) -> Any:
        seen.append((job.id, job.dependency_results()))
        return job.payload
    facade.worker(q, handler).run_until_idle(timeout_s=30)
    return seen


@pytest.mark.parametrize("suffix", [":deps", ":dependents"])
def test_an_id_naming_a_set_of_jobs_already_linked_is_refused_and_writes_nothing(
        facade, qname, r, suffix):
    """JOBp, then JOBc depending on it, then an id naming one of their sets: refused with
    InvalidInput (it used to answer "duplicate" and drop the job), Redis untouched, and
    the pair still runs as linked."""
    q = facade.queue(qname)
    keys = QueueKeys(qname)
    q.enqueue("p", job_id="JOBp")
    child = q.enqueue("c", job_id="JOBc", depends_on=["JOBp"])
    assert child.status == "waiting_deps"
    before = dump_queue(r, qname)
    with pytest.raises(InvalidInput, match="':'"):
        q.enqueue("intruder", job_id=_collision(suffix, "JOBp", "JOBc"))
    assert dump_queue(r, qname) == before
    assert r.type(keys.job_deps("JOBc")) == b"set"
    assert r.type(keys.job_dependents("JOBp")) == b"set"
    assert _run_all(facade, q) == [("JOBp", {}), ("JOBc", {"JOBp": "p"})]


@pytest.mark.parametrize("suffix", [":deps", ":dependents"])
def test_an_id_naming_a_set_of_jobs_to_come_is_refused_and_they_link_and_run(
        facade, qname, r, suffix):
    """The other order: the id naming a set first is refused with nothing written (it used
    to be admitted, and JOBc's enqueue then raised KeyTypeConflict after JOBc's hash was
    written, so JOBc waited for good); JOBp and JOBc then link and run."""
    q = facade.queue(qname)
    keys = QueueKeys(qname)
    with pytest.raises(InvalidInput, match="':'"):
        q.enqueue("intruder", job_id=_collision(suffix, "JOBp", "JOBc"))
    assert dump_queue(r, qname) == {}
    q.enqueue("p", job_id="JOBp")
    child = q.enqueue("c", job_id="JOBc", depends_on=["JOBp"])
    assert child.status == "waiting_deps"
    assert r.smembers(keys.job_deps("JOBc")) == {f"{qname}\0JOBp".encode()}
    assert _run_all(facade, q) == [("JOBp", {}), ("JOBc", {"JOBp": "p"})]
    assert q.get("JOBc").state == "completed"


def test_every_way_to_name_a_new_job_refuses_a_colon(redis_url, qname, r):
    """enqueue, enqueue_many's job_ids and Flow.add refuse an id with ':' before sending;
    looking a job up by such an id stays allowed (it finds nothing)."""
    q = emqfast.Queue(qname, r)
    bad = "JOBx:deps"
    calls: List[Callable[[], Any]] = [
        lambda: q.enqueue(1, job_id=bad),
        lambda: q.enqueue(1, job_id=bad, group="g"),
        lambda: q.enqueue_many([1, 2], job_ids=["JOBok", bad]),
        lambda: emqfast.Flow(r).add(q, 1, job_id=bad),
    ]
    for call in calls:
        with pytest.raises(InvalidInput, match="':'"):
            call()
    assert dump_queue(r, qname) == {}
    assert q.get(bad) is None


def _enqueue_call(keys: QueueKeys, job_id: str) -> tuple:
    return ("enqueue", [keys.job(job_id), keys.pending, keys.delayed, keys.marker, keys.meta,
                        keys.counter, keys.events],
            [job_id, "1", "j", "", "0", "now", "0", KEYSPACE_VERSION, "1"])


def _enqueue_group_call(keys: QueueKeys, job_id: str) -> tuple:
    return ("enqueue_group", [keys.job(job_id), keys.group_pending("g"), keys.delayed,
                              keys.marker, keys.meta, keys.counter, keys.events, keys.groups],
            [job_id, "1", "j", "", "0", "now", "0", KEYSPACE_VERSION, "g", "1"])


def _enqueue_many_call(keys: QueueKeys, job_id: str) -> tuple:
    return ("enqueue_many", [keys.pending, keys.delayed, keys.marker, keys.meta, keys.counter,
                             keys.events, keys.job("JOBok"), keys.job(job_id)],
            [KEYSPACE_VERSION, "1", "", "0", "now", "0", "j", "JOBok", "1", job_id, "2"])


def _dep_enqueue_call(keys: QueueKeys, job_id: str) -> tuple:
    return ("dep_enqueue", [keys.job(job_id), keys.waitdeps, keys.job_deps(job_id),
                            deplink_key(keys), keys.meta, keys.counter, keys.events],
            [job_id, "1", "j", "", "0", "fail", KEYSPACE_VERSION, f"{keys.name}\0JOBp"])


@pytest.mark.parametrize("call", [_enqueue_call, _enqueue_group_call, _enqueue_many_call,
                                  _dep_enqueue_call], ids=lambda c: c.__name__[1:-5])
def test_the_scripts_refuse_a_colon_in_a_new_id_before_any_write(qname, r, call):
    """A caller speaking the protocol directly (docs/protocol.md) meets the same rule:
    EMQINPUT, and the queue has no key at all."""
    name, keys, args = call(QueueKeys(qname), "JOBp:dependents")
    with pytest.raises(InvalidInput, match="':'"):
        scripts.load(name)(r, keys, args)
    assert dump_queue(r, qname) == {}


def test_a_deps_set_key_of_another_type_is_refused_before_the_job_is_written(
        redis_url, qname, r):
    """A hash already sitting where JOBc's deps set goes (a job an id with ':' made, or a
    foreign writer): enqueue with depends_on raises KeyTypeConflict and JOBc is not
    written, so no half-made job waits for good."""
    q = emqfast.Queue(qname, r)
    keys = q.keys
    q.enqueue("p", job_id="JOBp")
    r.hset(keys.job_deps("JOBc"), mapping={"payload": "1", "state": "pending"})
    before = dump_queue(r, qname)
    with pytest.raises(KeyTypeConflict):
        q.enqueue("c", job_id="JOBc", depends_on=["JOBp"])
    assert dump_queue(r, qname) == before
    assert not r.exists(keys.job("JOBc"))
