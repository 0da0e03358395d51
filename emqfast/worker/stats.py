"""What a Worker counts, and what it knows of each job it runs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from emqfast.facade.job import Job


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    lease_lost: int = 0
    released: int = 0
    cancelled: int = 0  # runs stopped by q.cancel and ended as cancelled (never retried)


class RunningJob:
    """A started job this worker holds under a lease: running, or about to be. A plain
    class with slots, not a dataclass: one is made per job on the hot path (issue 12)."""

    __slots__ = ("job", "token", "extended_at", "task", "lost", "acking")

    def __init__(self, job: Job, token: str, extended_at: float, task: Optional[Any] = None,
                 lost: bool = False, acking: bool = False):
        self.job = job
        self.token = token
        self.extended_at = extended_at  # monotonic seconds of the last lease grant
        self.task = task  # the asyncio driver's task running it
        self.lost = lost
        self.acking = acking  # its outcome (or release) is being written: renew no more

    @property
    def job_id(self) -> str:
        return self.job.id

    def __repr__(self) -> str:
        return f"RunningJob(job_id={self.job.id!r}, token={self.token!r}, lost={self.lost})"


class HeldLease:
    """A job claimed (leased) but not started: prefetched, waiting for a free handler slot.
    start.lua runs only when a slot frees, so a paused queue starts none of these."""

    __slots__ = ("job_id", "token", "extended_at", "lost", "acking")

    def __init__(self, job_id: str, token: str, extended_at: float, lost: bool = False):
        self.job_id = job_id
        self.token = token
        self.extended_at = extended_at  # monotonic seconds of the last lease grant
        self.lost = lost
        self.acking = False  # never: held jobs have no outcome (kept for the lease renewal)

    def __repr__(self) -> str:
        return f"HeldLease(job_id={self.job_id!r}, token={self.token!r}, lost={self.lost})"
