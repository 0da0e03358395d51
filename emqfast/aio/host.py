"""What the asyncio Worker's mixins read from it, for type checkers only.

:class:`~emqfast.aio.handlers.JobTasks` and :class:`~emqfast.aio.lifecycle.Lifecycle`
are parts of :class:`emqfast.aio.Worker`: they use the worker machine's state, the
asyncio state ``Worker.__init__`` makes and each other's methods. They name
:class:`AioHost` as their base only under ``TYPE_CHECKING`` (at run time their base is
``object``), so a checker knows what ``self`` holds.
"""
from __future__ import annotations

import asyncio
from abc import abstractmethod
from typing import Any, List, Optional, Set

from emqfast.worker.async_slots import AsyncSlots
from emqfast.core.ops import Logic
from emqfast.worker.machine import Held
from emqfast.worker.machine import WorkerMachine
from emqfast.worker.outcomes import Outcome
from emqfast.worker.leases import Prefetch


class AioHost(WorkerMachine):
    """The asyncio Worker's state (set in ``Worker.__init__`` and ``_begin``) and the
    methods one part uses of another."""

    _is_coro: bool
    _holding: Prefetch
    _in_hand: int
    _outcomes: List[Outcome]
    _releases: List[Held]
    _stopping: bool
    _closing: bool
    _run_task: Optional[asyncio.Task[Any]]
    _cancels_before: int
    _loop: Optional[asyncio.AbstractEventLoop]
    _sem: Optional[AsyncSlots]
    _ack_ready: Optional[asyncio.Event]
    _hurry: Optional[asyncio.Event]
    _wakers: Set[asyncio.Future[Any]]
    stall_warn_s: float
    _last_stall: float

    @abstractmethod
    def _drive(self, logic: Logic) -> Any: ...
    @abstractmethod
    async def _ack_loop(self) -> None: ...
    @abstractmethod
    async def _ack_queued(self) -> None: ...
    @abstractmethod
    def _run_cancelled(self) -> bool: ...
