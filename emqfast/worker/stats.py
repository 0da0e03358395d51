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


@dataclass
class RunningJob:
    """A started job this worker holds under a lease: running, or about to be."""

    job: Job
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    task: Optional[Any] = None  # the asyncio driver's task running it
    lost: bool = False
    acking: bool = False  # its outcome (or release) is being written: renew no more

    @property
    def job_id(self) -> str:
        return self.job.id


@dataclass
class HeldLease:
    """A job claimed (leased) but not started: prefetched, waiting for a free handler slot.
    start.lua runs only when a slot frees, so a paused queue starts none of these."""

    job_id: str
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    lost: bool = False
    acking: bool = False  # never: held jobs have no outcome (kept for the lease renewal)
