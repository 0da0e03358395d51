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


@dataclass
class RunningJob:
    """A job this worker holds under a lease: started, running or waiting for a handler."""

    job: Job
    token: str
    extended_at: float  # monotonic seconds of the last lease grant
    task: Optional[Any] = None  # the asyncio driver's task running it
    lost: bool = False
    acking: bool = False  # its outcome (or release) is being written: renew no more
