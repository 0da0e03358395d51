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
from typing import Any, Callable, List, Optional, Sequence, Tuple

from emqfast.server import eviction
from emqfast.worker import signals
from emqfast.worker.many_shared import (MemberMarkers, SharedMarkers, gate_size, gated,
                                        shared_client)
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


class ThreadShared:
    """Mixed into a thread many-queue Worker's members: where the Worker shares one
    marker wait, one cancel listener and a gate on Redis requests
    (:mod:`emqfast.worker.many_shared`), a member uses them instead of its own."""

    _many: "ThreadMany"

    def _check_server(self) -> None:
        """The eviction check, once for the whole Worker (not once per queue at once)."""
        many = self._many
        if many.gate is None or self.allow_eviction:  # type: ignore[attr-defined]
            super()._check_server()  # type: ignore[misc]
            return
        with many.gate:
            if many.eviction is None:
                many.eviction = (eviction.check(self._redis),)  # type: ignore[attr-defined]
        self._refuse_eviction(many.eviction[0])  # type: ignore[attr-defined]

    def _drive(self, logic: Any) -> Any:
        gate = self._many.gate
        return super()._drive(logic if gate is None else gated(logic, gate))  # type: ignore[misc]

    def _serve(self, *args: Any, **kwargs: Any) -> None:
        markers = self._many.markers
        if markers is None:
            super()._serve(*args, **kwargs)  # type: ignore[misc]
            return
        markers.open()
        self._waiter = MemberMarkers(markers, self._keys.marker)  # type: ignore[attr-defined]
        try:
            super()._serve(*args, **kwargs)  # type: ignore[misc]
        finally:
            markers.close()

    def _start_listening(self) -> None:
        if not self._many.shares_listener:
            super()._start_listening()  # type: ignore[misc]
            return
        self._timer = self._timer_class(self._on_due)  # type: ignore[attr-defined]
        self._listener = self._many.listener_open()

    def _stop_listening(self) -> None:
        if not self._many.shares_listener:
            super()._stop_listening()  # type: ignore[misc]
            return
        self._listener = None
        self._many.listener_close()
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.close()


class ThreadMany(Many):
    """``emqfast.Worker([q1, q2, ...], handler, order=..., weights=...)``."""

    _stopping = False
    shared_parts = ThreadShared

    def __init__(self, driver: type, queues: Sequence[Any], handler: Callable[..., Any],
                 **options: Any):
        super().__init__(driver, queues, handler, **options)
        client = shared_client(self.queues)
        self.markers: Optional[SharedMarkers] = None
        self.gate: Any = None
        self.shares_listener = client is not None
        if client is not None:
            self.markers = SharedMarkers(client, [m._keys.marker for m in self.members],
                                         f"worker {self.name}")
            self.gate = threading.BoundedSemaphore(gate_size(client))
            self._listener_client = client
        self._listener: Any = None
        self._listening = 0
        self.eviction: Optional[Tuple[Optional[str]]] = None  # the check's warning, once

    def listener_open(self) -> Any:
        """A member begins serving: the one cancel listener of every queue (started by the
        first member)."""
        with self.lock:
            self._listening += 1
            if self._listener is None:
                routes = {m._keys.cancel_channel: m._on_cancel for m in self.members}
                listener_class = self.members[0]._listener_class  # the driver's
                self._listener = listener_class(self._listener_client, routes,
                                                self._recheck_cancels, f"worker {self.name}")
                self._listener.start()
            return self._listener

    def listener_close(self) -> None:
        """A member stopped serving; the last one closes the listener."""
        with self.lock:
            self._listening = max(self._listening - 1, 0)
            listener = self._listener if not self._listening else None
            if listener is not None:
                self._listener = None
        if listener is not None:
            listener.close()

    def _recheck_cancels(self) -> None:
        """The listener (re-)subscribed: each queue's running jobs' cancel marks are read
        (a cancel published while nobody listened is caught)."""
        for m in self.members:
            m._drive(m._recheck_cancels())

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
