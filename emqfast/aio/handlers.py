"""What the asyncio Worker runs its handlers with: coroutine steps timed (a step that blocks
the loop is named in a warning), plain functions in the Worker's own executor (their
exceptions carried as values, their start told to the loop), the job's lease/progress
hooks."""
from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Awaitable, Callable, Optional, Protocol, Tuple

from emqfast.facade.job import Job


log = logging.getLogger("emqfast.worker")

Held = Tuple[str, str, Optional[str]]  # a job to release: (id, lease token, group or None)


class Timed:
    """Awaits the rest of a handler's coroutine step by step, timing each step: how long
    the handler held the event loop before its next ``await`` (``on_step(job_id,
    seconds)``, see :meth:`emqfast.aio.Worker._on_step`). ``first``: what the coroutine's first step
    (run and timed by :func:`first_step`) yielded to the task."""

    __slots__ = ("_coro", "_on_step", "_job_id", "_first")

    def __init__(self, coro: Any, on_step: Callable[[str, float], None], job_id: str,
                 first: Any):
        self._coro, self._on_step, self._job_id = coro, on_step, job_id
        self._first = first

    def __await__(self) -> Any:
        coro, on_step, job_id = self._coro, self._on_step, self._job_id
        yielded = self._first
        while True:
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the handler
                error = exc
            began = time.monotonic()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as done:
                on_step(job_id, time.monotonic() - began)
                return done.value
            except BaseException:
                on_step(job_id, time.monotonic() - began)
                raise
            on_step(job_id, time.monotonic() - began)


def first_step(coro: Any, on_step: Callable[[str, float], None], job_id: str) -> Any:
    """Run a handler coroutine's first step here, timed: ``(True, its result)`` when it
    returned without suspending (most short handlers: no Timed, no generator per job),
    else ``(False, a Timed that awaits the rest)``. Its exception propagates, as ``await``
    would raise it."""
    began = time.monotonic()
    try:
        yielded = coro.send(None)
    except StopIteration as done:
        on_step(job_id, time.monotonic() - began)
        return True, done.value
    except BaseException:
        on_step(job_id, time.monotonic() - began)
        raise
    on_step(job_id, time.monotonic() - began)
    return False, Timed(coro, on_step, job_id, yielded)


class HandlerPool(Protocol):
    """The executor plain handlers run on: a ``ThreadPoolExecutor`` of ``concurrency``
    threads, or a many-queue Worker's one pool as a member holds it
    (:class:`emqfast.worker.crew.SharedPool`)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> "concurrent.futures.Future[Any]":
        ...

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        ...


def call_plain(handler: Callable[[Job], Any], job: Job,
               began: Optional[Callable[[float], None]]) -> Tuple[bool, Any]:
    """Run a plain handler (in an executor thread): ``(True, result)`` or ``(False, exc)``.
    ``began(monotonic s)`` is told just before the handler is called: the job's timeout
    clock starts there, not while it waited for this thread. A job stopped before it began
    (cancelled) is never handed to the handler. Its exception travels as a value: a
    wrapped future would turn a ``concurrent.futures.CancelledError`` into a cancellation
    of the awaiting task."""
    try:
        if job._stop_reason is not None:
            job.raise_if_cancelled()
        if began is not None:
            began(time.monotonic())
        return True, handler(job)
    except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
        return False, exc


class AioRunHooks:
    """``Job._run`` of the jobs an asyncio Worker runs (:class:`emqfast.facade.job.RunHooks`):
    the awaitable writes for coroutine handlers, and the blocking ones for plain handlers
    in the Worker's executor (run on the Worker's loop)."""

    __slots__ = ("_worker",)
    is_async = True

    def __init__(self, worker: Any):  # the emqfast.aio.Worker running the job
        self._worker = worker

    def extend_async(self, job_id: str, token: Optional[str], ms: int) -> Awaitable[None]:
        assert token is not None
        extending: Awaitable[None] = self._worker._extend_run(job_id, token, ms)
        return extending

    def progress_async(self, job_id: str, token: Optional[str],
                       value: Any) -> Awaitable[None]:
        assert token is not None
        recording: Awaitable[None] = self._worker._progress_run(job_id, token, value)
        return recording

    def extend(self, job_id: str, token: Optional[str], ms: int) -> None:
        self._worker._blocking(self.extend_async(job_id, token, ms),
                               "await job.extend_lease_async(ms)")

    def progress(self, job_id: str, token: Optional[str], value: Any) -> None:
        self._worker._blocking(self.progress_async(job_id, token, value),
                               "await job.progress_async(value)")
