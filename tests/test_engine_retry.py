"""Engine contract: retries with backoff, the failed set, Unrecoverable, Queue.retry."""
from __future__ import annotations

import pytest

import emqfast
from emqfast import Backoff, Unrecoverable
from emqfast.core.errors import InvalidInput
from emqfast.core.scores import MAX_RUN_AT_MS
from engine_util import make_queue, server_ms

SEEDS = range(0, 4000, 7)


# --- the policies (pure arithmetic, both backends) -------------------------------------

def test_exponential_with_cap(backend):
    b = Backoff.exponential(100, cap=10_000)
    assert [b.delay_ms(a) for a in (1, 2, 3, 7, 8, 20, 10_000)] == \
        [100, 200, 400, 6_400, 10_000, 10_000, 10_000]


def test_fixed(backend):
    assert {Backoff.fixed(250).delay_ms(a) for a in (1, 2, 50)} == {250}
    assert Backoff.fixed(0).delay_ms(3) == 0


def test_proportional_jitter_band(backend):
    b = Backoff.exponential(1000, jitter=0.2)
    draws = [b.delay_ms(3, seed=s) for s in SEEDS]
    assert all(3200 <= d <= 4800 for d in draws)
    assert min(draws) < 3400 and max(draws) > 4600  # it really spreads over the band
    assert all(b.delay_ms(3, seed=s) == d for s, d in zip(SEEDS, draws))  # seeded: stable


def test_full_jitter(backend):
    inner = Backoff.exponential(1000, cap=60_000)
    b = Backoff.jitter(inner)
    draws = [b.delay_ms(4, seed=s) for s in SEEDS]
    assert all(0 <= d <= inner.delay_ms(4) == 8_000 for d in draws)
    assert min(draws) < 800 and max(draws) > 7_200
    capped = [b.delay_ms(30, seed=s) for s in SEEDS]
    assert all(0 <= d <= 60_000 for d in capped)


def test_same_seed_same_delay_and_batch_agrees(backend):
    b = Backoff.jitter(Backoff.exponential(50, cap=5_000, jitter=0.5))
    attempts = [1 + (s % 12) for s in SEEDS]
    one_by_one = [b.delay_ms(a, seed=s) for a, s in zip(attempts, SEEDS)]
    assert b.delays_ms(attempts, list(SEEDS)) == one_by_one
    assert [b.delay_ms(a, seed=s) for a, s in zip(attempts, SEEDS)] == one_by_one
    assert len(set(one_by_one)) > 50


def test_bad_backoff_arguments():
    for call in (lambda: Backoff.exponential(0), lambda: Backoff.exponential(100, cap=0),
                 lambda: Backoff.exponential(100, jitter=1.5),
                 lambda: Backoff.exponential(100, jitter=float("nan")),
                 lambda: Backoff.fixed(-1), lambda: Backoff.fixed(1.5),
                 lambda: Backoff.jitter("x"), lambda: Backoff.fixed(1).delay_ms(0),
                 lambda: Backoff.fixed(1).delay_ms(True)):
        with pytest.raises(InvalidInput):
            call()


def test_policy_survives_the_round_trip_through_redis(redis_url, qname):
    q = make_queue(redis_url, qname)
    b = Backoff.jitter(Backoff.exponential(150, cap=9_000, jitter=0.25))
    ref = q.enqueue("x", backoff=b, attempts=7)
    job = q.get(ref.id)
    assert (job.backoff, job.max_attempts) == (b, 7)


# --- retries through a real Worker ---------------------------------------------------------

@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


def test_failure_reparks_with_the_backoff_delay(r, q):
    policy = Backoff.exponential(20_000, cap=60_000)
    ref = q.enqueue("x", attempts=3, backoff=policy)
    before = server_ms(r)

    def handler(job):
        raise ValueError("try later")
    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    after = server_ms(r)
    job = q.get(ref.id)
    assert (stats.retried, stats.failed) == (1, 0)
    assert (job.state, job.attempts, job.error) == ("scheduled", 1, "ValueError: try later")
    assert q.job_ids("scheduled") == [ref.id]
    # run_at - (server time of the failure) == the policy's delay for attempt 1
    assert before + 20_000 <= job.run_at_ms <= after + 20_000
    assert q.next_due_ms() == job.run_at_ms
    assert "raise ValueError" in job.traceback


def test_delay_beyond_the_range_waits_as_long_as_representable(q):
    """A capless policy can ask for more than the delayed set can hold: the job must wait
    until the last representable instant, not come straight back."""
    ref = q.enqueue("x", attempts=2, backoff=Backoff.fixed(2 ** 62))
    stats = emqfast.Worker(q, lambda job: 1 / 0).run_until_idle(timeout_s=30)
    job = q.get(ref.id)
    assert stats.retried == 1 and stats.claimed == 1
    assert (job.state, job.run_at_ms) == ("scheduled", MAX_RUN_AT_MS)
    assert q.next_due_ms() == MAX_RUN_AT_MS


def test_jittered_delay_lands_in_its_band(r, q):
    ref = q.enqueue("x", attempts=2, backoff=Backoff.exponential(30_000, jitter=0.2))
    before = server_ms(r)
    emqfast.Worker(q, lambda job: 1 / 0).run_until_idle(timeout_s=30)
    after = server_ms(r)
    run_at = q.get(ref.id).run_at_ms
    assert before + 24_000 <= run_at <= after + 36_000


def test_retries_wait_their_delay_then_succeed(r, q):
    policy = Backoff.exponential(100, cap=10_000)
    ref = q.enqueue({"n": 1}, attempts=3, backoff=policy)
    runs = []  # (attempt, started_ms, run_at_ms seen at start, server ms at failure)

    def handler(job):
        stored = q.get(job.id)
        failed_at = server_ms(r)
        runs.append((job.attempts, stored.started_ms, stored.run_at_ms, failed_at))
        if job.attempts < 3:
            raise RuntimeError(f"attempt {job.attempts}")
        return {"ok": job.attempts}

    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert [a for a, *_ in runs] == [1, 2, 3]
    for (_, _, _, failed_at), (_, started, run_at, _), delay in zip(runs, runs[1:], (100, 200)):
        # parked for exactly the policy's delay after the failure, and not run before it
        assert failed_at + delay <= run_at <= failed_at + delay + 2_000
        assert started >= run_at
    job = q.get(ref.id)
    assert (job.state, job.attempts, job.result) == ("completed", 3, {"ok": 3})
    assert job.error is None and job.traceback is None  # the earlier runs' failure is gone
    assert (stats.retried, stats.completed, stats.failed) == (2, 1, 0)


def test_last_attempt_fails_with_error_and_traceback(q):
    ref = q.enqueue("x", attempts=3, backoff=Backoff.fixed(10))
    calls = []

    def doomed_handler(job):
        calls.append(job.attempts)
        raise KeyError(f"missing {job.attempts}")

    stats = emqfast.Worker(q, doomed_handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert calls == [1, 2, 3]
    job = q.get(ref.id)
    assert (job.state, job.attempts, job.error) == ("failed", 3, "KeyError: 'missing 3'")
    assert "doomed_handler" in job.traceback and "raise KeyError" in job.traceback
    assert q.job_ids("failed") == [ref.id]
    assert job.finished_ms is not None
    assert (stats.retried, stats.failed) == (2, 1)


def test_unrecoverable_skips_retries(q):
    ref = q.enqueue("x", attempts=5, backoff=Backoff.fixed(10))
    calls = []

    def handler(job):
        calls.append(job.attempts)
        raise Unrecoverable("bad card number")

    emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    job = q.get(ref.id)
    assert calls == [1]
    assert (job.state, job.error) == ("failed", "Unrecoverable: bad card number")


def test_zero_delay_retry_goes_straight_back_to_pending(q):
    ref = q.enqueue("x", attempts=2, backoff=Backoff.fixed(0))
    calls = []

    def handler(job):
        calls.append(job.attempts)
        if job.attempts == 1:
            raise RuntimeError("once")
        return "second"

    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)  # no scheduled wait needed
    assert calls == [1, 2]
    assert q.get(ref.id).result == "second"


def test_queue_retry_revives_a_failed_job(q):
    ref = q.enqueue("x", attempts=1)
    outcomes = iter([RuntimeError("first life"), None])

    def handler(job):
        outcome = next(outcomes)
        if outcome:
            raise outcome
        return "second life"

    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    assert q.get(ref.id).state == "failed"
    q.retry(ref.id)
    job = q.get(ref.id)
    assert (job.state, job.attempts, job.finished_ms) == ("pending", 0, None)
    assert q.job_ids("failed") == [] and q.job_ids("pending") == [ref.id]
    assert q.get(ref.id).error == "RuntimeError: first life"  # kept until an outcome replaces it
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    job = q.get(ref.id)
    assert (job.state, job.result, job.attempts) == ("completed", "second life", 1)
    # a first attempt again, yet its success clears the earlier life's failure
    assert job.error is None and job.traceback is None
