"""What a handler's run becomes: the outcome a Worker writes, and how it is counted.

No I/O here. A handler's return value becomes a :class:`Done`, its exception a
:class:`Failed`; :mod:`emqfast.worker.calls` turns a batch of them into script calls,
and :func:`tally` counts the replies into a Worker's stats.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
import logging
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Type, Union

from emqfast.core import codec
from emqfast.core.errors import (InputTypeError, LeaseLost, PayloadError, QueueKeysGone,
                                 Unrecoverable)
from emqfast.facade.job import Job

log = logging.getLogger("emqfast.worker")


@dataclass
class WorkerStats:
    """What a worker did (counts since it was created)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    lease_lost: int = 0
    released: int = 0
    cancelled: int = 0  # runs stopped by q.cancel and ended as cancelled (never retried)

    @classmethod
    def total(cls, parts: Iterable["WorkerStats"]) -> "WorkerStats":
        """The sum of ``parts`` (a many-queue Worker's: over its queues)."""
        out = cls()
        for part in parts:
            for field in vars(out):
                setattr(out, field, getattr(out, field) + getattr(part, field))
        return out


class Done(NamedTuple):
    """A handler returned: its stored result (codec.encode_handler_result) is written by
    complete.lua."""

    job: Job
    token: str  # the lease token the job runs under
    result: bytes


class Failed(NamedTuple):
    """A handler raised: fail.lua records it and retries the job when it may."""

    job: Job
    token: str
    exc: BaseException
    traceback: str
    may_retry: bool


class CancelledRun(Failed):
    """A run stopped by ``q.cancel``: written by cancel_active.lua as a kept
    ``cancelled`` record, never retried (a Failed too: ``may_retry`` is False)."""

    __slots__ = ()


Outcome = Union[Done, Failed]


NULL_RESULT = b"null"  # a handler that returned None: its stored result


def success(job: Job, token: str, result: Any) -> Done:
    """A handler's return value as the outcome to write (bytes or JSON result)."""
    return Done(job, token, NULL_RESULT if result is None else codec.encode_handler_result(result))


def check_decodable(job: Job) -> None:
    """Raise the :class:`PayloadError` of a job whose stored payload could not be decoded,
    before its handler would run: it fails for good (retrying cannot help)."""
    if job._undecodable is not None:
        raise job._undecodable


def failure(job: Job, token: str, exc: BaseException, tb: str) -> Failed:
    """A handler's exception as the outcome to write; Unrecoverable and bad payloads never retry."""
    may_retry = not isinstance(exc, (Unrecoverable, PayloadError))
    return Failed(job, token, exc, tb, may_retry)


def is_async_handler(handler: Any) -> bool:
    """True for ``async def`` functions (or objects whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(handler) or \
        inspect.iscoroutinefunction(getattr(handler, "__call__", None))


def check_worker_args(queue: Any, wanted: Type[Any], handler: Any) -> None:
    """Refuse, typed (InputTypeError: a TypeError too), what a Worker cannot run: a queue
    of the other facade (``wanted``: the driver's Queue class) or a handler that is not
    callable."""
    if not isinstance(queue, wanted) or getattr(queue, "is_async", None) != wanted.is_async:
        raise InputTypeError("emqfast.Worker needs an emqfast.Queue, emqfast.aio.Worker an "
                             f"emqfast.aio.Queue (got {type(queue).__name__})")
    if not callable(handler):
        raise InputTypeError(f"handler must be callable, not {type(handler).__name__}")


def refuse_async_handler(handler: Any) -> None:
    """The sync Worker runs handlers in threads: an ``async def`` handler would only ever
    return an un-awaited coroutine. Refuse it at construction."""
    if is_async_handler(handler):
        raise InputTypeError("emqfast.Worker runs plain functions in threads; this handler is a "
                        "coroutine function (async def): use emqfast.aio.Worker with an "
                        "emqfast.aio.Queue for it")


def awaitable_result(job: Job, token: str, result: Any) -> Failed:
    """The failed, non-retried outcome of a sync handler that returned an awaitable (a
    coroutine it never awaited): it did not do its work, and retrying cannot help."""
    close = getattr(result, "close", None)
    if callable(close):
        close()  # no "coroutine was never awaited" warning on top
    exc = TypeError(f"handler returned an awaitable ({type(result).__name__}), not a result: "
                    "async handlers need emqfast.aio.Worker")
    return Failed(job, token, exc, "", False)


def retry_delay_ms(job: Job, may_retry: bool) -> int:
    """Delay before the next attempt (the job's backoff), or -1: no attempt left."""
    if not may_retry or job.attempts >= job.max_attempts:
        return -1
    return job.backoff.delay_ms(job.attempts) if job.backoff is not None else 0


def job_group(job: Job) -> Optional[str]:
    """The group a running job was enqueued with (kept in its options), or None."""
    return job.extra.get("g")


def log_context(job: Job) -> Dict[str, Any]:
    """``extra=`` for log records about one job: queue, job id, attempt (never payloads,
    results or connection details, which may hold secrets)."""
    return {"queue": job.queue, "job_id": job.id, "attempt": job.attempts}


def tally(stats: Any, batch: Sequence[Outcome], replies: Sequence[Any],
          retrying: Sequence[Optional[bool]]) -> List[QueueKeysGone]:
    """Count written outcomes into ``stats``; a lost lease discards the outcome (logged).
    The replies saying the queue's keys are gone are returned, not logged per job (the
    Worker says it once)."""
    debug = log.isEnabledFor(logging.DEBUG)
    completed = 0
    gone: List[QueueKeysGone] = []
    for outcome, reply, retry in zip(batch, replies, retrying):
        job = outcome.job
        if retry is None and type(reply) is list and not debug:  # the common case, no log
            completed += 1
            continue
        ctx = log_context(job)
        if isinstance(reply, QueueKeysGone):
            stats.lease_lost += 1
            gone.append(reply)
        elif isinstance(reply, LeaseLost):
            stats.lease_lost += 1
            log.warning("job %r (queue %r, attempt %d) finished after its lease was "
                        "lost; outcome discarded", job.id, job.queue, job.attempts, extra=ctx)
        elif isinstance(reply, Exception):
            log.error("writing outcome of %r (queue %r) failed: %r", job.id, job.queue,
                      reply, extra=ctx)
        elif retry is None:
            stats.completed += 1
            log.debug("job %r completed (queue %r, attempt %d)", job.id, job.queue,
                      job.attempts, extra=ctx)
        else:
            _count_failure(stats, outcome, retry, ctx)
    stats.completed += completed
    return gone


def _count_failure(stats: Any, outcome: Any, retry: bool, ctx: Dict[str, Any]) -> None:
    if retry:
        stats.retried += 1
    else:
        stats.failed += 1
    log_failure(outcome.job, outcome.exc, retry, ctx)


def log_failure(job: Job, exc: BaseException, retry: bool,
                ctx: Optional[Dict[str, Any]] = None) -> None:
    """One rule for both drivers: a failure that will be retried is routine (INFO); a
    final one (no attempt left, Unrecoverable, a bad payload) loses the job's work and is
    a WARNING, so a plain script with no logging set up still shows it on stderr. Only
    the exception's type and message: payloads and tracebacks stay in Redis."""
    error = f"{type(exc).__name__}: {exc}"
    extra = dict(log_context(job) if ctx is None else ctx, error=error, final=not retry,
                 max_attempts=job.max_attempts)  # what `emqfast worker` prints per failure
    log.log(logging.INFO if retry else logging.WARNING,
            "job %r %s (queue %r, attempt %d of %d): %r", job.id,
            "will retry" if retry else "failed", job.queue, job.attempts, job.max_attempts,
            error, extra=extra)
