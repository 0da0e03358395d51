"""What a caller sees of a job: :class:`JobRef` from enqueue, :class:`Job` from ``Queue.get``."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, ClassVar, Dict, Iterable, List, Optional, Protocol

from emqfast.backends import select as backend
from emqfast.core import codec
from emqfast.core.errors import Cancelled, InvalidInput, JobTimeout
from emqfast.facade import options
from emqfast.facade.options import Backoff

class RunHooks(Protocol):
    """What a Worker lends the jobs it runs (``Job._run``): their lease and progress
    writes, given the job's id and its run's lease token. ``is_async``: the awaitable
    twins work (:class:`emqfast.aio.Worker`)."""

    is_async: bool

    def extend(self, job_id: str, token: Optional[str], ms: int) -> None: ...

    def progress(self, job_id: str, token: Optional[str], value: Any) -> None: ...

    def extend_async(self, job_id: str, token: Optional[str], ms: int) -> Awaitable[None]: ...

    def progress_async(self, job_id: str, token: Optional[str],
                       value: Any) -> Awaitable[None]: ...


STATES = ("scheduled", "pending", "active", "completed", "failed", "cancelled",
          "waiting_deps", "expired")


@dataclass(frozen=True)
class JobRef:
    """The answer to an enqueue: the id, and whether it was new or a duplicate."""

    id: str
    # 'pending', 'scheduled' or 'duplicate'; with a dedupe key (facade/dedupe.py)
    # 'deduplicated' or 'replaced', the id then naming the job that holds the key
    status: str

    # the Queue that made this ref (not a field: no part of ==, repr or asdict); set by
    # Queue._bind, read by wait()
    _queue: ClassVar[Any] = None

    @property
    def duplicate(self) -> bool:
        """True when the id already existed and nothing was written."""
        return self.status == "duplicate"

    def __getstate__(self) -> Dict[str, Any]:
        # pickled (or copied) without its queue: a Queue holds a live client
        return {k: v for k, v in self.__dict__.items() if k != "_queue"}

    def wait(self, timeout_s: Optional[float] = None) -> Any:
        """Block until the job ends for good and return its result (``await ref.wait()``
        for refs from :mod:`emqfast.aio`); raises :class:`~emqfast.errors.JobFailed`,
        :class:`~emqfast.errors.Cancelled`, :class:`~emqfast.errors.JobExpired`, or
        :class:`~emqfast.errors.WaitTimeout` after ``timeout_s`` (None: no limit). Woken
        by the job's own end (pub/sub), across processes; see :mod:`emqfast.facade.job_wait`."""
        if self._queue is None:
            raise InvalidInput(f"JobRef {self.id} knows no queue to wait on: use "
                               "q.ref(job_id).wait() or q.wait_many([...])")
        return self._queue._wait_one(self.id, timeout_s)


def ref_of(job_id: str, status: str) -> JobRef:
    """``JobRef(job_id, status)``, built without the frozen dataclass's ``__init__`` (a
    single enqueue makes one per call). Same object, same fields."""
    ref = JobRef.__new__(JobRef)
    fields = ref.__dict__
    fields["id"] = job_id
    fields["status"] = status
    return ref


def refs_of(ids: Iterable[str], statuses: Iterable[str]) -> List[JobRef]:
    """``[JobRef(id, status), ...]``, built a third faster than through the frozen
    dataclass's ``__init__`` (two ``object.__setattr__`` calls per ref): a bulk enqueue
    makes one per job. Same objects, same fields."""
    new = JobRef.__new__
    out: List[JobRef] = []
    add = out.append
    for job_id, status in zip(ids, statuses):
        ref = new(JobRef)
        fields = ref.__dict__
        fields["id"] = job_id
        fields["status"] = status
        add(ref)
    return out


def _int(value: Any) -> Optional[int]:
    return int(value) if value is not None else None


def _text(value: Any) -> Optional[str]:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


@dataclass
class Job:
    """A job's state and data, as stored in Redis (timestamps are server-clock epoch ms)."""

    id: str
    queue: str
    state: str
    payload: Any
    attempts: int = 0
    max_attempts: int = 1
    priority: int = 0
    backoff: Optional[Backoff] = None
    created_ms: Optional[int] = None
    run_at_ms: Optional[int] = None
    started_ms: Optional[int] = None
    finished_ms: Optional[int] = None
    result: Any = None
    error: Optional[str] = None
    traceback: Optional[str] = None
    stalls: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)
    last_progress: Any = None  # the latest job.progress(value) of the running handler
    # set by the Worker for the job it is running: what extend_lease / progress (and their
    # awaitable twins) call, with this run's lease token. One hooks object per Worker, not
    # four bound callables per job: cheaper on the drain's hot path.
    _run: Optional["RunHooks"] = field(default=None, repr=False, compare=False)
    _run_token: Optional[str] = field(default=None, repr=False, compare=False)
    # set by the Workers when the stored payload cannot be decoded: the job fails with it
    # (no retry) instead of its handler running, and the worker goes on with the others
    _undecodable: Optional[Exception] = field(default=None, repr=False, compare=False)
    # set by the Workers when start.lua found no earlier run's failure in the job hash
    # (none can be written while the run holds its lease): its success has none to clear
    _clean_start: bool = field(default=False, repr=False, compare=False)
    # set by the Workers before a job with dependencies starts: {dep id: result}
    _dep_results: Optional[Dict[str, Any]] = field(default=None, repr=False, compare=False)
    # set by the Workers when the running job is asked to stop: "cancelled"
    # (q.cancel) or "timeout" (it ran past its timeout_ms)
    _stop_reason: Optional[str] = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """True once this running job was cancelled (``q.cancel(id)``) or ran past its
        ``timeout_ms``: a handler polls it (or calls :meth:`raise_if_cancelled`) and stops."""
        return self._stop_reason is not None

    @property
    def cancel_reason(self) -> Optional[str]:
        """``"cancelled"``, ``"timeout"``, or None while the job may run on."""
        return self._stop_reason

    def raise_if_cancelled(self) -> None:
        """Raise :class:`emqfast.Cancelled` (:class:`emqfast.JobTimeout` for a timeout)
        once the job was cancelled or timed out; a no-op otherwise."""
        reason = self._stop_reason
        if reason is None:
            return
        if reason == "timeout":
            raise JobTimeout(f"job {self.id} ran past its timeout_ms")
        raise Cancelled(f"job {self.id} was cancelled")

    @classmethod
    def from_hash(cls, queue: str, job_id: str, h: Dict[bytes, bytes],
                  delayed_score: Any = None, active_score: Any = None) -> "Job":
        """Build from an HGETALL reply (missing ``opts``/``enc``/``attempts``: their defaults)
        and the job's scores on the delayed and active sets (ZSCORE; None when it is not
        there).

        A waiting job's hash holds no ``state``: the set holding it says it, so a job
        parked on the delayed set is ``scheduled`` (its run-at unpacked from the score), one
        on the active set is ``active`` (a Worker claimed it and holds it for a free handler
        slot: ``counts()`` counts it there too) and any other job without a state is
        ``pending``."""
        opts = options.decode(h.get(b"opts"))
        progress = h.get(b"progress")
        state = _text(h.get(b"state"))
        run_at = _int(h.get(b"run_at"))
        if state in (None, "pending", "scheduled"):  # (older hashes still name them)
            state = "pending" if delayed_score is None else "scheduled"
            if active_score is not None:
                state = "active"
            if delayed_score is not None:
                run_at = backend.impl().unpack_delayed(int(float(delayed_score)))[0]
        return cls(
            id=job_id, queue=queue, state=state,
            payload=codec.decode(h.get(b"payload"), h.get(b"enc")),
            attempts=int(h.get(b"attempts", 0)), max_attempts=opts.max_attempts,
            priority=opts.priority, backoff=opts.backoff,
            created_ms=_int(h.get(b"created")), run_at_ms=run_at,
            started_ms=_int(h.get(b"started")), finished_ms=_int(h.get(b"finished")),
            result=codec.decode_result(h.get(b"result")),
            error=_text(h.get(b"error")), traceback=_text(h.get(b"traceback")),
            stalls=int(h.get(b"stalls", 0)),
            extra=opts.extra,
            last_progress=json.loads(progress) if progress is not None else None,
        )

    def dependency_results(self) -> Dict[str, Any]:
        """From inside a handler: ``{dep_id: result}`` of the jobs this one depended on
        (``enqueue(..., depends_on=...)``; None for a dep that did not complete, with
        ``on_dep_failure="run"``); ``{}`` for a job without dependencies. Raises
        RuntimeError outside the running handler, or when the Worker could not read them
        (the job then fails like any handler error, and is retried if it has attempts)."""
        if self._dep_results is None and self.extra.get("d"):
            raise RuntimeError("dependency_results() is only available to the running "
                               "handler (and the Worker could not read them)")
        return dict(self._dep_results or {})

    def extend_lease(self, ms: int) -> None:
        """From inside a handler: keep the lease for ``ms`` more (raises LeaseLost if gone)."""
        run = self._run
        if run is None:
            raise RuntimeError("extend_lease() is only available to the running handler")
        run.extend(self.id, self._run_token, ms)

    def progress(self, value: Any) -> None:
        """From inside a handler: record ``value`` (JSON) as this job's progress and
        append a ``progress`` event (raises LeaseLost if the lease is gone)."""
        run = self._run
        if run is None:
            raise RuntimeError("progress() is only available to the running handler")
        run.progress(self.id, self._run_token, value)

    async def progress_async(self, value: Any) -> None:
        """The awaitable :meth:`progress` for coroutine handlers of :class:`emqfast.aio.Worker`."""
        run = self._run
        if run is None or not run.is_async:
            raise RuntimeError("progress_async() is only available to a running aio handler")
        await run.progress_async(self.id, self._run_token, value)

    async def extend_lease_async(self, ms: int) -> None:
        """From inside a coroutine handler of :class:`emqfast.aio.Worker`: keep the lease
        for ``ms`` more (raises LeaseLost if gone). ``extend_lease`` would block the loop."""
        run = self._run
        if run is None or not run.is_async:
            raise RuntimeError("extend_lease_async() is only available to a running aio handler")
        await run.extend_async(self.id, self._run_token, ms)
