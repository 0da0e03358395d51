"""What a Worker holds under its leases: the jobs it claimed, held until a handler slot
frees then running (:class:`RunningJob`, one record each from claim to outcome), and how
many it may hold beyond its ``concurrency`` (:class:`Prefetch`); and the budget of
handler slots it shares (:class:`Solo`: a Worker of one queue keeps its own; a many-queue
Worker's queues share a :class:`~emqfast.worker.crew.Crew`, which answers the same
questions for all of them).

:class:`Prefetch` allows none until handlers have been timed, then enough that a
waiting job starts within about :data:`PREFETCH_BUDGET_S`. Slow handlers get no
prefetch (other workers keep the work); no-op handlers get whole batches per round
trip. Every held job still has its own lease, extended on the beat. Held jobs are
started (start.lua) only as handler slots free up, plus the few the slots take up within
the budget (:meth:`Prefetch.ahead`): a pause, which fences start.lua, leaves the rest
unstarted, and they go back to the queue.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Tuple

from emqfast.facade.job import Job
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.handler_threads import HandlerThreads

PREFETCH_BUDGET_S = 0.002  # how long a prefetched job may wait for a handler slot
PREFETCH_MAX = 2048        # jobs held beyond concurrency, at most
_EWMA_WEIGHT = 0.1


class RunningJob:
    """A job this worker holds under a lease, one record from its claim to its outcome:
    held (claimed, waiting for a free handler slot: ``job`` is None until start.lua ran;
    start.lua runs only when a slot frees, so a paused queue starts none of these), then
    started (running, or about to be). A plain class with slots, not a dataclass: one is
    made per job on the hot path."""

    __slots__ = ("job_id", "job", "token", "extended_at", "task", "lost", "acking")
    job: Job  # None while held (see held): only a started record's is read

    def __init__(self, job: Optional[Job], token: str, extended_at: float,
                 task: Optional[Any] = None, lost: bool = False, acking: bool = False,
                 job_id: str = ""):
        self.job_id = job.id if job is not None else job_id
        self.job = job  # type: ignore[assignment]  # (None: held)
        self.token = token
        self.extended_at = extended_at  # monotonic seconds of the last lease grant
        self.task = task  # the asyncio driver's task running it
        self.lost = lost
        self.acking = acking  # its outcome (or release) is being written: renew no more

    @property
    def held(self) -> bool:
        """Claimed, not started yet (no handler has it)."""
        return self.job is None

    def __repr__(self) -> str:
        return (f"RunningJob(job_id={self.job_id!r}, token={self.token!r}, held={self.held}, "
                f"lost={self.lost})")


def held_lease(job_id: str, token: str, extended_at: float) -> RunningJob:
    """The record of a job just claimed (see :class:`RunningJob`)."""
    return RunningJob(None, token, extended_at, job_id=job_id)


class Prefetch:
    """Jobs to hold beyond ``concurrency``: fixed (``limit``) or adaptive (``None``)."""

    def __init__(self, concurrency: int, limit: Optional[int]):
        self.concurrency = concurrency
        self.limit = limit
        self.handler_s: Optional[float] = None  # EWMA of handler run time
        # held (claimed, unstarted) jobs kept whatever the handlers' speed: a process
        # Worker keeps one per slot, so a freed slot starts one at once instead of
        # claiming (a held job is not started: pause and cancel still stop it)
        self.floor = 0

    def observe(self, seconds: float) -> None:
        """Record one handler run (called from handler threads; a lost update is harmless)."""
        avg = self.handler_s
        self.handler_s = seconds if avg is None else avg + _EWMA_WEIGHT * (seconds - avg)

    def extra(self) -> int:
        """How many jobs may wait beyond ``concurrency`` right now (claimed, leased)."""
        if self.limit is not None:
            return self.limit
        return max(self.floor, self.ahead())

    def ahead(self) -> int:
        """How many started jobs may wait for a handler slot: as many as the slots take up
        within the budget. A paused queue starts nothing more (start.lua is fenced), so
        this bounds how long after ``pause()`` a handler may still begin; the rest of the
        held jobs stay unstarted until a slot frees."""
        avg = self.handler_s
        if avg is None:
            return 0  # not timed yet: start only into free slots
        return min(PREFETCH_MAX, int(self.concurrency * PREFETCH_BUDGET_S / max(avg, 1e-7)))

    def capacity(self) -> int:
        """Jobs the worker may hold (running + waiting)."""
        return self.concurrency + self.extra()


class Solo:
    """The handler-slot budget of a Worker serving one queue alone, and the interface a
    :class:`~emqfast.worker.crew.Crew` fills in for the Workers of a many-queue Worker.
    The machine asks it (under the Worker's ``_guard`` where the machine holds it); the
    Worker ``w`` asking is passed in, so one instance serves every lone Worker."""

    name: Optional[str] = None  # a crew's Workers share its name

    def room(self, w: Any) -> Tuple[int, int]:
        """``(free handler slots, jobs w may claim now)``. Started jobs may queue for a
        slot only as long as the prefetch budget (~2 ms): held jobs beyond that stay
        unstarted. The claim room is the capacity minus every job held, started or not."""
        slots = max(w.concurrency + w._holding.ahead() - w._in_hand, 0)
        room = w._holding.capacity() - len(w._running) - len(w._held)
        return slots, max(room, 0)

    def waits_for_room(self, w: Any, slots: int, room: int) -> bool:
        """Neither a slot for a held job nor room to claim: wait for a change."""
        return room <= 0 and not (slots and w._held)

    def reserve(self, w: Any, slots: int) -> int:
        """How many of ``slots`` held jobs ``w`` may start now (until :meth:`unreserve`)."""
        return slots

    def unreserve(self, w: Any, n: int) -> None:
        """The ``n`` jobs reserved are started (or handed back)."""

    def joined(self, w: Any) -> None:
        """``w``'s claim loop begins."""

    def left(self, w: Any) -> None:
        """``w``'s claim loop ended."""

    def claimed(self, w: Any, reply: Any) -> None:
        """``w``'s claim ended with ``reply`` (None: no reply)."""

    def may_block(self, w: Any) -> bool:
        """After an empty claim: may ``w`` block on its marker (or wait for a slot)?"""
        return True

    def woke(self, w: Any, for_work: bool) -> None:
        """``w``'s wait on its marker ended (``for_work``: not by its time)."""

    def notify(self, w: Any) -> None:
        """A job of ``w`` ended or an outcome was written: wake the claim loop(s)."""
        w._wake()

    def presence(self, w: Any) -> Tuple[str, int, int]:
        """What ``w``'s heartbeat record says: (queue names, concurrency, jobs in hand)."""
        return w.queue.name, w.concurrency, len(w._running)

    def shared(self) -> Any:
        """What the queues of a many-queue Worker share on one client (its driver's:
        marker wait, cancel listener, gate); None: each Worker keeps its own."""
        return None

    def handler_pool(self, w: Any) -> Any:
        """The thread pool ``w``'s handlers run on for one run."""
        return ThreadPoolExecutor(w.concurrency, thread_name_prefix="emq-handler")

    def handler_threads(self, w: Any) -> HandlerThreads:
        """The thread Worker's handler threads for one run (no Future per task)."""
        return HandlerThreads(w.concurrency)

    def handler_slots(self, w: Any) -> AsyncSlots:
        """The asyncio handler slots of one run."""
        return AsyncSlots(w.concurrency)


SOLO = Solo()  # no state of its own: one for every lone Worker
