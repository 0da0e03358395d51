"""Group commit: concurrent :class:`~emqfast.core.ops.Gathered` items of one process that
go to the same destination share round trips.

Per client and ``Gathered.key`` there is one gate. An item that finds its gate idle is
flushed at once, alone, by its own caller (a lone call costs what it cost before). Items
arriving while a flush is in flight wait; when that flush returns, the waiting items go
out together in the next flush, led by one of them:

- threads (:func:`submit`): the first waiting thread is woken to lead the next flush on its
  own connection, so a leader returns as soon as its own flush has (no thread is held up
  by others' jobs, and no helper thread exists);
- asyncio (:func:`submit_async`): a call that finds its gate idle first lets the loop run
  the tasks already ready (one turn, no timer), so those woken together by a flush's
  replies go out together; a flush of several runs in a task of its own, so a cancelled
  caller never strands the others.

Each caller gets its own outcome: a reply, or an exception raised to it alone. The
gates are per process: a forked child starts with none (a gate's lock or waiters belong
to the parent's threads), and are kept per client object (a client per event loop under
asyncio).
"""
from __future__ import annotations

import asyncio
import copy
import os
import threading
import weakref
from typing import Any, Awaitable, Callable, Dict, Hashable, List, Optional, Set

from emqfast.core.errors import ReplyLost
from emqfast.core.ops import Gathered, Op

__all__ = ["submit", "submit_async", "submit_to_async", "gate_async", "forks", "own", "Drive",
           "DriveAsync"]

Drive = Callable[[Op], Any]  # runs a flush operation on the caller's connection
DriveAsync = Callable[[Op], Awaitable[Any]]


class _Waiter:
    """One thread waiting in a gate: for its outcome, or to lead the next flush."""

    __slots__ = ("req", "outcome", "batch", "done", "wake", "then")

    def __init__(self, req: Gathered) -> None:
        self.req = req
        self.outcome: Any = None
        self.batch: Optional[List["_Waiter"]] = None  # set: lead this flush (self first)
        self.done = False  # outcome or batch set (read after an interrupted wait)
        self.wake = threading.Lock()  # held until the outcome or the lead is handed over
        self.wake.acquire()
        self.then: Optional["_Waiter"] = None  # the next of its flush to wake (a chain)


class _Gate:
    """The threads' state of one (client, key): a flush in flight, and who waits."""

    __slots__ = ("mutex", "busy", "queue")

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.busy = False
        self.queue: List[_Waiter] = []


class _AsyncGate:
    """The asyncio state of one (client, key): a flush in flight, and who waits."""

    __slots__ = ("busy", "queue", "tasks")

    def __init__(self) -> None:
        self.busy = False
        self.queue: List[Any] = []  # (request, future) pairs
        self.tasks: Set["asyncio.Task[None]"] = set()  # flushes running (kept referenced)


_Gates = Dict[Hashable, Any]
_registry: "weakref.WeakKeyDictionary[Any, _Gates]" = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


_forks = 0  # forks this process descends from: a gate kept by a caller before is its parent's


def _reset_after_fork() -> None:
    # The child's only thread is the one that forked: every gate (its lock possibly held,
    # its waiters the parent's threads) stays with the parent.
    global _registry, _registry_lock, _forks
    _registry = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()
    _forks += 1


def forks() -> int:
    """How many forks this process descends from: a caller keeping a gate
    (:func:`gate_async`) looks it up again when this changed."""
    return _forks


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _gate(client: Any, key: Hashable, kind: type) -> Any:
    gates = _registry.get(client)
    gate = None if gates is None else gates.get(key)
    if gate is None:
        with _registry_lock:
            gates = _registry.setdefault(client, {})
            gate = gates.setdefault(key, kind())
    return gate


def own(exc: BaseException) -> BaseException:
    """A copy of ``exc`` for one caller (one exception object raised in many threads would
    share one traceback), its cause kept."""
    try:
        mine = copy.copy(exc)
    except Exception:  # noqa: BLE001 - an exception that does not copy: share it
        return exc
    mine.__cause__ = exc.__cause__
    mine.__context__ = exc.__context__
    return mine


def _lost(exc: BaseException, n: int) -> List[Any]:
    """Outcomes for a flush ended by ``exc`` (an interrupt, or a fault in the flush itself):
    what it sent is of unknown fate."""
    err = ReplyLost(f"a shared call was interrupted ({type(exc).__name__}: {exc}); "
                    "its jobs may or may not have been written")
    err.__cause__ = exc
    return [own(err) for _ in range(n)]


# --- threads --------------------------------------------------------------------------------

def submit(client: Any, req: Gathered, drive: Drive) -> Any:
    """This item's outcome (see the module doc), on the calling thread; ``drive`` runs a
    flush on this thread's connection."""
    gate: _Gate = _gate(client, req.key, _Gate)
    me: Optional[_Waiter] = None
    with gate.mutex:
        if gate.busy:
            me = _Waiter(req)
            gate.queue.append(me)
        else:
            gate.busy = True
    if me is None:  # nothing in flight: out at once, alone
        return _lead(gate, req, drive, [req.item], [])
    try:
        _wait(gate, me, drive)
    finally:  # (even when interrupted: the waiters after it are woken by it alone)
        if me.batch is None:
            _pass_on(me)
    if me.batch is not None:
        return _lead(gate, req, drive, [w.req.item for w in me.batch], me.batch[1:])
    return me.outcome


def _wait(gate: _Gate, me: _Waiter, drive: Drive) -> None:
    try:
        me.wake.acquire()
    except BaseException:  # interrupted (KeyboardInterrupt in the main thread)
        with gate.mutex:
            if me in gate.queue:  # not taken yet: never sent
                gate.queue.remove(me)
                raise
        # taken: its job is on its way, or this thread leads the next flush; see it through
        while not me.done:
            me.wake.acquire(timeout=0.05)
        if me.batch is not None:
            _lead(gate, me.req, drive, [w.req.item for w in me.batch], me.batch[1:])
        raise


def _lead(gate: _Gate, req: Gathered, drive: Drive, items: List[Any],
          others: List[_Waiter]) -> Any:
    """Flush ``items`` (this thread's first), hand the gate on, tell ``others``."""
    interrupt: Optional[BaseException] = None
    try:
        outcomes = drive(req.flush(items))
    except BaseException as exc:  # noqa: BLE001 - nobody may be left waiting
        interrupt, outcomes = exc, _lost(exc, len(items))
    _hand_on(gate)
    # Wake one waiter; each wakes the next as it goes (_pass_on): one thread at a time
    # takes the GIL, where waking all at once sends all but one back to sleep on it.
    for i, (waiter, outcome) in enumerate(zip(others, outcomes[1:]), 1):
        waiter.outcome, waiter.done = outcome, True
        waiter.then = others[i] if i < len(others) else None
    if others:
        others[0].wake.release()
    if interrupt is not None:
        raise interrupt
    return outcomes[0]


def _pass_on(me: _Waiter) -> None:
    """Wake the next waiter of ``me``'s flush (its outcome is set already)."""
    then = me.then
    if then is not None:
        me.then = None
        then.wake.release()


def _hand_on(gate: _Gate) -> None:
    """Wake the first waiting thread to lead a flush of the waiting items, or go idle."""
    with gate.mutex:
        if not gate.queue:
            gate.busy = False
            return
        limit = max(1, gate.queue[0].req.limit)
        batch = gate.queue[:limit]
        del gate.queue[:limit]
    head = batch[0]
    head.batch, head.done = batch, True
    head.wake.release()


# --- asyncio --------------------------------------------------------------------------------

def submit_async(client: Any, req: Gathered, drive: DriveAsync) -> Awaitable[Any]:
    """This item's outcome (see the module doc), to await in the running event loop."""
    return submit_to_async(_gate(client, req.key, _AsyncGate), req, drive)


def gate_async(client: Any, key: Hashable) -> "_AsyncGate":
    """The asyncio gate of ``client`` and ``key``, for a caller to keep and pass to
    :func:`submit_to_async` (looked up again in its event loop's client, and after a
    fork: see :func:`forks`)."""
    gate: _AsyncGate = _gate(client, key, _AsyncGate)
    return gate


def submit_to_async(gate: "_AsyncGate", req: Gathered, drive: DriveAsync,
                    loop: Optional[asyncio.AbstractEventLoop] = None) -> Awaitable[Any]:
    """:func:`submit_async` through a gate the caller kept (:func:`gate_async`);
    ``loop``: the running event loop, when the caller has it at hand."""
    if gate.busy:
        # the future itself, no coroutine around it: most callers take this way
        future = (loop or asyncio.get_running_loop()).create_future()
        gate.queue.append((req, future))
        return future  # cancelled while queued: the flush skips it (never sent)
    return _lead_async(gate, req, drive)


async def _lead_async(gate: _AsyncGate, req: Gathered, drive: DriveAsync) -> Any:
    """Let the ready tasks' items join ``req`` and send them (or ``req`` alone)."""
    gate.busy = True  # (here, not in submit_async: a coroutine never awaited holds nothing)
    try:
        # one turn of the loop first: the tasks already ready in it (those woken by the
        # last flush's replies) join this call instead of waiting behind it
        await asyncio.sleep(0)
    except BaseException:  # cancelled before anything was sent
        _hand_on_async(gate, drive)
        raise
    if gate.queue:  # others joined: one flush in a task of its own, as for any batch
        future = asyncio.get_running_loop().create_future()
        gate.queue.insert(0, (req, future))
        _hand_on_async(gate, drive)
        return await future
    try:  # alone: out now, from this task
        outcomes = await drive(req.flush([req.item]))
    finally:
        _hand_on_async(gate, drive)
    return outcomes[0]


def _hand_on_async(gate: _AsyncGate, drive: DriveAsync) -> None:
    """Start a task flushing the waiting items (callers cancelled meanwhile left out), or
    go idle."""
    live = [(req, future) for req, future in gate.queue if not future.done()]
    if not live:
        gate.queue.clear()
        gate.busy = False
        return
    limit = max(1, live[0][0].limit)
    batch, gate.queue = live[:limit], live[limit:]
    task = asyncio.get_running_loop().create_task(_flush_async(gate, drive, batch))
    gate.tasks.add(task)
    task.add_done_callback(gate.tasks.discard)


async def _flush_async(gate: _AsyncGate, drive: DriveAsync, batch: List[Any]) -> None:
    try:
        outcomes = list(await drive(batch[0][0].flush([req.item for req, _ in batch])))
    except BaseException as exc:  # noqa: BLE001 - nobody may be left waiting
        outcomes = _lost(exc, len(batch))
        if not isinstance(exc, Exception):
            _deliver(batch, outcomes)
            _hand_on_async(gate, drive)
            raise
    _hand_on_async(gate, drive)
    _deliver(batch, outcomes)


def _deliver(batch: List[Any], outcomes: List[Any]) -> None:
    for (_, future), outcome in zip(batch, outcomes):
        if not future.done():  # a caller cancelled after its job went out: nobody to tell
            future.set_result(outcome)
