"""How an :class:`emqfast.aio.Worker` keeps leases and shuts down, however :meth:`run` is
left (stop, a signal, cancellation once or again and again, the loop's teardown): see
the module docstring of :mod:`emqfast.aio.worker` for the rules."""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, List

from emqfast.aio import cancels
from emqfast.worker.resend import typed

if TYPE_CHECKING:  # a checker sees what the Worker holds; at run time the base is object
    from emqfast.aio.host import AioHost as _Host
else:
    _Host = object

log = logging.getLogger("emqfast.worker")


class Lifecycle(_Host):
    """The lease task and the shutdown of :class:`emqfast.aio.Worker` (mixed into it)."""

    async def _lease_loop(self) -> None:
        """Renew leases a third used, in the background (handlers may hog no thread, but
        a claim loop blocked on the marker must not let a long job's lease lapse)."""
        # ends on _closing, not only by cancel: redis.asyncio can swallow a cancellation
        # that lands mid-command, and this loop would then renew leases forever
        while not self._closing:
            slept_at = time.monotonic()
            await asyncio.sleep(self.beat_s)
            self._check_stall(time.monotonic() - slept_at - self.beat_s)
            try:
                await self._drive(self._renew_due())
            except Exception as exc:  # noqa: BLE001 - the next beat tries again
                log.warning("aio worker %s: cannot extend leases (%s)", self.name,
                            typed(exc))

    def _check_stall(self, late_s: float) -> None:
        """The lease loop woke ``late_s`` late: the event loop was blocked. Warn when that
        may cost leases, unless a handler step already reported it by its job's name."""
        if late_s < self.stall_warn_s or time.monotonic() - self._last_stall < late_s + 1.0:
            return
        log.warning("aio worker %s: lease renewal ran %.2fs late: something blocked "
                    "the event loop (running jobs: %s); leases may lapse and jobs run twice. "
                    "Run CPU-bound or blocking work in a thread or a process.", self.name,
                    late_s, ", ".join(sorted(self._running)[:10]) or "none")

    async def _finish(self, acker: "asyncio.Task[None]", leases: "asyncio.Task[None]") -> None:
        """Run the shutdown to its end, however :meth:`run` is left: a cancellation of the
        task awaiting run() (again and again, or the loop's teardown) only hurries it
        (handlers are cancelled at once), then is re-raised once everything is done."""
        assert self._hurry is not None
        shutdown = asyncio.ensure_future(self._shutdown(acker, leases))
        cancelled = False
        try:
            while not shutdown.done():
                try:
                    await asyncio.shield(shutdown)
                except asyncio.CancelledError:
                    if not shutdown.done():
                        cancelled = True
                        self._hurry.set()
        finally:
            self._serving = False
        if cancelled or self._run_cancelled():  # (redis.asyncio may have swallowed it)
            raise asyncio.CancelledError()
        shutdown.result()

    async def _shutdown(self, acker: "asyncio.Task[None]", leases: "asyncio.Task[None]") -> None:
        """Stop; see the module docstring for which late jobs are released (only those whose
        handler has ended by cancellation) and which are waited for (lease kept)."""
        assert self._hurry is not None
        self._stopping = True
        # the loop's teardown cancels every task at once: the acker and the lease loop too,
        # but outcomes must still be written and a slow handler's lease kept
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        leases = await self._alive(leases, self._lease_loop, "emq-leases")
        # a claim or start that the cancellation of run() cut short: its jobs go back
        await self._drive(self._settle(time.monotonic() + min(self.shutdown_timeout_s, 5.0)))
        await self._grace_period()
        late = self._job_tasks()
        for task in late:
            task.cancel()  # its job is released once its handler has ended
        while late:
            # no timeout: a cancelled coroutine ends at once; a thread that cannot be
            # cancelled is waited for (the lease loop keeps its lease), its outcome written
            await asyncio.wait(late, timeout=self.beat_s)
            acker = await self._alive(acker, self._ack_loop, "emq-acker")
            leases = await self._alive(leases, self._lease_loop, "emq-leases")
            late = self._job_tasks()
        await self._flush(acker)
        leases.cancel()  # and _closing: see _lease_loop
        await asyncio.wait([leases], timeout=self.beat_s + 1.0)
        await self._heartbeat.sign_off()  # gone from the Workers page now
        await self._close_connections()

    def _job_tasks(self) -> List["asyncio.Task[None]"]:
        """The tasks of jobs whose handlers have not ended yet."""
        return [r.task for r in self._running.values() if r.task is not None and not r.task.done()]

    async def _alive(self, task: "asyncio.Task[None]", loop_fn: Callable[[], Any],
                     name: str) -> "asyncio.Task[None]":
        """``task``, or a new one running ``loop_fn`` when it was cancelled (teardown).
        A cancelled task that has not ended soon swallowed its cancellation (redis.asyncio
        can, mid-command) and still runs: it is kept."""
        if not task.done() and cancels.requests(task):
            await asyncio.wait([task], timeout=0.1)  # an acker puts its batch back first
        if not task.done() or not task.cancelled():
            return task  # running, or ended on its own (_closing)
        return cancels.spawn(loop_fn(), name=name)

    async def _grace_period(self) -> None:
        """Wait up to ``shutdown_timeout_s`` for running handlers to finish (less when a
        further cancellation hurries the shutdown)."""
        assert self._hurry is not None
        end = time.monotonic() + self.shutdown_timeout_s
        while not self._hurry.is_set():
            tasks = self._job_tasks()
            left = end - time.monotonic()
            if not tasks or left <= 0:
                return
            await asyncio.wait(tasks, timeout=min(left, 0.05))

    async def _flush(self, acker: "asyncio.Task[None]") -> None:
        """Let the acker write the outcomes and releases still queued, re-sending for a
        bounded time only (after that the reaper re-runs what could not be written)."""
        assert self._ack_ready is not None
        self._ack_until = time.monotonic() + max(self.shutdown_timeout_s, 5.0)
        acker = await self._alive(acker, self._ack_loop, "emq-acker")
        self._closing = True  # the acker returns once it has written what is queued
        self._ack_ready.set()
        await asyncio.wait([acker], timeout=self._ack_until + 5.0 - time.monotonic())
        if not acker.done():
            acker.cancel()
            await asyncio.wait([acker], timeout=1.0)
        elif self._outcomes or self._releases:  # it ended by cancellation: write them here
            try:
                await self._ack_queued()
            except Exception:  # noqa: BLE001 - logged below; the reaper re-runs them
                pass
        if self._outcomes or self._releases:
            log.warning("aio worker %s: could not write %d outcomes / release %d jobs "
                        "before stopping; the reaper will hand them back", self.name,
                        len(self._outcomes), len(self._releases))
        self._outcomes, self._releases, self._pending_acks = [], [], 0
        self._running.clear()  # every handler has ended: nothing of ours is running

    async def _close_connections(self) -> None:
        """End the wake-up calls stop() started and close the marker connection."""
        if self._wakers:
            await asyncio.wait(list(self._wakers), timeout=1.0)
            for waker in list(self._wakers):
                waker.cancel()
        if self._waiter is not None:
            waiter, self._waiter = self._waiter, None
            try:
                await waiter.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass
