"""How many times a task was asked to cancel, on every Python the package supports.

The asyncio Worker tells a cancellation of its own tasks (shutdown, the loop's teardown)
from a ``CancelledError`` a handler raised itself, and notices a cancellation of the task
running :meth:`emqfast.aio.Worker.run` that redis.asyncio swallowed mid-command. Python
3.11+ counts cancel requests (``Task.cancelling()``). On 3.9 and 3.10 the tasks the Worker
creates (:func:`spawn`) count their own, and ``run()`` runs its body in such a task
(:func:`counted`), which a cancellation of the task awaiting it reaches too.
"""
from __future__ import annotations

import asyncio
import sys
from typing import Any, Awaitable, Coroutine, Optional, TypeVar

T = TypeVar("T")

if sys.version_info >= (3, 11):
    def requests(task: "asyncio.Task[Any]") -> int:
        """Cancel requests of ``task`` not yet withdrawn (``Task.cancelling()``)."""
        return task.cancelling()

    def spawn(coro: Coroutine[Any, Any, T], name: Optional[str] = None) -> "asyncio.Task[T]":
        """A task running ``coro`` on the running loop."""
        return asyncio.get_running_loop().create_task(coro, name=name)

    def counted(coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``coro`` itself: the current task counts its cancel requests already."""
        return coro
else:  # pragma: no cover - exercised by the Python matrix (scripts/pymatrix.sh)
    class _CountedTask(asyncio.Task):  # type: ignore[type-arg]
        """A task that counts the cancel requests it gets (Task.cancelling() before 3.11)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.emq_cancels = 0

        def cancel(self, msg: Any = None) -> bool:
            # A timeout cancels the task it guards and turns the CancelledError into
            # TimeoutError: async_timeout does (redis.asyncio's socket timeouts before
            # 3.11), and 3.11's asyncio.timeout withdraws it with uncancel(). Not a request.
            if sys._getframe(1).f_globals.get("__name__") != "async_timeout":
                self.emq_cancels += 1
            return super().cancel(msg)

    def requests(task: "asyncio.Task[Any]") -> int:
        """Cancel requests of a task :func:`spawn` made; 0 for any other task."""
        return int(getattr(task, "emq_cancels", 0))

    def spawn(coro: Coroutine[Any, Any, T], name: Optional[str] = None) -> "asyncio.Task[T]":
        """A task running ``coro`` on the running loop, counting its cancel requests."""
        return _CountedTask(coro, loop=asyncio.get_running_loop(), name=name)

    def counted(coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """``coro`` in a task of its own that counts its cancel requests: cancelling the
        awaiting task cancels it (asyncio passes the request on), so a request is counted
        even when the code it lands in swallows it."""
        return spawn(coro)
