"""A fan-in's results outlive retention, against a real Redis: a dependent released by its
dependencies reads every result at its start even when retention trimmed the dependencies'
records in between (each result is copied into the dependent's hash as it is released).
"""
from __future__ import annotations

from typing import Any, Dict

import redis

import emqfast
from emqfast.core.keys import QueueKeys

PARENTS, OTHERS = 1000, 300


def test_a_released_fan_in_reads_every_result_after_retention_trimmed_its_parents(
        redis_url: str, qname: str, r: redis.Redis) -> None:
    parents_q = emqfast.Queue(qname + "-p", redis.Redis.from_url(redis_url))
    child_q = emqfast.Queue(qname + "-c", redis.Redis.from_url(redis_url))
    parents = parents_q.enqueue_many([{"n": i} for i in range(PARENTS)])
    child = child_q.enqueue("certify", depends_on=parents)
    parents_q.enqueue_many([{"other": i} for i in range(OTHERS)])
    emqfast.Worker(parents_q, lambda job: job.payload).run_until_idle(timeout_s=60)
    parents_q.settle_dependencies()
    assert child_q.get(child.id).state == "pending"  # released, not started
    # the default retention, before the child starts: the 300 oldest completed go
    assert parents_q.trim(keep_completed=1000) == OTHERS
    keys = QueueKeys(parents_q.name)
    gone = sum(not r.exists(keys.job(p.id)) for p in parents)
    assert gone == OTHERS  # the oldest completed are parents: their records are gone
    seen: Dict[str, Any] = {}

    def certify(job: Any) -> str:
        seen.update(job.dependency_results())
        return "ok"
    emqfast.Worker(child_q, certify).run_until_idle(timeout_s=60)
    assert child_q.get(child.id).state == "completed"
    assert seen == {p.id: {"n": i} for i, p in enumerate(parents)}


def test_a_dependent_of_jobs_already_completed_keeps_their_results_past_retention(
        redis_url: str, qname: str, r: redis.Redis) -> None:
    """Enqueued after its dependencies completed, a job is released at once (at link
    time): it takes their results along the same way."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    done = q.enqueue_many([{"n": 1}, {"n": 2}])
    emqfast.Worker(q, lambda job: job.payload).run_until_idle(timeout_s=30)
    child = q.enqueue("after", depends_on=done)
    assert child.status == "pending"
    assert q.trim(keep_completed=0) == 2
    seen: Dict[str, Any] = {}

    def handler(job: Any) -> None:
        seen.update(job.dependency_results())
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    assert seen == {done[0].id: {"n": 1}, done[1].id: {"n": 2}}
