"""What the worker machine's mixins read from their host, for type checkers only.

:class:`~emqfast.worker.acking.Acking` and :class:`~emqfast.worker.leases.LeaseKeeping`
are halves of :class:`~emqfast.worker.machine.WorkerMachine`: they use the state its
``_setup`` makes and the methods each driver (:class:`emqfast.Worker`,
:class:`emqfast.aio.Worker`) defines. They name :class:`MachineHost` as their base only
under ``TYPE_CHECKING`` (at run time their base is ``object``), so a checker knows what
``self`` holds and that every driver defines the methods listed here (abstract).
"""
from __future__ import annotations

from abc import abstractmethod
from typing import Any, Callable, ContextManager, Dict, List, Optional, Tuple

from emqfast.core.keys import QueueKeys
from emqfast.facade.job import Job
from emqfast.core.ops import Logic
from emqfast.worker.stats import HeldLease, RunningJob, WorkerStats

Held = Tuple[str, str, Optional[str]]  # (job id, lease token, group or None)


class MachineHost:
    """The worker machine's state (set in ``WorkerMachine._setup``) and driver methods."""

    queue: Any
    lease_ms: int
    max_stalled: int
    keep_completed: int
    keep_failed: int
    max_age_ms: Optional[int]
    name: str
    stats: WorkerStats
    beat_s: float
    beat_hooks: List[Callable[[], Any]]
    _who: str
    _keys: QueueKeys
    _fatal: Optional[BaseException]
    _ack_until: Optional[float]
    _running: Dict[str, RunningJob]
    _pending_acks: int
    _held: Dict[str, HeldLease]
    _next_beat: float
    _next_trim: float
    _next_schedule_ms: Optional[float]
    _guard: ContextManager[Any]  # a lock (threads), a null context (asyncio)

    # the machine's own, used by a half
    @abstractmethod
    def _check_paused(self) -> Logic: ...

    # each driver's (a checker refuses to make a Worker that lacks one)
    @abstractmethod
    def stop(self) -> None: ...
    @abstractmethod
    def _stop_requested(self) -> bool: ...
    @abstractmethod
    def _notify(self) -> None: ...
    @abstractmethod
    def _take_held(self, peek: bool = False) -> List[Held]: ...
    @abstractmethod
    def _hand_out(self, started: List[Tuple[Job, str]]) -> None: ...
