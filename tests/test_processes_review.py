"""Review tests of the process Worker (``Worker(processes=N)``): races between the
children's readers, the dispatch, the timer and the shutdown, with real processes and a
real Redis. Handlers live in :mod:`proc_review_handlers`."""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

import emqfast
from proc_handlers import read_ledger
from proc_review_handlers import act, deps, kinds
from test_poison_jobs import CORRUPTIONS, _poison
from waiting import wait_until


@pytest.fixture
def ledger(tmp_path):
    return str(tmp_path / "ledger")


def _our_children():
    """Pids of the live (not zombie) handler processes this test process started."""
    out = []
    me = str(os.getpid())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(") ", 1)[1].split()
        if fields[1] == me and fields[0] != "Z" and b"emqfast.worker.child" in cmdline:
            out.append(int(entry.name))
    return out


def test_a_crash_on_the_last_attempt_leaves_no_child_and_no_fatal_error(redis_url, qname):
    """The crash's replacement is still starting when the Worker goes idle and closes the
    pool: it must not outlive the run, nor stop the Worker with HandlerNotImportable."""
    before = set(_our_children())
    q = emqfast.Queue(qname, redis_url)
    w = emqfast.Worker(q, act, processes=1)
    for _ in range(3):
        ref = q.enqueue({"k": "exit"}, attempts=1)
        w.run_until_idle(timeout_s=60, wait_scheduled=True)
        assert q.get(ref.id).state == "failed"
    time.sleep(1.0)  # a replacement that was starting has started by now
    assert set(_our_children()) - before == set()
    ok = q.enqueue({"k": "echo"})
    w.run_until_idle(timeout_s=60, wait_scheduled=True)
    assert q.get(ok.id).state == "completed"


def _begins(ledger, job_id):
    return [row for row in read_ledger(ledger) if row[0] == "begin" and row[1] == job_id]


def test_a_child_that_never_reads_cannot_hold_the_kill_of_its_handler(redis_url, qname,
                                                                       ledger):
    """A handler stuck in a C call that keeps the GIL: its child reads nothing more, so a
    large job sent to its free thread fills the pipe. That send must not hold the timeout,
    the kill, nor the other children's readers."""
    q = emqfast.Queue(qname, redis_url)
    w = emqfast.Worker(q, act, processes=1, concurrency=2, cancel_grace_ms=200)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        stuck = q.enqueue({"k": "gil", "ledger": ledger}, timeout_ms=500, attempts=1)
        wait_until(lambda: _begins(ledger, stuck.id), 60, "the stuck handler began")
        time.sleep(0.2)
        big = q.enqueue({"k": "echo", "pad": "x" * (4 << 20), "ledger": ledger})
        wait_until(lambda: q.get(stuck.id).state == "failed", 20, "the stuck job timed out")
        assert q.get(stuck.id).error.startswith("JobTimeout")
        wait_until(lambda: q.get(big.id).state == "completed", 60, "the big job ran")
    finally:
        w.stop(timeout=1)
        t.join(30)
    assert not t.is_alive()


class _SlowCounts(list):
    """``Worker._ended`` with a wide gap between reading a count and writing it back: two
    threads adding to the same child's count at once lose one's addition."""

    def __getitem__(self, index):
        value = super().__getitem__(index)
        time.sleep(0.1)
        return value


def test_a_recycled_childs_reader_and_its_successors_count_every_ended_run(redis_url,
                                                                           qname):
    """Child ``i``'s ended runs are counted by its reader, and by its successor's reader
    once it is replaced: both may add at once (the old one as its child leaves). A lost
    addition leaves a slot taken for ever: with one slot, the Worker stalls."""
    q = emqfast.Queue(qname, redis_url)
    refs = [q.enqueue({"n": n}) for n in range(15)]
    w = emqfast.Worker(q, act, processes=1, max_jobs_per_child=1)
    w._ended = _SlowCounts(w._ended)
    w.run_until_idle(timeout_s=90, wait_scheduled=True)
    assert [q.get(r.id).state for r in refs] == ["completed"] * len(refs)
    assert w._in_hand == 0


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_poisoned_job_fails_for_good_and_its_handler_never_runs(redis_url, qname, r,
                                                                  ledger, how):
    """A payload that cannot be decoded is a PayloadError before the handler would run,
    as in the thread Worker: never handed to the child as the raw bytes it holds."""
    q = emqfast.Queue(qname, redis_url, attempts=3)
    refs = [q.enqueue({"k": "echo", "n": n, "ledger": ledger}) for n in range(3)]
    _poison(r, q, refs[1].id, how)
    stats = emqfast.Worker(q, act, processes=1).run_until_idle(timeout_s=60)
    assert stats.failed == 1 and stats.retried == 0
    failed = r.hgetall(q.keys.job(refs[1].id))
    assert failed[b"state"] == b"failed" and b"PayloadError" in failed[b"error"], failed
    assert failed[b"attempts"] == b"1"
    assert not _begins(ledger, refs[1].id)
    assert [q.get(refs[n].id).state for n in (0, 2)] == ["completed"] * 2


@pytest.mark.parametrize("stored", [b'{"x": NaN}', b"[1e999]", b'"\\ud800"'])
def test_a_payload_python_decodes_but_would_not_encode_reaches_the_handler(
        redis_url, qname, r, stored):
    """JSON another writer stored that Python reads (NaN, an overflowing number, a lone
    surrogate escape) but emqfast's strict encoder refuses: the handler gets it, as a
    handler thread does; the dispatch neither fails nor strands the job."""
    q = emqfast.Queue(qname, redis_url, attempts=1)
    ref = q.enqueue("placeholder")
    r.hset(q.keys.job(ref.id), "payload", stored)
    after = q.enqueue("after")
    w = emqfast.Worker(q, kinds, processes=1)
    stats = w.run_until_idle(timeout_s=60)
    job = q.get(ref.id)
    assert job.state == "completed", (job.state, job.error)
    assert job.result == type(json.loads(stored)).__name__
    assert q.get(after.id).result == "str" and stats.completed == 2


def test_a_dependency_that_returned_bytes_reaches_its_dependent(redis_url, qname):
    """``job.dependency_results()`` in a child: a dependency's bytes result crosses the
    pipe too (the run message's header is JSON: it cannot hold bytes as they are)."""
    q = emqfast.Queue(qname, redis_url, attempts=1)
    first = q.enqueue(b"\x00\xffraw")
    then = q.enqueue({"after": True}, depends_on=[first.id])
    w = emqfast.Worker(q, deps, processes=1)
    w.run_until_idle(timeout_s=60, wait_scheduled=True)
    assert q.get(first.id).result == b"\x00\xffraw"
    job = q.get(then.id)
    assert job.state == "completed", (job.state, job.error)
    assert job.result == {first.id: ["bytes", "00ff726177"]}


def test_a_cancel_of_a_job_queued_in_a_child_kills_no_handler(redis_url, qname, ledger):
    """Quick handlers: jobs queue in the child behind its busy thread. A cancel of one
    that has not begun stops it as it begins; the grace passing must not kill the child,
    and with it the long handler it runs (which then ran twice)."""
    q = emqfast.Queue(qname, redis_url)
    w = emqfast.Worker(q, act, processes=1, cancel_grace_ms=300)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        warm = [q.enqueue({"n": n}) for n in range(40)]  # quick: jobs queue in the child
        wait_until(lambda: all(q.get(r.id).state == "completed" for r in warm), 60, "warm")
        assert w._procs._queue_depth() > 0
        slow = q.enqueue({"k": "nap", "s": 2.0, "ledger": ledger})
        wait_until(lambda: _begins(ledger, slow.id), 30, "the long handler began")
        queued = q.enqueue({"k": "echo", "ledger": ledger})
        wait_until(lambda: q.get(queued.id).state == "active", 30, "queued in the child")
        assert q.cancel(queued.id) == "requested"
        wait_until(lambda: q.get(slow.id).state == "completed", 30, "the long job ended")
        wait_until(lambda: q.get(queued.id).state == "cancelled", 30, "cancelled")
    finally:
        w.stop()
        t.join(30)
    assert len(_begins(ledger, slow.id)) == 1 and not _begins(ledger, queued.id)
    assert "kill:cancelled" not in w._children_report()["child_events"]


def test_a_child_that_dies_as_it_starts_is_started_again(redis_url, qname, ledger,
                                                         tmp_path, monkeypatch):
    """A replacement killed while it imports (the OOM killer, a stray signal) is not an
    import error: it is started again (with backoff), and the Worker keeps serving."""
    marker = tmp_path / "die-at-start"
    monkeypatch.setenv("EMQ_REVIEW_DIE_AT_START", str(marker))
    q = emqfast.Queue(qname, redis_url)
    w = emqfast.Worker(q, act, processes=1)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        first = q.enqueue({"n": 1})
        wait_until(lambda: q.get(first.id).state == "completed", 60, "the first job ran")
        marker.write_text("")  # the next child started dies as it starts
        crash = q.enqueue({"k": "exit"}, attempts=1)
        wait_until(lambda: q.get(crash.id).state == "failed", 60, "the crash")
        wait_until(lambda: not marker.exists(), 30, "a child died as it started")
        after = q.enqueue({"n": 2})
        wait_until(lambda: q.get(after.id).state == "completed" or not t.is_alive(), 60,
                   "the next job ran")
        assert t.is_alive() and w._fatal is None, w._fatal
    finally:
        w.stop()
        t.join(30)
