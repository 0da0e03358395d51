"""The asyncio Workers' handler slots (one queue's, or shared by a many-queue Worker): at
most ``concurrency`` handlers run at once.

What :class:`asyncio.Semaphore` does, with a synchronous fast path: the Worker
starts jobs only into free slots (plus the few the prefetch budget lets wait), so a job's
task nearly always finds a slot free, and takes it without a coroutine, an
``async with`` or a scan of the waiters; only a task that finds none awaits one.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Deque


class AsyncSlots:
    """``concurrency`` slots, handed to waiting tasks first come, first served."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, concurrency: int):
        self._free = concurrency
        self._waiters: Deque["asyncio.Future[None]"] = deque()

    def take_now(self) -> bool:
        """Take a free slot without waiting; False when none is free (or tasks wait)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot (after :meth:`take_now` said False). Cancelled while waiting,
        it takes none: a slot handed over in that instant passes on to the next task."""
        waiter: "asyncio.Future[None]" = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.give()  # handed a slot as the cancel landed: not ours to keep
            else:
                try:
                    self._waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def give(self) -> None:
        """A handler ended: its slot goes to the longest-waiting task, else back free."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    @property
    def free(self) -> int:
        """Slots neither held nor promised to a waiting task."""
        return self._free
