"""A user's script, type-checked (never run) with ``mypy --strict`` by tests/test_typing.py:
the public API as apps use it, each result pinned with ``assert_type`` so a checker sees
precise types, never ``Any``, where emqfast knows them."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, Union

from typing_extensions import assert_type

import emqfast
import emqfast.aio
from emqfast import (CancelResult, Flow, Job, JobRef, Leaderboard, Queue, Worker,
                     WorkerStats)
from emqfast.facade.leaderboard import Entry
from emqfast.facade.schedules import Schedule

conn = emqfast.connect()
q = Queue("typed", conn)

ref = q.enqueue({"to": "ada@example.com"}, attempts=3, timeout_ms=5_000)
assert_type(ref, JobRef)
assert_type(q.enqueue_many([{"n": 1}, {"n": 2}]), List[JobRef])
assert_type(q.counts(), Dict[str, int])
assert_type(q.get(ref.id), Optional[Job])
assert_type(q.cancel(ref.id), Union[bool, CancelResult])
assert_type(q.promote(), int)
assert_type(q.reap(), Tuple[int, int])

assert_type(q.schedules.list(), List[Schedule])
assert_type(q.schedules.get("nightly"), Optional[Schedule])
assert_type(q.schedules.count(), int)
assert_type(q.groups.counts("tenant-1"), Dict[str, int])
assert_type(q.groups.list(), List[str])

flow = Flow(conn)
assert_type(flow, Flow)

board = Leaderboard(conn, "scores")
assert_type(board.top(3), List[Entry])


def handle(job: Job) -> Dict[str, str]:
    return {"sent": str(job.payload)}


w = Worker(q, handle, concurrency=4)
assert_type(w.run_until_idle(), WorkerStats)
assert_type(w.stats, WorkerStats)
assert_type(w.stats_by_queue, Dict[str, WorkerStats])
many = Worker([q, Queue("typed-low", conn)], handle, order="weighted", weights=[3, 1])
assert_type(many.stats_by_queue, Dict[str, WorkerStats])
assert_type(many.queues, List[Queue])


async def produce_and_serve() -> None:
    aq = emqfast.aio.Queue("typed", conn)
    aref = await aq.enqueue({"n": 1})
    assert_type(aref, JobRef)
    assert_type(await aq.counts(), Dict[str, int])
    assert_type(await aq.schedules.list(), List[Schedule])
    assert_type(await aq.groups.counts("tenant-1"), Dict[str, int])

    async def ahandle(job: Job) -> None:
        job.raise_if_cancelled()

    aw = emqfast.aio.Worker(aq, ahandle)
    assert_type(await aw.run_until_idle(), WorkerStats)
    assert_type(aw.stats_by_queue, Dict[str, WorkerStats])
