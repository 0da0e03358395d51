"""Where dependencies and waiters meet cancel, delete and the reaper: cancelling or
deleting a job that waits for its dependencies, and a job the reaper fails for good
(stalled) telling its waiters and dependents at once."""
from __future__ import annotations

import threading

import pytest

import emqfast
from engine_util import claim, make_queue, server_ms, wait_server_past
from waiting import wait_until


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


def test_cancel_a_job_waiting_for_its_dependencies(q):
    dep = q.enqueue("grade", delay_ms=3_600_000)
    cert = q.enqueue("certificate", depends_on=[dep])
    assert q.get(cert.id).state == "waiting_deps"
    assert q.cancel(cert.id) is True
    job = q.get(cert.id)
    assert job.state == "cancelled" and q.job_ids("cancelled") == [cert.id]
    counts = q.counts()
    assert counts["waiting_deps"] == 0 and counts["cancelled"] == 1
    assert q.cancel(cert.id) is False  # already cancelled: nothing written
    with pytest.raises(emqfast.Cancelled):
        cert.wait(timeout_s=5)


def test_delete_a_job_waiting_for_its_dependencies_leaves_nothing(q):
    dep = q.enqueue("grade", delay_ms=3_600_000)
    cert = q.enqueue("certificate", depends_on=[dep])
    assert q.delete(cert.id) is True
    assert q.get(cert.id) is None and q.counts()["waiting_deps"] == 0
    assert not q.redis.exists(q.keys.job_deps(cert.id))
    assert q.job_ids("waiting_deps") == []


def test_a_job_failed_by_the_reaper_wakes_its_waiter_and_fails_its_dependents(q):
    stalls = q.enqueue("stalls")
    after = q.enqueue("after", depends_on=[stalls])
    (job_id, _token), = claim(q, "dead-worker", lease_ms=100)
    assert job_id == stalls.id
    box = {}
    waiter = threading.Thread(target=lambda: box.update(
        err=pytest.raises(emqfast.JobFailed, stalls.wait, timeout_s=30)))
    waiter.start()
    # registered before the reap, so it is the hook in reap.lua that wakes it
    wait_until(lambda: q.redis.hexists(q.keys.waiters, stalls.id), what="waiter registered")
    wait_server_past(q.redis, server_ms(q.redis) + 150)
    assert q.reap(max_stalled=0) == (0, 1)
    waiter.join(30)
    assert box["err"].value.error == "stalled"
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    failed = q.get(after.id)
    assert failed.state == "failed" and "dependency failed" in (failed.error or "")


def test_deleting_a_waited_job_ends_the_wait_and_fails_its_dependents(q):
    doomed = q.enqueue("doomed", delay_ms=3_600_000)
    after = q.enqueue("after", depends_on=[doomed])
    box = {}
    waiter = threading.Thread(target=lambda: box.update(
        err=pytest.raises(emqfast.JobNotFound, doomed.wait, timeout_s=30)))
    waiter.start()
    wait_until(lambda: q.redis.hexists(q.keys.waiters, doomed.id), what="waiter registered")
    assert q.delete(doomed.id) is True
    waiter.join(30)
    assert "deleted" in str(box["err"].value)
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    failed = q.get(after.id)
    assert failed.state == "failed" and "dependency failed" in (failed.error or "")
