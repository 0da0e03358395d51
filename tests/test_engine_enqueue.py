"""Engine contract: job ids, delayed and priority scores, enqueue_in on the server clock,
promotion. Everything runs against the real redis-server from conftest."""
from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

import emqfast
from conftest import dump_queue
from emqfast.backends.select import impl as backend_impl
from emqfast.core import ids
from emqfast.core.scores import EPOCH_MS, MAX_OFFSET_MS, MAX_RUN_AT_MS, PRIORITY_MAX
from emqfast.core.errors import EmqError, InvalidInput, KindError, RangeError
from engine_util import skewed_local_clock  # noqa: F401 (fixture)
from engine_util import make_queue, server_ms, wait_server_past
from waiting import wait_until


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


def _ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def _run_order(q: emqfast.Queue) -> list:
    """Ids in the order a single worker actually claims and runs them."""
    seen = []
    emqfast.Worker(q, lambda job: seen.append(job.id), concurrency=1,
                   batch_size=1).run_until_idle(timeout_s=30)
    return seen


# --- ids ------------------------------------------------------------------------

def test_minted_ids_are_branded_and_sort_by_mint_time():
    first = ids.new_id()
    assert abs(ids.mint_time_ms(first) - time.time() * 1000) < 5_000
    # the next local millisecond: a later mint must sort after
    wait_until(lambda: time.time_ns() // 1_000_000 > ids.mint_time_ms(first),
               what="the local clock to pass the first id's millisecond")
    later = ids.new_id()
    batch = ids.new_ids(500)
    minted = [first, later, *batch]
    assert all(i.startswith("JOB") for i in minted)
    assert minted == sorted(minted)
    assert len(set(minted)) == len(minted)
    assert ids.mint_time_ms(first) < ids.mint_time_ms(later) <= ids.mint_time_ms(batch[0])


def test_enqueue_mints_branded_ids_in_order(q):
    refs = [q.enqueue(i) for i in range(20)] + q.enqueue_many(range(20))
    assert all(ref.id.startswith("JOB") and ref.status == "pending" for ref in refs)
    assert [ref.id for ref in refs] == sorted(ref.id for ref in refs)


def test_job_ids_unique_across_threads():
    per_thread = 12_500
    results = [None] * 8
    barrier = threading.Barrier(8)

    def mint(slot):
        barrier.wait()
        results[slot] = [ids.new_id() for _ in range(per_thread)]

    threads = [threading.Thread(target=mint, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for chunk in results for i in chunk]
    assert len(everything) == 100_000
    assert len(set(everything)) == 100_000
    for chunk in results:
        assert chunk == sorted(chunk)


@pytest.mark.parametrize("bad", ["job-1", "XJOB1", "", "J0B1", "JO"])
def test_caller_id_without_brand_is_kind_error(r, q, qname, bad):
    q.enqueue("seed")
    before = dump_queue(r, qname)
    with pytest.raises(KindError):
        q.enqueue("x", job_id=bad)
    with pytest.raises(KindError):
        q.enqueue_many(["x"], job_ids=[bad])
    assert dump_queue(r, qname) == before


def test_existing_id_is_an_idempotent_duplicate(r, q, qname):
    first = q.enqueue({"v": 1}, job_id="JOB-order-17", priority=3)
    assert first == emqfast.JobRef("JOB-order-17", "pending")
    q.enqueue_in("parked", 60_000, job_id="JOB-order-18")
    before = dump_queue(r, qname)
    again = q.enqueue({"v": 2}, job_id="JOB-order-17", priority=0, attempts=9)
    delayed = q.enqueue_in({"v": 3}, 5_000, job_id="JOB-order-17")
    many = q.enqueue_many([{"v": 4}, {"v": 5}], job_ids=["JOB-order-17", "JOB-order-18"])
    assert again.duplicate and delayed.duplicate and all(m.duplicate for m in many)
    assert again.status == "duplicate"
    assert dump_queue(r, qname) == before  # stored jobs (and everything else) unchanged
    job = q.get("JOB-order-17")
    assert (job.payload, job.priority, job.state) == ({"v": 1}, 3, "pending")


def test_finished_job_id_is_still_a_duplicate(q):
    ref = q.enqueue("once", job_id="JOB-unique-run")
    emqfast.Worker(q, lambda job: "ok").run_until_idle(timeout_s=20)
    assert q.get(ref.id).state == "completed"
    assert q.enqueue("twice", job_id=ref.id).duplicate
    assert q.get(ref.id).payload == "once"


# --- delayed scores ----------------------------------------------------------------

def test_delayed_score_layout(r, q, backend):
    run_at = server_ms(r) + 3_600_000
    ref = q.enqueue_at("x", run_at)
    assert ref.status == "scheduled"
    score = int(r.zscore(q.keys.delayed, ref.id))
    assert score >> 12 == run_at - EPOCH_MS
    assert backend_impl().unpack_delayed(score)[0] == run_at
    assert q.get(ref.id).run_at_ms == run_at
    assert q.next_due_ms() == run_at


def test_same_millisecond_keeps_arrival_order(r, q, backend):
    run_at = server_ms(r) + 3_600_000
    one_by_one = [q.enqueue_at(i, run_at).id for i in range(5)]
    batch = [ref.id for ref in q.enqueue_many(range(40), run_at_ms=run_at)]
    assert q.job_ids("scheduled") == one_by_one + batch
    assert {int(s) >> 12 for _, s in r.zrange(q.keys.delayed, 0, -1, withscores=True)} \
        == {run_at - EPOCH_MS}


def test_same_millisecond_order_survives_sequence_wrap(r, q, backend):
    """The 12-bit sequence must not wrap inside one millisecond's group: push the queue's
    arrival counter just below a multiple of 4096, then park a group due the same ms."""
    q.enqueue_many(range(4090))
    run_at = server_ms(r) + 3_600_000
    group = [ref.id for ref in q.enqueue_many(range(12), run_at_ms=run_at)]
    assert int(r.get(q.keys.counter)) > 4096  # the counter did cross the wrap
    assert q.job_ids("scheduled") == group


def test_run_at_in_2045_is_exact(r, q, backend):
    run_at = _ms(datetime(2045, 6, 1, 12, 30, 45, 123000, tzinfo=timezone.utc))
    # the naive epoch-ms * 4096 would already be inexact as a double
    assert run_at * 4096 > 2 ** 53
    ref = q.enqueue_at({"far": True}, run_at)
    score = r.zscore(q.keys.delayed, ref.id)
    assert score == float(int(score)) and int(score) < 2 ** 53
    unpacked, seq = backend_impl().unpack_delayed(int(score))
    assert unpacked == run_at and 0 <= seq < 4096
    assert q.get(ref.id).run_at_ms == run_at
    assert q.next_due_ms() == run_at
    # the pure packing agrees with what Lua stored
    assert backend_impl().pack_delayed(run_at, seq) == int(score)


def test_last_representable_run_at_is_exact(r, q, backend):
    ref = q.enqueue_at("edge", MAX_RUN_AT_MS)
    score = int(r.zscore(q.keys.delayed, ref.id))
    assert score <= 2 ** 53 - 1
    assert backend_impl().unpack_delayed(score)[0] == MAX_RUN_AT_MS
    assert q.next_due_ms() == MAX_RUN_AT_MS


def test_run_at_beyond_range_is_range_error(r, q, qname, backend):
    q.enqueue("seed")
    q.enqueue_in("parked", 1000)
    before = dump_queue(r, qname)
    with pytest.raises(RangeError):
        q.enqueue_at("x", MAX_RUN_AT_MS + 1)
    with pytest.raises(RangeError):
        q.enqueue_many(["x", "y"], run_at_ms=MAX_RUN_AT_MS + 1)
    # a delay inside the Python bound whose server-side run-at is past the range
    with pytest.raises(RangeError):
        q.enqueue_in("x", MAX_OFFSET_MS)
    with pytest.raises(RangeError):
        q.enqueue_many(["x", "y"], delay_ms=MAX_OFFSET_MS)
    assert dump_queue(r, qname) == before


def test_past_run_at_is_pending_at_once(r, q):
    ref = q.enqueue_at("late", server_ms(r) - 10_000)
    zero = q.enqueue_in("now", 0)
    assert q.get(ref.id).state == "pending" and q.get(zero.id).state == "pending"
    assert (ref.status, zero.status) == ("pending", "pending")
    assert q.job_ids("pending") == [ref.id, zero.id]


# --- priority scores ----------------------------------------------------------------

def test_priority_score_layout(r, q, backend):
    ref = q.enqueue("x", priority=7)
    counter = int(r.get(q.keys.counter))
    score = int(r.zscore(q.keys.pending, ref.id))
    assert score == 7 * 2 ** 32 + counter % 2 ** 32
    assert backend_impl().unpack_priority(score) == (7, counter % 2 ** 32)
    top = q.enqueue("y", priority=PRIORITY_MAX)
    top_score = int(r.zscore(q.keys.pending, top.id))
    assert top_score < 2 ** 53 and top_score >> 32 == PRIORITY_MAX


def test_lower_priority_runs_first_and_zero_is_not_special(q, backend):
    """One ordering rule: (priority, arrival). Priority 0 is simply the best tier: a 0
    enqueued after priority-5 jobs runs before them, and it never jumps ahead of an
    earlier job of its own tier (BullMQ's "no priority overtakes everything")."""
    plan = [("a", 5), ("b", 5), ("c", 1), ("d", 0), ("e", 2), ("f", 0), ("g", 1),
            ("h", PRIORITY_MAX), ("i", 0)]
    names = {q.enqueue(name, priority=prio).id: name for name, prio in plan}
    names.update(zip((ref.id for ref in q.enqueue_many(["j", "k"], priority=0)), "jk"))
    order = [names[i] for i in _run_order(q)]
    assert order == ["d", "f", "i", "j", "k", "c", "g", "e", "a", "b", "h"]


@pytest.mark.parametrize("bad, exc", [(-1, RangeError), (2 ** 21, RangeError),
                                      (True, InvalidInput), (1.0, InvalidInput),
                                      ("1", InvalidInput), (None, InvalidInput)])
def test_priority_out_of_range_is_typed(r, q, qname, backend, bad, exc):
    q.enqueue("seed")
    before = dump_queue(r, qname)
    with pytest.raises(exc) as info:
        q.enqueue("x", priority=bad)
    assert isinstance(info.value, EmqError)
    with pytest.raises(exc):
        q.enqueue_many(["x"], priority=bad)
    assert dump_queue(r, qname) == before


# --- the server clock -------------------------------------------------------------

def test_enqueue_in_is_measured_on_the_server_clock(r, q, skewed_local_clock):
    before = q.server_time_ms()
    ref = q.enqueue_in({"x": 1}, 5_000)
    many = q.enqueue_many([1, 2], delay_ms=5_000)
    after = q.server_time_ms()
    assert abs(time.time() * 1000 - after) > skewed_local_clock / 2  # the skew is live
    for job_id in [ref.id, *(m.id for m in many)]:
        job = q.get(job_id)
        assert job.state == "scheduled"
        assert before + 5_000 <= job.run_at_ms <= after + 5_000
        assert before <= job.created_ms <= after
        score = int(r.zscore(q.keys.delayed, job_id))
        assert backend_impl().unpack_delayed(score)[0] == job.run_at_ms


def test_promote_releases_due_jobs_in_batches_and_mint_order(r, q, skewed_local_clock):
    base = q.server_time_ms() + 300
    # due in *reverse* arrival order: promotion must restore arrival (mint) order
    due = [q.enqueue_at(i, base + 10 * (7 - i)).id for i in range(8)]
    future = [q.enqueue_at("later", base + 3_600_000).id for _ in range(3)]
    mixed = q.enqueue_at("tier-0 late", base, priority=0)
    urgent = q.enqueue("urgent", priority=1)
    moved = q.promote()
    if q.server_time_ms() < base:  # (unless this machine stalled 300 ms) nothing was due
        assert moved == 0
    wait_server_past(r, base + 70)
    batches = []
    while True:
        moved = q.promote(limit=3)
        if not moved:
            break
        batches.append(moved)
    assert batches == [3, 3, 3]
    assert q.job_ids("pending") == [*due, mixed.id, urgent.id]
    assert q.job_ids("scheduled") == future
    assert all(q.get(i).state == "pending" for i in due)
    assert all(q.get(i).state == "scheduled" for i in future)
