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
from emqfast.core.ops import Logic

log = logging.getLogger("emqfast.worker")


class DependencyStep:
    """The dependency step of one Worker (``machine``: its WorkerMachine). Its parts are
    operations the Worker's driver runs; a failure is logged, never raised."""

    def __init__(self, machine: Any):
        self.machine = machine
        self.busy = False  # the queue had dependents or outbox entries at the last look
        self.cursor = 0    # where the next sweep of the dependents hash resumes

    def settle(self) -> Logic:
        """On the beat: settle the queue's dependencies (drain, repair, one sweep chunk)."""
        yield from self._settle(repair=True)

    def after_acks(self) -> Logic:
        """After an ack batch: drain the outbox now if the queue has dependency links in
        play (the repair of unsent links is left to the beat)."""
        if self.busy:
            yield from self._settle(repair=False)

    def _settle(self, repair: bool) -> Logic:
        try:
            settled = yield from settle_op(self.machine.queue.keys, repair=repair,
                                           cursor=self.cursor)
        except EmqError as exc:  # never stop a worker over it: the next beat retries
            log.warning("%s: dependency step failed (%s); next beat", self.machine.name, exc)
            return
        if isinstance(settled, Settled):
            self.busy = settled.busy or bool(settled.told or settled.relinked)
            self.cursor = settled.cursor

    def load_results(self, started: Sequence[Tuple[Job, str]]) -> Logic:
        """Fill ``dependency_results()`` of the started jobs that have dependencies."""
        jobs: List[Job] = [job for job, _ in started if job.extra.get("d")]
        if not jobs:
            return
        try:
            yield from results_op(jobs)
        except EmqError as exc:
            log.warning("%s: dependency results not read (%s)", self.machine.name, exc)
