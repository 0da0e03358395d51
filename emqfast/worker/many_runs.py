"""Running a many-queue worker's members (:mod:`emqfast.worker.many`): a thread per queue
for the thread Worker, a task per queue for the asyncio Worker.

``run()`` serves every queue until :meth:`stop` or SIGTERM/SIGINT (one signal stops them
all; a second force-quits the thread Worker as for one queue). A member that stops on a
permanent error stops the others, and ``run()`` raises it.

``run_until_idle()`` (``emqfast worker --burst``) returns when all queues are idle at
once: every member runs until its queue is idle, and rounds repeat until one in which no
queue claimed anything (a queue that got work while another was still draining is served
in the next round).
"""
from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, List, Optional, Sequence

from emqfast.worker import signals
from emqfast.worker.async_slots import AsyncSlots
from emqfast.worker.many import Many
from emqfast.worker.outcomes import WorkerStats


def serve_many(driver: type, queues: Sequence[Any], handler: Callable[..., Any],
               **options: Any) -> Many:
    """The many-queue worker for ``driver`` (a Worker class): asyncio when its ``run`` is a
    coroutine function, else threads."""
    if inspect.iscoroutinefunction(getattr(driver, "run", None)):
        return AioMany(driver, queues, handler, **options)
    return ThreadMany(driver, queues, handler, **options)


def _remaining(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else max(deadline - time.monotonic(), 0.001)


class ThreadMany(Many):
    """``emqfast.Worker([q1, q2, ...], handler, order=..., weights=...)``."""

    _stopping = False

    # signals.install's force quit: a second signal reaches every member
    @property
    def _force_quit(self) -> bool:
        return any(getattr(m, "_force_quit", False) for m in self.members)

    @_force_quit.setter
    def _force_quit(self, value: bool) -> None:
        for m in self.members:
            m._force_quit = value

    @property
    def _stop(self) -> "ThreadMany":  # signals.install clears it after a force quit
        return self

    def clear(self) -> None:
        for m in self.members:
            m._stop.clear()

    def stop(self) -> None:
        """Stop claiming on every queue (graceful, as for one queue); a claim loop waiting
        for a handler slot (strict: a lower queue's) hears it now, not on its beat."""
        super().stop()
        with self.lock:
            self.notify_all()

    def run(self) -> WorkerStats:
        """Serve every queue until :meth:`stop` or SIGTERM/SIGINT (see the module)."""
        restore = signals.install(self.stop, self.name, worker=self)
        try:
            self._run_all(lambda m: m._serve(until_idle=False, deadline=None,
                                             wait_scheduled=False))
        finally:
            restore()
            self._done()
        return self.stats

    def run_until_idle(self, timeout_s: Optional[float] = 60.0, wait_scheduled: bool = False,
                       wait_active: bool = False) -> WorkerStats:
        """Process jobs until every queue is idle at once (see :meth:`emqfast.Worker.
        run_until_idle`); ``TimeoutError`` after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for m in self.members:
            m._wait_active = wait_active
        try:
            while not self._stopping:
                before = self.stats.claimed
                self._run_all(lambda m: m._serve(until_idle=True, deadline=deadline,
                                                 wait_scheduled=wait_scheduled))
                if self.stats.claimed == before:
                    break
        finally:
            self._done()
        return self.stats

    def _done(self) -> None:
        self._stopping = False  # a stop requested meanwhile was honoured
        self.clear()

    def _run_all(self, serve: Callable[[Any], None]) -> None:
        """Serve each member in a thread of its own (the first in the caller's); a member
        that raises stops the others; the first error is raised once all have ended."""
        errors: List[BaseException] = []

        def one(m: Any) -> None:
            try:
                serve(m)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                errors.append(exc)
                self.stop()

        self.order.reset()
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="emq-handler")
        threads = [threading.Thread(target=one, args=(m,), daemon=True,
                                    name=f"emq-queue-{m.queue.name}")
                   for m in self.members[1:]]
        for t in threads:
            t.start()
        try:
            one(self.members[0])
            for t in threads:
                t.join()
        finally:  # every member has waited for its handlers: the pool has nothing to run
            pool, self.pool = self.pool, None
            pool.shutdown(wait=False, cancel_futures=True)
        if errors:
            raise errors[0]


class AioMany(Many):
    """``emqfast.aio.Worker([q1, q2, ...], handler, order=..., weights=...)``."""

    _stopping = False

    async def run(self) -> WorkerStats:
        """Serve every queue until :meth:`stop`, SIGTERM/SIGINT or cancellation."""
        try:
            await self._run_all(lambda m: m.run())
        finally:
            self._stopping = False
        return self.stats

    async def run_until_idle(self, timeout_s: Optional[float] = 60.0,
                             wait_scheduled: bool = False,
                             wait_active: bool = False) -> WorkerStats:
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
        self.sem = AsyncSlots(self.concurrency)
        results = await asyncio.gather(*(one(m) for m in self.members), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
