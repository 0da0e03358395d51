"""One worker, many queues: ``Worker([q_high, q_default, q_low], handler, ...)``.

Composed, not rewritten: the worker runs one ordinary single-queue Worker (the driver's
own class, thread or asyncio) per queue, each with its own claim loop, wake marker,
leases, beat (extend, promote, reap, trim, schedules), pause check, rate limits and
groups, stats and heartbeat record (under its queue, listing every queue of the worker).
What they share is made here:

- one budget of ``concurrency`` handler slots (and one adaptive prefetch) across the
  queues: :meth:`Member._room` counts every member's running and held jobs, a member
  reserves the slots it starts into, and the handlers run on one thread pool (asyncio:
  under one semaphore) of ``concurrency``, swapped in for each member's own;
- the claim order (:mod:`emqfast.worker.queue_order`): ``strict`` or ``weighted``;
- one lock (threads) and wake-ups that reach every member (a job of one queue ending may
  let another queue claim).

Each member's claim loop runs in a thread (asyncio: a task) of its own. Members on one
single-server client share one marker wait, one cancel listener and a gate on their
requests (:mod:`emqfast.worker.many_shared`, :mod:`emqfast.aio.many_shared`); on a
Cluster each member blocks on its own queue's marker (``BZPOPMIN``). Either way an idle
worker burns no CPU and wakes in a round trip when any queue gets work. A single queue
(``Worker(q, ...)``) never comes here.
"""
from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from emqfast.core.errors import InputTypeError, InvalidInput
from emqfast.core.ops import Logic
from emqfast.worker import calls
from emqfast.worker.machine import Heartbeat
from emqfast.worker.leases import Prefetch
from emqfast.worker.queue_order import QueueOrder
from emqfast.worker.outcomes import WorkerStats

if TYPE_CHECKING:  # a checker sees the machine it is mixed into; at run time: object
    from emqfast.worker.machine import WorkerMachine as _Base
else:
    _Base = object

_MEMBER_CLASSES: Dict[Tuple[type, Optional[type]], type] = {}


class Member(_Base):
    """Mixed before a driver class: one queue's Worker inside a :class:`Many`."""

    _many: "Many"
    _index: int
    _dry = False  # the last claim came back empty while this member held jobs

    # the thread driver notifies a claim loop waiting for a slot only when this says one
    # waits: any member's loop may be the one waiting (they share one lock)
    @property
    def _awaiting_slot(self) -> bool:
        many = self.__dict__.get("_many")
        return many is not None and bool(many.awaiting)

    @_awaiting_slot.setter
    def _awaiting_slot(self, waiting: bool) -> None:
        many = self.__dict__.get("_many")
        if many is not None:
            (many.awaiting.add if waiting else many.awaiting.discard)(self._index)

    # the handlers' capacity is the worker's, not each member's: the thread driver's pool
    # and the asyncio driver's semaphore, made per run by the driver, are swapped for the
    # worker's one (Many.pool / Many.sem) as they are set
    @property
    def _pool(self) -> Any:
        return self.__dict__.get("_pool_in_use")

    @_pool.setter
    def _pool(self, pool: Any) -> None:
        many = self.__dict__.get("_many")
        if pool is not None and many is not None and many.pool is not None:
            pool.shutdown(wait=False)  # the member's own: no thread started yet
            pool = SharedPool(many.pool)
        self.__dict__["_pool_in_use"] = pool

    @property
    def _sem(self) -> Any:
        return self.__dict__.get("_sem_in_use")

    @_sem.setter
    def _sem(self, sem: Any) -> None:
        many = self.__dict__.get("_many")
        if sem is not None and many is not None and many.sem is not None:
            sem = many.sem
        self.__dict__["_sem_in_use"] = sem

    def _room(self) -> Tuple[int, int]:
        return self._many.room(self)

    def _notify(self) -> None:
        self._many.notify_all()

    def _serve_loop(self, until_idle: bool, deadline: Optional[float],
                    wait_scheduled: bool) -> Logic:
        with self._guard:
            self._many.order.join(self._index)
        try:
            yield from super()._serve_loop(until_idle, deadline, wait_scheduled)
        finally:
            with self._guard:
                self._many.order.leave(self._index)
                self._many.notify_all()

    def _waits_for_room(self, slots: int, room: int) -> bool:
        """As for one queue, and after an empty claim while holding jobs (``_dry``): wait
        for a slot to start them, not claim again at once."""
        return (room <= 0 or self._dry) and not (slots and self._held)

    def _start_held(self, slots: int) -> Logic:
        """Start held jobs into slots reserved first: the other members' loops, deciding
        meanwhile, must not count the same free slot (in hand only once started)."""
        with self._guard:
            n = min(slots, self._many.free_slots(self), len(self._held))
            self._many.reserved += n
        try:
            yield from super()._start_held(n)
        finally:
            with self._guard:
                self._many.reserved -= n

    def _claim(self, n: int) -> Logic:
        self._dry = False
        reply = None
        try:
            reply = yield from super()._claim(n)
            return reply
        finally:
            with self._guard:
                if self._many.order.claimed(self._index):
                    self._many.notify_all()
            if reply is not None and calls.parse_claim(reply)[3]:  # it has work: ready
                self._many.set_ready(self, True)

    def _wait_for_work(self, until_idle: bool, now: int, status: int, next_due: int) -> Logic:
        """An empty claim: not ready while blocked on the marker (lower queues may claim).
        Still holding claimed jobs that wait for a slot, it waits for one instead (see
        :meth:`_waits_for_room`): a slot freed by any queue's handler wakes that wait, and
        would not end a wait on this queue's marker."""
        if self._held:
            self._dry = True
            return False
        # Not ready (lower queues may claim) until work wakes it: a wait that ends by its
        # time (the beat) leaves it idle, or with many queues one of them would always be
        # up for its beat and the lowest would never claim; its own next claim that
        # leases jobs makes it ready again (see _claim).
        self._many.set_ready(self, False)
        woken = True  # (an error: ready, as before it waited)
        try:
            woken = yield from super()._wait_for_work(until_idle, now, status, next_due)
        finally:
            if woken:
                self._many.set_ready(self, True)
        return woken


class SharedPool:
    """The worker's one handler pool as a member sees it: a member's shutdown must not
    shut it (the others still run handlers on it); the worker shuts it at its end."""

    def __init__(self, pool: Any):
        self._real = pool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._real.submit(fn, *args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """A member's: nothing (see the class docstring)."""


def member_class(driver: type, shared: Optional[type] = None) -> type:
    """``driver`` (a Worker class) with :class:`Member` mixed in (and ``shared``, what the
    members of its kind share, before it), made once per pair."""
    cls = _MEMBER_CLASSES.get((driver, shared))
    if cls is None:
        bases = (Member, driver) if shared is None else (shared, Member, driver)
        cls = type(driver.__name__, bases, {"__module__": driver.__module__,
                                            "__qualname__": driver.__qualname__})
        _MEMBER_CLASSES[(driver, shared)] = cls
    return cls


class ManyHeartbeat(Heartbeat):
    """A member's heartbeat: the record under its queue lists every queue of the worker
    and the whole worker's concurrency and jobs in hand (the dashboard's Workers page)."""

    def __init__(self, machine: Any, many: "Many"):
        super().__init__(machine)
        self.many = many

    def fields(self) -> Dict[str, Any]:
        fields = super().fields()
        fields.update(queues=",".join(self.many.queue_names), concurrency=self.many.concurrency,
                      in_hand=sum(len(m._running) for m in self.many.members))
        return fields


def check_queues(queues: Any) -> List[Any]:
    """The queue list of a many-queue worker: a non-empty list of distinct queues."""
    if not isinstance(queues, (list, tuple)):
        raise InputTypeError(f"queues must be a list, not {type(queues).__name__}")
    if not queues:
        raise InvalidInput("a worker needs at least one queue")
    names = [getattr(q, "name", None) for q in queues]
    if len(set(names)) != len(names):
        raise InvalidInput(f"a queue is listed twice: {names}")
    return list(queues)


class Many:
    """What the members of a many-queue worker share; :mod:`emqfast.worker.many_runs`
    adds running them (threads or asyncio)."""

    shared_parts: Optional[type] = None  # mixed into the members before Member (threads)

    def __init__(self, driver: type, queues: Sequence[Any], handler: Callable[..., Any], *,
                 order: str = "strict", weights: Optional[Sequence[int]] = None,
                 concurrency: int = 8, prefetch: Optional[int] = None,
                 name: Optional[str] = None, **options: Any):
        queues = check_queues(queues)
        self.order = QueueOrder(len(queues), order, weights)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.awaiting: "set[int]" = set()  # members whose claim loop waits for a slot
        self.reserved = 0  # slots a member's loop is starting held jobs into right now
        self.pool: Any = None  # threads: the handler pool of a run (many_runs makes it)
        self.sem: Any = None   # asyncio: the handler semaphore of a run (likewise)
        self.lock = threading.Condition()  # the thread members' one lock
        # what the members share: the driver's own kind (asyncio names it), else this one's
        cls = member_class(driver, getattr(driver, "many_shared_parts", None)
                           or self.shared_parts)
        self._wake: Callable[[Any], None] = getattr(driver, "_notify")  # the driver's own
        self.members: List[Any] = [cls(q, handler, concurrency=concurrency, prefetch=prefetch,
                                       name=self.name, **options) for q in queues]
        self.queue_names: List[str] = [m.queue.name for m in self.members]
        self.concurrency: int = self.members[0].concurrency
        self.holding = Prefetch(self.concurrency, self.members[0].prefetch)
        for i, m in enumerate(self.members):
            self._adopt(i, m)

    def _adopt(self, i: int, m: Any) -> None:
        m._many, m._index = self, i
        m._holding = self.holding
        if hasattr(m, "_lock"):  # the thread driver: one lock, so one notify reaches all
            m._lock = m._guard = self.lock
        beat = ManyHeartbeat(m, self)
        m.beat_hooks = [beat if h is m._heartbeat else h for h in m.beat_hooks]
        m._heartbeat = beat

    # --- shared by the members (called under their lock) ------------------------------
    def room(self, m: Any) -> Tuple[int, int]:
        """``(free handler slots, jobs it may claim)`` for member ``m``: the worker's one
        budget, narrowed by the claim order."""
        members = self.members
        busy = sum(len(x._running) + len(x._held) for x in members)
        slots = self.free_slots(m)
        room = max(self.holding.capacity() - busy, 0)
        holding = [bool(x._held) for x in members]
        turn = self.order.turn
        if not self.order.may_claim(m._index, holding):
            room = 0
            if self.order.turn != turn:  # a new round was drawn: wake its queue
                self.notify_all()
        elif not self.order.strict:
            # a weighted round claims at most a handler pool's worth: with fast handlers
            # the prefetch budget would let one draw take hundreds of jobs, and the split
            # (per draw) would stray far from the weights per job
            room = min(room, self.concurrency)
        return slots, room

    def free_slots(self, m: Any) -> int:
        """Handler slots member ``m`` may start held jobs into now."""
        if not self.order.may_start(m._index, [bool(x._held) for x in self.members]):
            return 0
        in_hand: int = sum(x._in_hand for x in self.members) + self.reserved
        return max(self.concurrency + self.holding.ahead() - in_hand, 0)

    def set_ready(self, m: Any, ready: bool) -> None:
        with m._guard:
            if self.order.set_ready(m._index, ready) and not ready:
                self.notify_all()

    def notify_all(self) -> None:
        """Wake every member's claim loop (the caller holds the lock under threads)."""
        for m in self.members:
            self._wake(m)

    # --- the public face --------------------------------------------------------------
    @property
    def queues(self) -> List[Any]:
        return [m.queue for m in self.members]

    @property
    def stats(self) -> WorkerStats:
        """What the whole worker did (the sum over its queues; ``stats_by_queue``: each)."""
        total = WorkerStats()
        for m in self.members:
            for field in vars(total):
                setattr(total, field, getattr(total, field) + getattr(m.stats, field))
        return total

    @property
    def stats_by_queue(self) -> Dict[str, WorkerStats]:
        return {m.queue.name: m.stats for m in self.members}

    def stop(self) -> None:
        """Stop claiming on every queue (graceful, as for one queue)."""
        self._stopping = True
        for m in self.members:
            m.stop()
