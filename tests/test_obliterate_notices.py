"""Nothing outlives its queue: ``q.obliterate()`` ends every ``ref.wait()`` on its jobs
with ``JobNotFound`` (even one without a timeout), and every job of another queue that
depends on one of its jobs fails or runs per its ``on_dep_failure`` instead of waiting
for good. A parent that completed before (its outbox not drained yet) still releases its
dependent with its result."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Dict

import pytest
import redis

import emqfast
import emqfast.aio
from emqfast.core.errors import JobNotFound

from engine_util import claim, complete, make_queue
from waiting import wait_until, wait_until_async


def _waiting(r: redis.Redis, q: Any, n: int = 1) -> bool:
    return len(r.hkeys(q.keys.waiters)) >= n


def test_a_wait_without_timeout_ends_when_its_queue_is_obliterated(redis_url, qname, r):
    q = make_queue(redis_url, qname)
    refs = [q.enqueue("x"), q.enqueue_in("later", 3_600_000)]
    outcome: Dict[str, Any] = {}

    def wait(ref) -> None:
        try:
            outcome[ref.id] = ref.wait()  # no timeout: only its end ends it
        except BaseException as exc:  # noqa: BLE001 - inspected below
            outcome[ref.id] = exc
    threads = [threading.Thread(target=wait, args=(ref,), daemon=True) for ref in refs]
    for t in threads:
        t.start()
    wait_until(lambda: _waiting(r, q, 2), what="both waits registered")
    assert q.obliterate() > 0
    wait_until(lambda: len(outcome) == 2, what="the waits to end after obliterate")
    assert all(isinstance(e, JobNotFound) for e in outcome.values()), outcome
    assert not r.keys(f"emq:{{{qname}}}:*")
    with pytest.raises(JobNotFound):  # a wait started afterwards: at once
        refs[0].wait()


def test_an_asyncio_wait_ends_when_its_queue_is_obliterated(redis_url, qname, r):
    async def main() -> BaseException:
        q = emqfast.aio.Queue(qname, redis.asyncio.Redis.from_url(redis_url))
        ref = await q.enqueue("x")
        task = asyncio.create_task(ref.wait())
        await wait_until_async(lambda: _waiting(r, q), 15, "the wait registered")
        await q.obliterate()
        try:
            await asyncio.wait_for(task, 15)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            return exc
        raise AssertionError("the wait returned a result for an obliterated job")
    assert isinstance(asyncio.run(main()), JobNotFound)


def test_dependents_on_other_queues_are_settled_when_a_parent_queue_is_obliterated(
        redis_url, qname, r):
    parents = make_queue(redis_url, qname + "-parents")
    children = make_queue(redis_url, qname + "-children")
    done_parent = parents.enqueue("ran")
    open_parent = parents.enqueue("never run")
    fails = children.enqueue("f", depends_on=[open_parent])
    runs = children.enqueue("r", depends_on=[open_parent], on_dep_failure="run")
    released = children.enqueue("d", depends_on=[done_parent])
    local = parents.enqueue("same queue", depends_on=[open_parent])
    # the completed parent's outbox entry is not drained yet (no Worker, no settle)
    [(job_id, token)] = claim(parents, "w", 60_000, 1)
    assert job_id == done_parent.id
    complete(parents, job_id, token, b'"parent result"')
    assert {children.get(j).state for j in (fails.id, runs.id, released.id)} == \
        {"waiting_deps"}

    parents.obliterate()
    children.settle_dependencies()
    parents.settle_dependencies()
    failed = children.get(fails.id)
    assert (failed.state, failed.error) == ("failed", "dependency failed")
    assert children.get(runs.id).state == "pending"
    assert children.get(released.id).state == "pending"
    assert not r.keys(f"emq:{{{parents.name}}}:*")
    assert parents.get(local.id) is None
    got: Dict[str, Any] = {}

    def handler(job: emqfast.Job) -> None:
        got[job.id] = job.dependency_results()
    emqfast.Worker(children, handler).run_until_idle(timeout_s=30)
    assert got == {runs.id: {open_parent.id: None},
                   released.id: {done_parent.id: "parent result"}}
