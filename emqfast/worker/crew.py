"""How the queues of a many-queue Worker share its handler slots: one :class:`Crew`.

``Worker([q_high, q_default, q_low], handler, ...)`` serves each queue with a Worker of
its own (the same class, thread or asyncio: its own claim loop, wake marker, leases,
beat, pause check, rate limits and groups, stats and heartbeat record) and one
:class:`Crew` they all hold. The machine asks its crew, never the other Workers:

- the budget: ``concurrency`` handler slots (and one adaptive prefetch) across the
  queues: :meth:`Crew.room` counts every member's running and held jobs, a member
  reserves the slots it starts into, and the handlers run on one pool (asyncio: under
  one set of slots) of ``concurrency``;
- the claim order (:mod:`emqfast.worker.queue_order`): ``strict``, ``weighted`` or
  ``rotate``;
- wake-ups that reach every member (a job of one queue ending may let another claim).

A Worker of one queue holds :data:`~emqfast.worker.leases.SOLO` instead: its own
budget, nothing shared (:class:`~emqfast.worker.leases.Solo` is the interface). The
drivers' crews (:class:`emqfast.worker.crew_threads.ThreadCrew`,
:class:`emqfast.aio.crew.AioCrew`) add running the members, and what they share on one
single-server client: one marker wait, one cancel listener, a gate on requests.
"""
from __future__ import annotations

import os
import socket
import threading
import uuid
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from emqfast.core.errors import InputTypeError, InvalidInput
from emqfast.worker import calls
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.leases import Prefetch, Solo
from emqfast.worker.outcomes import WorkerStats
from emqfast.worker.queue_order import QueueOrder


class SharedPool:
    """The crew's one handler pool as a member sees it: a member's shutdown must not shut
    it (the others still run handlers on it); the crew shuts it at its end."""

    def __init__(self, pool: Any):
        self._real = pool

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._real.submit(fn, *args)

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """A member's: nothing (see the class docstring)."""


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


class Crew(Solo):
    """The Workers (members) of one many-queue Worker: their one budget, their claim order
    and their wake-ups. ``make(queue, crew)`` makes a member Worker (the driver's class)."""

    _stopping = False

    def __init__(self, make: Callable[[Any, "Crew"], Any], queues: Sequence[Any], *,
                 order: str = "strict", weights: Optional[Sequence[int]] = None,
                 name: Optional[str] = None):
        queues = check_queues(queues)
        self.order = QueueOrder(len(queues), order, weights)
        self.name: str = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.awaiting: Set[int] = set()  # members whose claim loop waits for a slot
        self.reserved = 0  # slots a member's loop is starting held jobs into right now
        self.pool: Any = None  # threads: the handler pool of a run (the driver's crew makes it)
        self.slots: Optional[AsyncSlots] = None  # asyncio: the handler slots of a run
        self.lock = threading.Condition()  # the thread members' one lock
        self.dry: Set[int] = set()  # members whose last claim came back empty holding jobs
        self.members: List[Any] = [make(queue, self) for queue in queues]
        self.queue_names: List[str] = [m.queue.name for m in self.members]
        self.concurrency: int = self.members[0].concurrency
        self.holding = Prefetch(self.concurrency, self.members[0].prefetch)
        for i, m in enumerate(self.members):
            m._index, m._holding = i, self.holding

    # --- the machine's questions (under the members' lock) --------------------------------
    def room(self, w: Any) -> Tuple[int, int]:
        """``(free handler slots, jobs w may claim)``: the worker's one budget, narrowed
        by the claim order."""
        members = self.members
        busy = sum(len(x._running) + len(x._held) for x in members)
        slots = self._free_slots(w)
        room = max(self.holding.capacity() - busy, 0)
        holding = [bool(x._held) for x in members]
        turn = self.order.turn
        if not self.order.may_claim(w._index, holding):
            room = 0
            if self.order.turn != turn:  # a new round was drawn: wake its queue
                self._notify_all()
        elif not self.order.strict and not self.order.rotate:
            # a weighted round claims at most a handler pool's worth: with fast handlers
            # the prefetch budget would let one draw take hundreds of jobs, and the split
            # (per draw) would stray far from the weights per job
            room = min(room, self.concurrency)
        return slots, room

    def _free_slots(self, w: Any) -> int:
        """Handler slots member ``w`` may start held jobs into now."""
        if not self.order.may_start(w._index, [bool(x._held) for x in self.members]):
            return 0
        in_hand: int = sum(x._in_hand for x in self.members) + self.reserved
        return max(self.concurrency + self.holding.ahead() - in_hand, 0)

    def waits_for_room(self, w: Any, slots: int, room: int) -> bool:
        """As for one queue, and after an empty claim while holding jobs (dry): wait for a
        slot to start them, not claim again at once."""
        return (room <= 0 or w._index in self.dry) and not (slots and w._held)

    def joined(self, w: Any) -> None:
        with w._guard:
            self.order.join(w._index)

    def left(self, w: Any) -> None:
        with w._guard:
            self.order.leave(w._index)
            self._notify_all()

    def reserve(self, w: Any, slots: int) -> int:
        """Reserved first: the other members' loops, deciding meanwhile, must not count
        the same free slot (in hand only once started)."""
        with w._guard:
            n = min(slots, self._free_slots(w), len(w._held))
            self.reserved += n
        return n

    def unreserve(self, w: Any, n: int) -> None:
        with w._guard:
            self.reserved -= n

    def claimed(self, w: Any, reply: Any) -> None:
        self.dry.discard(w._index)
        with w._guard:
            if self.order.claimed(w._index):
                self._notify_all()
        if reply is not None and calls.claimed_any(reply):  # it has work: ready
            self._set_ready(w, True)

    def may_block(self, w: Any) -> bool:
        """An empty claim: not ready while blocked on the marker (lower queues may claim).
        Still holding claimed jobs that wait for a slot, it waits for one instead (see
        :meth:`waits_for_room`): a slot freed by any queue's handler wakes that wait, and
        would not end a wait on this queue's marker."""
        if w._held:
            self.dry.add(w._index)
            return False
        # Not ready (lower queues may claim) until work wakes it: a wait that ends by its
        # time (the beat) leaves it idle, or with many queues one of them would always be
        # up for its beat and the lowest would never claim; its own next claim that
        # leases jobs makes it ready again (see claimed).
        self._set_ready(w, False)
        return True

    def woke(self, w: Any, for_work: bool) -> None:
        if for_work:
            self._set_ready(w, True)

    def _set_ready(self, w: Any, ready: bool) -> None:
        with w._guard:
            if self.order.set_ready(w._index, ready) and not ready:
                self._notify_all()

    def notify(self, w: Any) -> None:
        self._notify_all()

    def _notify_all(self) -> None:
        """Wake every member's claim loop (the caller holds the lock under threads)."""
        for m in self.members:
            m._wake()

    def presence(self, w: Any) -> Tuple[str, int, int]:
        """Each member's heartbeat record lists every queue of the worker and the whole
        worker's concurrency and jobs in hand (the dashboard's Workers page)."""
        return (",".join(self.queue_names), self.concurrency,
                sum(len(m._running) for m in self.members))

    def handler_pool(self, w: Any) -> Any:
        """The crew's pool (made per run by the thread crew), as a member may hold it."""
        assert self.pool is not None
        return SharedPool(self.pool)

    def handler_threads(self, w: Any) -> Any:
        """The thread crew's handler threads (made per run), as a member may hold them."""
        return self.handler_pool(w)

    def handler_slots(self, w: Any) -> AsyncSlots:
        """The crew's slots (made per run by the asyncio crew)."""
        assert self.slots is not None
        return self.slots

    # --- the public face of the Worker that holds this crew -------------------------------
    @property
    def queues(self) -> List[Any]:
        return [m.queue for m in self.members]

    @property
    def stats(self) -> WorkerStats:
        """What the whole worker did (the sum over its queues)."""
        return WorkerStats.total(m.stats for m in self.members)

    def stop(self) -> None:
        """Stop claiming on every queue (graceful, as for one queue)."""
        self._stopping = True
        for m in self.members:
            m.stop()


def expand_partitioned(queue: Any, partitions: Optional[Sequence[int]],
                       order: Optional[str]) -> Tuple[Any, str]:
    """What a Worker serves, and in which order: a partitioned queue becomes the list of
    its partitions (all, or those listed in ``partitions``, for affinity), served in
    rotation unless ``order`` says otherwise; a list of queues keeps ``order`` (default
    ``strict``), a partitioned queue in it standing for all its partitions."""
    if getattr(queue, "is_partitioned", False):
        if partitions is None:
            picks: List[int] = list(range(queue.partitions))
        elif isinstance(partitions, (str, bytes)) or not isinstance(partitions, Sequence):
            raise InputTypeError("partitions takes a list of partition numbers, not "
                                 f"{type(partitions).__name__}")
        else:
            picks = list(partitions)
            if not picks or len(set(picks)) != len(picks):
                raise InvalidInput(f"partitions must list distinct partition numbers: {picks}")
        return [queue.partition(i) for i in picks], order or "rotate"
    if partitions is not None:
        raise InvalidInput("partitions= picks partitions of a partitioned queue "
                           "(Queue(name, conn, partitions=P))")
    if isinstance(queue, (list, tuple)) and any(getattr(q, "is_partitioned", False)
                                                for q in queue):
        queue = [p for q in queue for p in (q.partition_queues
                                             if getattr(q, "is_partitioned", False) else [q])]
    return queue, order or "strict"
