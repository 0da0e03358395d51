"""Running the asyncio Worker's crew (:mod:`emqfast.worker.crew`): a task per queue.

``run()`` serves every queue until :meth:`AioCrew.stop`, SIGTERM/SIGINT or the
cancellation of the task awaiting it; a member that stops on a permanent error stops the
others, and ``run()`` raises it. ``run_until_idle()`` returns when all queues are idle
at once (rounds repeat until one in which no queue claimed anything).

The members share one set of ``concurrency`` handler slots and, for plain handlers, one
executor of ``concurrency`` threads (made for each ``run()`` or round of
``run_until_idle()``, shut down at its end).
Members on one single-server ``redis.asyncio`` client share :class:`SharedParts`
(:meth:`AioCrew.shared`): one marker wait, one cancel listener, a gate on their
requests, one eviction check.
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence

import redis.asyncio as aredis

from emqfast.aio.many_shared import SharedParts
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.crew import Crew
from emqfast.worker.outcomes import WorkerStats


def _remaining(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(deadline - time.monotonic(), 0.001)


class AioCrew(Crew):
    """The crew of ``emqfast.aio.Worker([q1, q2, ...], handler, order=..., weights=...)``."""

    def __init__(self, make: Callable[[Any, Crew], Any], queues: Sequence[Any], **options: Any):
        super().__init__(make, queues, **options)
        self._parts: Optional[SharedParts] = None

    def shared(self) -> Optional[SharedParts]:
        """The parts the members share in this run (None: each keeps its own)."""
        return self._parts

    def _share(self) -> None:
        """Made on the running loop before the members serve (again on another loop: its
        client, events and gate are that loop's); none unless every queue uses one
        single-server client (a Cluster's markers live in different slots)."""
        loop = asyncio.get_running_loop()
        if self._parts is not None and self._parts.loop is loop:
            return
        clients: List[Any] = list({id(m.queue.redis): m.queue.redis
                                   for m in self.members}.values())
        single = len(clients) == 1 and isinstance(clients[0], aredis.Redis)
        self._parts = SharedParts(clients[0], self.members, self.name) if single else None

    async def run(self) -> WorkerStats:
        """Serve every queue until :meth:`stop`, SIGTERM/SIGINT or cancellation."""
        try:
            await self._run_all(lambda m: m.run())
        finally:
            self._stopping = False
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float], wait_scheduled: bool,
                             wait_active: bool) -> WorkerStats:
        """Process jobs until every queue is idle at once; ``TimeoutError`` after
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            while not self._stopping:
                before = self.stats.claimed
                await self._run_all(lambda m: m.run_until_idle(
                    timeout_s=_remaining(deadline), wait_scheduled=wait_scheduled,
                    wait_active=wait_active))
                if self.stats.claimed == before:
                    break
        finally:
            self._stopping = False
        return self.stats

    async def _run_all(self, serve: Callable[[Any], Any]) -> None:
        """A task per member; one that raises stops the others; the first error is raised
        once all have ended (a cancellation of the caller reaches every member)."""
        async def one(m: Any) -> None:
            try:
                await serve(m)
            except BaseException:
                self.stop()
                raise

        self.order.reset()
        self._share()
        self.slots = AsyncSlots(self.concurrency)
        if not self.members[0]._is_coro:  # plain handlers: one thread per shared slot
            self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="emq-handler")
        try:
            results = await asyncio.gather(*(one(m) for m in self.members),
                                           return_exceptions=True)
        finally:  # every member has waited for its handlers, but for abandoned ones
            pool, self.pool = self.pool, None
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
