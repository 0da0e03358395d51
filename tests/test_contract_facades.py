"""Engine contract tests run against both facades: ``emqfast`` (sync) and ``emqfast.aio``,
each on a plain queue and on a partitioned one (``partitions=3``: one logical queue over
three slots; order is per partition, so the tests of order place their jobs by one
``partition_key``).

The ``facade`` fixture gives the sync call shape either way; for ``async`` each
coroutine is run on a background event loop thread, so the same test body
checks that both facades (one shared logic, two drivers) behave identically.
Redis state is always checked with a plain sync client.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

import pytest
import redis

import emqfast
import emqfast.aio
from conftest import dump_queue
from emqfast import Backoff
from emqfast.core.errors import (InvalidInput, KindError, LeaseLost, PayloadError, RangeError,
    VersionMismatch)
from emqfast.core.keys import partition_names, partition_of
from engine_util import claim, complete, server_ms, skewed_local_clock, wait_server_past  # noqa: F401

EPOCH_2045_MS = 2_366_841_600_000  # 2045-01-01T00:00:00Z


class _Loop:
    """An event loop on a daemon thread; ``run(coro)`` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="aio-facade",
                                       daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class _Blocking:
    """Sync view of an aio object: awaits every coroutine it returns on the loop."""

    def __init__(self, target: Any, loop: _Loop):
        self._target, self._loop = target, loop

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if name == "schedules":
            return _Blocking(value, self._loop)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            out = value(*args, **kwargs)
            return self._loop.run(out) if asyncio.iscoroutine(out) else out
        return call


class Facade:
    """Builds queues, workers, boards with one facade's classes, in the sync call shape."""

    def __init__(self, kind: str, redis_url: str, partitions: Any = None):
        self.kind, self.url, self.partitions = kind, redis_url, partitions
        self._loop = _Loop() if kind == "async" else None
        self._clients: list = []

    @property
    def place(self) -> dict:
        """Enqueue options putting jobs in one partition (none for a plain queue)."""
        return {"partition_key": "one"} if self.partitions else {}

    def names(self, name: str) -> list:
        """The queue names holding queue ``name``'s keys (its partitions too)."""
        return [name, *(partition_names(name, self.partitions) if self.partitions else ())]

    def home(self, name: str) -> str:
        """The queue name holding the jobs placed with :attr:`place`."""
        if not self.partitions:
            return name
        return partition_names(name, self.partitions)[partition_of("one", self.partitions)]

    def dump(self, r: Any, name: str) -> dict:
        """Every key of queue ``name`` (and its partitions) with its value."""
        return {n: dump_queue(r, n) for n in self.names(name)}

    def queue(self, name: str, **opts: Any) -> Any:
        if self.partitions and not name.endswith("-empty"):
            opts.setdefault("partitions", self.partitions)
        if self._loop is None:
            client = redis.Redis.from_url(self.url)
            self._clients.append(client)
            return emqfast.Queue(name, client, **opts)
        client = emqfast.aio.connect(self.url)
        self._clients.append(client)
        return _Blocking(emqfast.aio.Queue(name, client, **opts), self._loop)

    def worker(self, q: Any, handler: Callable[[Any], Any], **opts: Any) -> Any:
        if self._loop is None:
            return emqfast.Worker(q, handler, **opts)

        async def coroutine_handler(job: Any) -> Any:  # the aio worker awaits it
            return handler(job)
        return _Blocking(emqfast.aio.Worker(q._target, coroutine_handler, **opts), self._loop)

    def leaderboard(self, name: str) -> Any:
        if self._loop is None:
            return emqfast.Leaderboard(self.url, name)
        return _Blocking(emqfast.aio.Leaderboard(self.url, name), self._loop)

    def promote_many(self, queues: list, limit: int = 1000) -> Any:
        if self._loop is None:
            return emqfast.promote_many(self.url, queues, limit)
        return self._loop.run(emqfast.aio.promote_many(
            self.url, [getattr(q, "_target", q) for q in queues], limit))

    def close(self) -> None:
        if self._loop is None:
            for c in self._clients:
                c.close()
            return
        for c in self._clients:
            self._loop.run(c.aclose())
        self._loop.close()


@pytest.fixture(params=["sync", "async", "sync-partitioned", "async-partitioned"])
def facade(request, redis_url):
    kind, _, layout = request.param.partition("-")
    f = Facade(kind, redis_url, 3 if layout else None)
    yield f
    f.close()


@pytest.fixture
def q(facade, qname):
    return facade.queue(qname)


# --- enqueue ------------------------------------------------------------------------------

def test_enqueue_get_counts_and_duplicate(q, facade):
    ref = q.enqueue({"to": "ada"}, job_id="JOB-one")
    assert (ref.id, ref.status) == ("JOB-one", "pending")
    again = q.enqueue({"other": 1}, job_id="JOB-one")
    assert again.duplicate
    job = q.get("JOB-one")
    assert (job.state, job.payload, job.attempts) == ("pending", {"to": "ada"}, 0)
    assert q.get("JOB-missing") is None
    assert q.counts() == {"scheduled": 0, "pending": 1, "grouped": 0, "active": 0,
                          "completed": 0, "failed": 0, "cancelled": 0, "waiting_deps": 0, "expired": 0}


def test_priority_order_then_arrival(q, facade):
    ids = [q.enqueue(i, priority=p, **facade.place).id for i, p in enumerate([5, 0, 5, 1, 0])]
    assert q.job_ids("pending") == [ids[1], ids[4], ids[3], ids[0], ids[2]]


def test_enqueue_in_measures_on_the_server_clock(q, r, skewed_local_clock):
    before = server_ms(r)
    ref = q.enqueue_in("later", 60_000)
    after = server_ms(r)
    job = q.get(ref.id)
    assert ref.status == "scheduled"
    assert before + 60_000 <= job.run_at_ms <= after + 60_000  # not a day ahead


def test_enqueue_at_2045_is_exact(q):
    ref = q.enqueue_at("far", EPOCH_2045_MS + 123)
    assert q.get(ref.id).run_at_ms == EPOCH_2045_MS + 123
    assert q.next_due_ms() == EPOCH_2045_MS + 123
    assert q.job_ids("scheduled") == [ref.id]


def test_enqueue_many_in_order_with_duplicates(q, facade):
    refs = q.enqueue_many([{"n": i} for i in range(50)], **facade.place)
    assert [r.status for r in refs] == ["pending"] * 50
    assert q.job_ids("pending") == [r.id for r in refs]
    again = q.enqueue_many(["x", "y"], job_ids=[refs[0].id, "JOB-new"], **facade.place)
    assert [r.status for r in again] == ["duplicate", "pending"]
    assert q.get(refs[7].id).payload == {"n": 7}
    mixed = q.enqueue_many([b"raw", {"j": 1}])  # bytes and JSON in one batch
    assert [q.get(r.id).payload for r in mixed] == [b"raw", {"j": 1}]


# --- moves on the server clock --------------------------------------------------------------

def test_promote_releases_due_jobs(q, r):
    due = q.enqueue_in("soon", 30)
    q.enqueue_in("later", 3_600_000)
    wait_server_past(r, q.get(due.id).run_at_ms)
    assert q.promote() == 1
    assert q.job_ids("pending") == [due.id]
    assert q.get(due.id).state == "pending"


def test_promote_many_across_queues(facade, qname, r):
    qs = [facade.queue(f"{qname}-{i}") for i in range(3)]
    refs = [q.enqueue_in(i, 20) for i, q in enumerate(qs)]
    wait_server_past(r, max(q.get(ref.id).run_at_ms for q, ref in zip(qs, refs)))
    moved = facade.promote_many([*qs, f"{qname}-empty"])
    assert moved == {f"{qname}-0": 1, f"{qname}-1": 1, f"{qname}-2": 1, f"{qname}-empty": 0}


# --- control -----------------------------------------------------------------------------------

def test_cancel_pause_resume(q):
    pending, scheduled = q.enqueue("p"), q.enqueue_in("s", 3_600_000)
    assert q.cancel(pending.id) and q.cancel(scheduled.id)
    assert not q.cancel(pending.id)  # cancelled already: its record stays
    assert q.get(pending.id).state == "cancelled"
    assert not q.is_paused()
    q.pause()
    assert q.is_paused()
    q.resume()
    assert not q.is_paused()


def test_bad_input_raises_typed_and_leaves_redis_unchanged(q, r, qname, facade):
    q.enqueue("seed")
    before = facade.dump(r, qname)
    bad = [
        (KindError, lambda: q.enqueue("x", job_id="nope")),
        (RangeError, lambda: q.enqueue("x", priority=-1)),
        (InvalidInput, lambda: q.enqueue("x", delay_ms=1, run_at_ms=1)),
        (PayloadError, lambda: q.enqueue(object())),
        (InvalidInput, lambda: q.enqueue_many("abc")),
        (KindError, lambda: q.enqueue_many(["a", "b"], job_ids=["JOB-a", "bad"])),
        (InvalidInput, lambda: q.job_ids("nope")),
        (KindError, lambda: q.cancel("x")),
        (InvalidInput, lambda: q.schedules.upsert("s", cron="* * * * *", every_ms=5)),
        (RangeError, lambda: q.trim(keep_completed=-1)),
    ]
    for error, call in bad:
        with pytest.raises(error):
            call()
    assert facade.dump(r, qname) == before


def test_version_fence_refuses_writes(q, r, qname, facade):
    q.enqueue("seed", **facade.place)
    for name in facade.names(qname)[1:] or [qname]:  # a partitioned queue: each partition
        r.hset(f"emq:{{{name}}}:meta", "version", "other:9.0")
    before = facade.dump(r, qname)
    with pytest.raises(VersionMismatch):
        q.enqueue("x")
    with pytest.raises(VersionMismatch):
        q.pause()
    assert facade.dump(r, qname) == before


# --- leases, reaper, retries -----------------------------------------------------------------

def test_reap_requeues_an_expired_lease_and_the_old_holder_is_refused(q, r, redis_url, qname,
                                                                     facade):
    ref = q.enqueue("x", **facade.place)
    sync_q = emqfast.Queue(facade.home(qname), redis.Redis.from_url(redis_url))
    [(job_id, token)] = claim(sync_q, "zombie", lease_ms=50)
    assert job_id == ref.id
    wait_server_past(r, int(r.zscore(sync_q.keys.active, job_id)))
    assert q.reap() == (1, 0)
    job = q.get(ref.id)
    assert (job.state, job.stalls) == ("pending", 1)
    with pytest.raises(LeaseLost):
        complete(sync_q, job_id, token)


def test_retry_with_backoff_then_manual_retry(q, facade, r):
    ref = q.enqueue("x", attempts=2, backoff=Backoff.fixed(40))
    runs = []

    def handler(job):
        runs.append(job.attempts)
        raise ValueError("boom")
    stats = facade.worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert runs == [1, 2]
    assert (stats.retried, stats.failed, stats.completed) == (1, 1, 0)
    job = q.get(ref.id)
    assert (job.state, job.attempts, job.error) == ("failed", 2, "ValueError: boom")
    q.retry(ref.id)
    assert q.get(ref.id).state == "pending"
    assert q.job_ids("pending") == [ref.id]


def test_worker_runs_everything_and_stores_results(q, facade):
    refs = q.enqueue_many([{"n": i} for i in range(40)], **facade.place)
    stats = facade.worker(q, lambda job: job.payload["n"] * 2, concurrency=4) \
        .run_until_idle(timeout_s=30)
    assert (stats.claimed, stats.completed, stats.failed) == (40, 40, 0)
    assert [q.get(r.id).result for r in refs] == [i * 2 for i in range(40)]
    assert q.counts()["completed"] == 40
    assert q.trim(keep_completed=10) == 30


# --- schedules and leaderboards ------------------------------------------------------------

def test_schedule_upsert_pump_and_list(q, r):
    now = server_ms(r)
    s = q.schedules.upsert("tick", every_ms=60_000, start_at_ms=now - 1, payload={"k": 1})
    assert s.every_ms == 60_000 and s.next_run_ms is not None
    again = q.schedules.upsert("tick", every_ms=60_000, start_at_ms=now - 1, payload={"k": 2})
    assert again.generation == s.generation  # same cadence: timing kept
    assert q.schedules.pump() == 1
    assert q.schedules.pump() == 0  # the occurrence is minted once
    [job_id] = q.job_ids("pending")
    assert q.get(job_id).payload == {"k": 2}
    assert [x.name for x in q.schedules.list()] == ["tick"]
    assert q.schedules.get("tick").last_job_id == job_id
    assert q.schedules.remove("tick") and q.schedules.get("tick") is None


def test_leaderboard_top_rank_around(facade, qname):
    board = facade.leaderboard(qname)
    assert board.set_many({"ada": 97, "linus": 88, "grace": 97, "alan": 50}) == 4
    assert [(e.rank, e.member, e.score) for e in board.top(3)] == \
        [(1, "ada", 97.0), (2, "grace", 97.0), (3, "linus", 88.0)]
    assert board.rank("linus") == 3 and board.rank("nobody") is None
    assert board.incr("alan", 40) == 90.0
    assert [e.member for e in board.around("alan", 1)] == ["grace", "alan", "linus"]
    assert board.score("alan") == 90.0 and board.size() == 4
    assert board.remove("ada") and board.size() == 3
    board.clear()
