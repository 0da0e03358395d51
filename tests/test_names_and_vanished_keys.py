"""Smaller promises about names and vanished keys:

- a caller's job id obeys the rule names obey: no control characters (NUL, newline, tab,
  DEL...), refused as ``InvalidInput`` before anything is written, on every way a job is
  created (enqueue, enqueue_many, a Flow);
- after a server restart without persistence, a job in hand whose hash vanished is
  reported as the queue's keys being gone (``QueueKeysGone``, a ``LeaseLost``; the message
  names the vanished meta hash and version fence), not as one more lost lease.
"""
from __future__ import annotations

import shutil

import pytest

import emqfast
from emqfast.core.errors import InvalidInput, LeaseLost, QueueKeysGone

from conftest import start_redis_server
from engine_util import claim, complete, fail, make_queue

CONTROL = ["JOB\0x", "JOBa\nb", "JOBa\rb", "JOBa\tb", "JOB\x1b[31m", "JOBx\x7f", "JOBx\x9b"]


@pytest.mark.parametrize("job_id", CONTROL, ids=repr)
def test_a_job_id_with_a_control_character_is_refused_everywhere(redis_url, qname, r, job_id):
    q = make_queue(redis_url, qname)
    with pytest.raises(InvalidInput, match="control characters"):
        q.enqueue("x", job_id=job_id)
    with pytest.raises(InvalidInput, match="control characters"):
        q.enqueue_many(["x"], job_ids=[job_id])
    flow = emqfast.Flow(q.redis)
    with pytest.raises(InvalidInput, match="control characters"):
        flow.add(q, "x", job_id=job_id)
    with pytest.raises(InvalidInput, match="control characters"):  # the same rule as names
        emqfast.Queue("q" + job_id[3:], r)
    assert not r.keys(f"emq:{{{qname}}}:*")


@pytest.fixture
def restartable():
    """A private server without persistence, restartable on its port."""
    proc, port, workdir = start_redis_server()
    box = {"proc": proc}

    def restart() -> None:
        box["proc"].kill()
        box["proc"].wait(10)
        box["proc"], _, _ = start_redis_server(port=port, workdir=workdir)
    yield f"redis://127.0.0.1:{port}/0", restart
    box["proc"].kill()
    box["proc"].wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def test_jobs_in_hand_after_a_restart_without_persistence_say_the_keys_are_gone(
        restartable, qname):
    url, restart = restartable
    q = make_queue(url, qname)
    for n in range(3):
        q.enqueue(n)
    held = claim(q, "w", 60_000, 3)
    restart()
    q = make_queue(url, qname)
    with pytest.raises(QueueKeysGone) as gone:
        complete(q, *held[0])
    assert isinstance(gone.value, LeaseLost)  # its outcome is discarded like a lost lease's
    assert "meta hash and version fence vanished" in str(gone.value)
    with pytest.raises(QueueKeysGone):
        fail(q, *held[1])
    # the queue starts afresh: an enqueue writes its fence again, and a job in hand is
    # still told its keys went (its hash is gone), the fence no longer named
    q.enqueue("new")
    with pytest.raises(QueueKeysGone) as later:
        complete(q, *held[2])
    assert "fence" not in str(later.value)


def test_a_lease_lost_on_a_job_still_there_stays_lease_lost(redis_url, qname):
    q = make_queue(redis_url, qname)
    q.enqueue("x")
    [(job_id, token)] = claim(q, "w", 60_000)
    with pytest.raises(LeaseLost) as lost:
        complete(q, job_id, "not-the-token")
    assert not isinstance(lost.value, QueueKeysGone)


def test_a_worker_says_once_that_its_queues_keys_are_gone(redis_url, qname, r, caplog):
    """A server emptied under a Worker's running jobs (a restart without persistence,
    FLUSHDB): one line says the queue's keys are gone, not one lost lease per job."""
    import threading

    from waiting import wait_until

    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    gate, began = threading.Event(), []

    def handler(job):
        began.append(job.id)
        gate.wait(30)
        return "late"

    refs = [q.enqueue(i) for i in range(3)]
    w = emqfast.Worker(q, handler, concurrency=3, lease_ms=600)  # a beat every 0.15 s
    t = threading.Thread(target=w.run, daemon=True)
    with caplog.at_level("INFO", logger="emqfast"):
        t.start()
        try:
            wait_until(lambda: len(began) == 3, 30, "three jobs running")
            r.flushdb()
            wait_until(lambda: any("are gone" in m for m in caplog.messages), 30,
                       "the queue's keys said gone")
            gate.set()
            wait_until(lambda: w.stats.lease_lost == 3, 30, "their outcomes discarded")
        finally:
            gate.set()
            w.stop()
            t.join(30)
    gone = [m for m in caplog.messages if "are gone" in m]
    assert len(gone) == 1 and repr(q.name) in gone[0], gone
    assert not [m for m in caplog.messages if "lease was lost" in m or "was lost" in m]
    assert all(q.get(ref.id) is None for ref in refs)
