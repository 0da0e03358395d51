"""One worker, many queues: ``Worker([q_high, q_default, q_low], handler)``
with ``order="strict"`` or ``order="weighted"``, blocking on every queue's marker at once;
each queue keeps its own leases, pause, stats and heartbeat record."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import uuid
from collections import Counter
from typing import Any, List, Tuple

import pytest

import emqfast
from emqfast.facade.workers import QueueWorkers
from engine_util import blocked_on_marker, make_queue, running_worker
from waiting import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _queues(redis_url: str, n: int = 3, client_name: str = "") -> List[emqfast.Queue]:
    base = "mq-" + uuid.uuid4().hex[:8]
    return [make_queue(redis_url, f"{base}-{i}", client_name=client_name or None)
            for i in range(n)]


def _recorder() -> Tuple[List[str], Any]:
    seen: List[str] = []

    def handler(job: emqfast.Job) -> None:
        seen.append(job.payload["q"])
    return seen, handler


def test_strict_order_serves_every_higher_job_before_a_lower_one(redis_url):
    qs = _queues(redis_url)
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 40)
    seen, handler = _recorder()
    w = emqfast.Worker(qs, handler, concurrency=1)
    stats = w.run_until_idle(timeout_s=60)
    assert seen == [0] * 40 + [1] * 40 + [2] * 40
    assert stats.completed == 120
    assert {name: s.completed for name, s in w.stats_by_queue.items()} == \
        {q.name: 40 for q in qs}
    assert all(q.counts()["completed"] == 40 for q in qs)


def test_strict_with_prefetch_and_concurrency_still_serves_higher_queues_first(redis_url):
    qs = _queues(redis_url)
    refs = [q.enqueue_many([{"q": i}] * 300) for i, q in enumerate(qs)]
    seen, handler = _recorder()
    emqfast.Worker(qs, handler, concurrency=4).run_until_idle(timeout_s=60)
    assert Counter(seen) == {0: 300, 1: 300, 2: 300}
    # start.lua stamps each start on the server clock (ms): every job of a queue started
    # no later than the first of the next one (handler threads may print in any order)
    started = [[q.get(r.id).started_ms for r in batch] for q, batch in zip(qs, refs)]
    assert max(started[0]) <= min(started[1]) and max(started[1]) <= min(started[2])


def test_weighted_order_claims_in_proportion_to_the_weights(redis_url):
    qs = _queues(redis_url)
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 200)
    seen, handler = _recorder()
    w = emqfast.Worker(qs, handler, order="weighted", weights=[3, 2, 1], concurrency=1,
                       prefetch=0)
    w.order.rng = random.Random(7)
    with running_worker(w):
        wait_until(lambda: len(seen) >= 300, what="300 jobs run")
    share = Counter(seen[:300])
    for i, expected in enumerate((0.5, 1 / 3, 1 / 6)):
        assert abs(share[i] / 300 - expected) < 0.07, share


def test_an_idle_worker_blocks_on_every_marker_and_wakes_for_a_lower_queue(redis_url, r):
    name = "mq-idle-" + uuid.uuid4().hex[:6]
    qs = _queues(redis_url, client_name=name)
    seen, handler = _recorder()
    w = emqfast.Worker(qs, handler)
    with running_worker(w):
        wait_until(lambda: sum(c.get("name") == name and c.get("cmd") == "bzpopmin"
                               for c in r.client_list()) == 3,
                   what="one blocked BZPOPMIN per queue")
        assert blocked_on_marker(r, name)
        qs[2].enqueue({"q": 2})
        wait_until(lambda: seen == [2], timeout=5, what="the low queue's job runs")
        qs[0].enqueue({"q": 0})
        wait_until(lambda: seen == [2, 0], timeout=5, what="the high queue's job runs")


def test_pausing_one_queue_stops_only_that_queue(redis_url):
    qs = _queues(redis_url)
    seen, handler = _recorder()
    w = emqfast.Worker(qs, handler, concurrency=2)
    qs[0].pause()
    with running_worker(w):
        for i, q in enumerate(qs):
            q.enqueue_many([{"q": i}] * 5)
        wait_until(lambda: Counter(seen) == {1: 5, 2: 5}, what="the other queues served")
        assert qs[0].counts()["pending"] == 5
        qs[0].resume()
        wait_until(lambda: Counter(seen)[0] == 5, what="the resumed queue served")


def test_each_queue_lists_the_worker_and_the_stats_add_up(redis_url):
    qs = _queues(redis_url, 2)
    gate = threading.Event()
    w = emqfast.Worker(qs, lambda job: gate.wait(10), name="multi-" + uuid.uuid4().hex[:6],
                       lease_ms=1000)
    with running_worker(w):
        qs[1].enqueue({"q": 1})
        for q in qs:
            wait_until(lambda q=q: any(i.token == w.name for i in QueueWorkers(q).list()),
                       what=f"the worker listed under {q.name}")
            info = [i for i in QueueWorkers(q).list() if i.token == w.name][0]
            assert info.queues == [x.name for x in qs]
        gate.set()
        wait_until(lambda: w.stats.completed == 1, what="the job completes")
    assert w.stats_by_queue[qs[1].name].completed == 1
    # signed off under every queue at the shutdown
    assert all(not QueueWorkers(q).list() for q in qs)


def test_bad_arguments_are_typed_errors(redis_url):
    qs = _queues(redis_url, 2)
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker([], print)
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker([qs[0], qs[0]], print)
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker(qs, print, order="random")
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker(qs, print, order="weighted", weights=[1])
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker(qs, print, order="weighted", weights=[1, 0])
    with pytest.raises(emqfast.InvalidInput):
        emqfast.Worker(qs, print, weights=[1, 2])  # weights are for order="weighted"
    with pytest.raises(TypeError):
        emqfast.Worker([qs[0], "not a queue"], print)


HANDLER = '''
import time

def handle(job):
    return {"q": job.payload["q"], "at": time.time()}
'''


def _cli(*args: str, cwd: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("EMQ_REDIS_URL", None)
    return subprocess.run([sys.executable, "-m", "emqfast", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def test_cli_worker_with_repeated_queue_option_serves_them_in_order(redis_url, tmp_path):
    (tmp_path / "mq_handlers.py").write_text(HANDLER)
    qs = _queues(redis_url)
    refs = [q.enqueue_many([{"q": i}] * 5) for i, q in enumerate(qs)]
    out = _cli("--url", redis_url, "worker", "mq_handlers:handle", "-q", qs[0].name,
               "-q", qs[1].name, "-q", qs[2].name, "--concurrency", "1", "--burst",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "completed 15" in out.stderr
    assert ", ".join(q.name for q in qs) in out.stderr
    finished = [[q.get(r.id).result["at"] for r in batch] for q, batch in zip(qs, refs)]
    assert max(finished[0]) <= min(finished[1]) and max(finished[1]) <= min(finished[2])


def test_cli_worker_weighted_order_and_bad_weights(redis_url, tmp_path):
    (tmp_path / "mq_handlers.py").write_text(HANDLER)
    qs = _queues(redis_url, 2)
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 3)
    names = ["-q", qs[0].name, "-q", qs[1].name]
    out = _cli("--url", redis_url, "worker", "mq_handlers:handle", *names, "--order",
               "weighted", "--weights", "1,4", "--burst", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "completed 6" in out.stderr
    for bad in (["--weights", "1,x", "--order", "weighted"], ["--weights", "1,2"]):
        out = _cli("--url", redis_url, "worker", "mq_handlers:handle", *names, *bad,
                   "--burst", cwd=tmp_path)
        assert out.returncode != 0 and "--weights" in out.stderr, out.stderr
    out = _cli("--url", redis_url, "worker", "mq_handlers:handle", *names, "--order",
               "weighted", "--weights", "1,2,3", "--burst", cwd=tmp_path)
    assert out.returncode != 0 and "3 weights for 2 queues" in out.stderr, out.stderr
    assert all(q.counts()["pending"] == 0 for q in qs)


def test_a_rate_limited_higher_queue_lets_lower_ones_run_and_keeps_its_limit(redis_url):
    """Strict order, "ready" = claimable now: a higher queue whose rate window is full
    claims nothing, so the lower queues are served meanwhile; its limit still holds."""
    qs = _queues(redis_url, 2)
    qs[0].set_rate_limit(2, 60_000)  # two starts, then nothing for a minute
    qs[0].enqueue_many([{"q": 0}] * 5)
    qs[1].enqueue_many([{"q": 1}] * 5)
    seen, handler = _recorder()
    with running_worker(emqfast.Worker(qs, handler, concurrency=1)):
        wait_until(lambda: Counter(seen) == {0: 2, 1: 5}, what="2 high (its limit), 5 low")
    assert seen[:2] == [0, 0]
    assert qs[0].counts()["pending"] + qs[0].counts()["scheduled"] == 3


def test_a_grouped_queue_keeps_its_group_caps_under_a_many_queue_worker(redis_url):
    qs = _queues(redis_url, 2)
    qs[1].groups.set_concurrency("tenant", 1)
    qs[1].enqueue_many([{"q": 1}] * 6, group="tenant")
    qs[0].enqueue_many([{"q": 0}] * 6)
    running, peak = [0], [0]
    lock = threading.Lock()

    def handler(job: emqfast.Job) -> None:
        if job.payload["q"] == 1:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            threading.Event().wait(0.01)
            with lock:
                running[0] -= 1
    w = emqfast.Worker(qs, handler, concurrency=4)
    assert w.run_until_idle(timeout_s=60).completed == 12
    assert peak[0] == 1  # the group's cap of 1 held across the worker's 4 slots


def test_concurrency_is_one_budget_for_all_queues(redis_url):
    qs = _queues(redis_url)
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 30)
    running, peak = [0], [0]
    lock = threading.Lock()

    def handler(job: emqfast.Job) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        threading.Event().wait(0.002)
        with lock:
            running[0] -= 1
    w = emqfast.Worker(qs, handler, concurrency=2, order="weighted", weights=[1, 1, 1])
    assert w.run_until_idle(timeout_s=60).completed == 90
    assert peak[0] == 2  # never more handlers at once than the one budget


def test_burst_returns_only_when_every_queue_is_idle_at_once(redis_url):
    """A job enqueued on a queue that already went idle (here: by a lower queue's handler)
    is run before run_until_idle returns."""
    qs = _queues(redis_url, 2)
    qs[1].enqueue_many([{"q": 1}] * 3)
    seen: List[int] = []

    def handler(job: emqfast.Job) -> None:
        seen.append(job.payload["q"])
        if job.payload["q"] == 1 and seen.count(1) == 3:
            qs[0].enqueue({"q": 0})  # the high queue, idle since the start
    for order in ("strict", "weighted"):
        seen.clear()
        if order == "weighted":
            qs[1].enqueue_many([{"q": 1}] * 3)
        stats = emqfast.Worker(qs, handler, order=order).run_until_idle(timeout_s=30)
        assert sorted(seen) == [0, 1, 1, 1] and stats.completed == 4, order
    assert all(q.counts()["pending"] == 0 for q in qs)


def test_weighted_order_holds_per_job_with_fast_handlers_and_prefetch(redis_url):
    """A round claims at most `concurrency` jobs: with no-op handlers and the default
    prefetch, one draw used to take a whole queue's backlog (300/0/0 for 6:3:1)."""
    qs = _queues(redis_url)
    for i, q in enumerate(qs):
        q.enqueue_many([{"q": i}] * 300)
    seen, handler = _recorder()
    w = emqfast.Worker(qs, handler, order="weighted", weights=[6, 3, 1], concurrency=8)
    w.order.rng = random.Random(11)
    with running_worker(w):
        wait_until(lambda: len(seen) >= 300, what="300 jobs run")
    share = Counter(seen[:300])
    for i, expected in enumerate((0.6, 0.3, 0.1)):
        assert abs(share[i] / 300 - expected) < 0.12, share
