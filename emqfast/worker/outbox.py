"""A Worker's part in job dependencies (issue 15): it settles its queue's dependencies on
its beat and after its acks, and hands running jobs their dependencies' results.

- On the beat (a hook in ``WorkerMachine.beat_hooks``) it runs
  :meth:`emqfast.Queue.settle_dependencies`: drain the outbox (release or fail the jobs
  waiting on this queue's ended jobs) and repair links a dead producer left unsent.
- After each ack batch it does the same, but only while the queue has dependency links
  in play (seen on the beat), so queues without dependencies pay nothing per ack.
- Before a started job with dependencies reaches its handler, one pipelined read fills
  :meth:`emqfast.Job.dependency_results`.

Never stops a Worker: a failure is logged and the next beat tries again (every step of
the drain is safe to repeat).
"""
from __future__ import annotations

import logging
from typing import Any, List, Sequence, Tuple

from emqfast.core.errors import EmqError
from emqfast.facade.dep_settle import Settled, settle_op
from emqfast.facade.deps import results_op
from emqfast.facade.job import Job
from emqfast.worker.effects import Invoke, Logic

log = logging.getLogger("emqfast.worker")


class DependencyStep:
    """The dependency step of one Worker (``machine``: its WorkerMachine)."""

    def __init__(self, machine: Any):
        self.machine = machine
        self.busy = False  # the queue had dependents or outbox entries at the last look
        self.cursor = 0    # where the next sweep of the dependents hash resumes

    def __call__(self) -> Any:
        """The beat hook: settle the queue's dependencies (an awaitable under asyncio)."""
        return self._run(settle_op(self.machine.queue.keys, cursor=self.cursor), self._settled)

    def after_acks(self) -> Logic:
        """After an ack batch: drain the outbox now if the queue has dependency links in
        play (the repair of unsent links is left to the beat)."""
        if self.busy:
            yield Invoke(self._drain)

    def _drain(self) -> Any:
        return self._run(settle_op(self.machine.queue.keys, repair=False, cursor=self.cursor),
                         self._settled)

    def load_results(self, started: Sequence[Tuple[Job, str]]) -> Logic:
        """Fill ``dependency_results()`` of the started jobs that have dependencies."""
        jobs: List[Job] = [job for job, _ in started if job.extra.get("d")]
        if jobs:
            yield Invoke(self._results, {"jobs": jobs})

    def _results(self, jobs: List[Job]) -> Any:
        return self._run(results_op(jobs), lambda _: None)

    def _settled(self, settled: Any) -> None:
        if isinstance(settled, Settled):
            self.busy = settled.busy or bool(settled.told or settled.relinked)
            self.cursor = settled.cursor

    def _run(self, op: Any, then: Any) -> Any:
        queue = self.machine.queue
        if getattr(queue, "is_async", False):
            return self._run_async(op, then)
        try:
            got = queue._drive(op)
        except EmqError as exc:  # never stop a worker over it: the next beat retries
            log.warning("%s: dependency step failed (%s); next beat", self.machine.name, exc)
            return None
        then(got)
        return got

    async def _run_async(self, op: Any, then: Any) -> Any:
        try:
            got = await self.machine.queue._drive(op)
        except EmqError as exc:
            log.warning("%s: dependency step failed (%s); next beat", self.machine.name, exc)
            return None
        then(got)
        return got
