"""Operations without I/O ("sans-IO"): what each public operation asks to have sent.

Every public operation of :class:`~emqfast.Queue`, :class:`~emqfast.facade.schedules.Schedules`,
:class:`~emqfast.Leaderboard` and :func:`~emqfast.promote_many` is written once,
as a generator: it validates its input, ``yield``s what it needs sent (a
:class:`Call` of a Lua move, a plain :class:`Cmd`, a pipelined :class:`Batch`,
...) and receives the reply, then ``return``s the result. It never touches a
socket, so the same code serves both facades:

- :func:`emqfast.backends.drive.run` drives it with a blocking ``redis.Redis`` /
  ``RedisCluster`` (the sync facade; bulk calls go through the backend Batcher, C when built);
- :func:`emqfast.backends.drive.run_async` drives it with ``redis.asyncio`` (the
  :mod:`emqfast.aio` facade).

A class opts in with :func:`operation` on its generator methods and a ``_drive``
method: the sync classes return ``run``'s result, the async subclasses
return ``run_async``'s coroutine, so ``q.enqueue(x)`` and
``await aq.enqueue(x)`` share every line of logic.

Failures are typed (:func:`emqfast.errors.translate`: ``ConnectionFailed``/``ReplyLost``,
``ServerBusy``, ``ServerFull``, ``PermissionDenied``, the Lua ``EMQ*`` classes) and thrown
into the operation at its ``yield``: most let them propagate, a bulk operation catches
them to report what landed (``enqueue_many``'s :class:`~emqfast.errors.PartialBatch`).
Script calls are never re-sent blindly (:mod:`emqfast.backends.transport`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Any, Callable, Dict, Generator, Hashable, Iterable,
                    Iterator, List, NamedTuple, Optional, Protocol, Sequence, Tuple, TypeVar, Union)

from emqfast.core.lua import Script

__all__ = ["Call", "Cmd", "Batch", "Columns", "Slot", "Scan", "Watched", "Gathered", "Sleep",
           "WaitForRoom", "WaitDrained", "PopMarker", "Hook", "Wait", "Waits", "Op", "Returns",
           "Request", "operation", "expand_columns", "column_calls", "rows_per_call", "as_bytes"]


class Call(NamedTuple):
    """Run one Lua move (EVALSHA, NOSCRIPT reload); reply as the script returns it.

    A Lua error is raised as its typed :mod:`emqfast.errors` class. A tuple, so
    lists of calls also feed :func:`~emqfast.backends.scripts.run_pipeline` and
    :func:`~emqfast.backends.drive.run_calls` as they are.
    """

    script: Script
    keys: Sequence[Any]
    args: Sequence[Any]


@dataclass(frozen=True)
class Cmd:
    """One plain Redis command; ``options`` go to redis-py's reply callbacks
    (e.g. ``withscores=True`` for ``ZRANGE ... WITHSCORES``)."""

    args: Tuple[Any, ...]
    options: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, *args: Any, **options: Any) -> "Cmd":
        """``Cmd.of("HGET", key, field)``."""
        return cls(tuple(args), dict(options))


@dataclass(frozen=True)
class Batch:
    """Many :class:`Call` s (or many :class:`Cmd` s) in one round trip, no MULTI.

    Replies come back in order. For calls a Lua error is returned typed in its
    slot (not raised); for commands an error reply raises. ``via_batcher=True`` lets
    the sync driver send calls through the backend Batcher (hiredis under C).
    ``wait=(replicas, timeout_ms)`` (calls only) sends ``WAIT`` on the connection that
    wrote them; the replies then end with the fewest replicas that acknowledged.
    """

    items: Sequence[Union[Call, Cmd]]
    via_batcher: bool = False
    wait: Optional[Tuple[int, int]] = None


class Slot(NamedTuple):
    """One argument position of every call in a :class:`Columns` bulk: ``prefix``, then,
    when ``column`` names one, call ``i``'s value in that column (``Slot(value)``: the
    same constant for every call). A tuple, as the Batchers take it."""

    prefix: Any
    column: Optional[int] = None
    each: int = 0  # > 0: repeated for each of the call's rows, calls of ``each`` rows


@dataclass(frozen=True)
class Columns:
    """A bulk of one script framed as columns (see ``Batcher.evalsha_columns``): call
    ``i``'s arguments are ``slots`` (its first ``numkeys`` are KEYS, the rest ARGV), each
    filled from ``columns`` as :class:`Slot` says. Replies in order, errors in their slot.

    Many rows per call (enqueue_many.lua): when slots have ``each = r``, every
    call carries ``r`` consecutive rows (the last one the rest) and each run of such
    slots is repeated once per row of the call (a key slot adds one key per row); a
    slot with ``each = 0`` appears once (a column there takes the call's first row)."""

    script: Script
    numkeys: int
    slots: Sequence[Slot]
    columns: Sequence[Sequence[Any]]
    wait: Optional[Tuple[int, int]] = None  # as Batch.wait


@dataclass(frozen=True)
class Scan:
    """Every key matching ``match`` (SCAN, on every master of a cluster)."""

    match: str
    count: int = 1000


@dataclass(frozen=True)
class Watched:
    """An optimistic transaction: WATCH ``keys``, run ``read`` at once, then MULTI/EXEC
    the commands ``then(read_reply)`` returns; retried while the watch fires.
    Reply: ``(read_reply, exec_replies)``."""

    keys: Sequence[str]
    read: Cmd
    then: Callable[[Any], List[Cmd]]


class Gathered(NamedTuple):  # (a tuple: made once per single enqueue, on its hot path)
    """One item for a group commit: while an earlier flush of the same ``key`` is in
    flight on the same client (in this process), concurrent items wait and go out
    together in one later flush; with none in flight this item's flush goes out at once.

    ``flush(items)`` is an operation sending ``items`` (this one first) and returning one
    outcome per item, in order: its reply, or an exception that is raised to that item's
    caller alone. A flush holds at most ``limit`` items. Reply: this item's outcome."""

    key: Hashable  # who may share a flush (with the client): same key, same destination
    item: Any
    flush: Callable[[List[Any]], Generator["Request", Any, List[Any]]]
    limit: int = 500


# --- waits: what a Worker's logic asks of the Worker it runs in ----------------------------
# Operations on the facade only talk to Redis. A Worker's logic (emqfast.worker.machine) is
# written the same way and also yields these: the drivers hand each to the ``Waits`` the
# Worker gave them (threads block on a condition; asyncio awaits an event), so a test can
# script a whole claim loop without Redis or threads.

class Sleep(NamedTuple):
    """Sleep ``seconds``; ``wake_on_stop``: a stop of the Worker may end the sleep early."""

    seconds: float
    wake_on_stop: bool = False


class WaitForRoom(NamedTuple):
    """``(free handler slots, jobs the Worker may claim now)``; with no slot for a held job
    and no room to claim, first wait up to ``seconds`` for a handler to end."""

    seconds: float


class WaitDrained(NamedTuple):
    """While jobs of the Worker run or are being acked, wait up to ``seconds`` for one to
    be written (True); with none in flight, False at once."""

    seconds: float


class PopMarker(NamedTuple):
    """Block on the wake marker ``key`` up to ``seconds``: ``(member, score)`` or None."""

    key: str
    seconds: float


class Hook(NamedTuple):
    """Run a callable registered on the Worker (its ``beat_hooks``); an awaitable it
    returns is awaited under asyncio."""

    fn: Callable[[], Any]


Wait = Union[Sleep, WaitForRoom, WaitDrained, PopMarker, Hook]
WAITS = (Sleep, WaitForRoom, WaitDrained, PopMarker, Hook)


class Waits(Protocol):
    """How a Worker performs the :data:`Wait` requests (its driver's blocking or awaitable
    methods: ``perform(request)`` returns the reply, or a coroutine of it)."""

    def perform(self, request: Any) -> Any: ...


_R = TypeVar("_R")
Request = Union[Call, Cmd, Batch, Columns, Scan, Watched, Gathered, Sleep, WaitForRoom,
                WaitDrained, PopMarker, Hook]
Op = Generator[Request, Any, Any]
Logic = Op  # a piece of a Worker's logic: yields requests and waits, returns its result
Returns = Generator[Request, Any, _R]  # an operation whose result is _R: ``-> Returns[int]``

if TYPE_CHECKING:  # what a type checker sees of an @operation; at run time it is a function
    from typing import Awaitable, Concatenate, Generic, Literal, ParamSpec, overload

    _P = ParamSpec("_P")
    _S = TypeVar("_S")
    _T = TypeVar("_T", covariant=True)

    import redis.asyncio

    class _AsyncHost(Protocol):
        """A facade whose ``_drive`` returns a coroutine, and says so."""

        @property
        def is_async(self) -> Literal[True]: ...

    class _AsyncClient(Protocol):
        """A facade on ``redis.asyncio`` clients (:mod:`emqfast.aio`'s Queue, Leaderboard):
        its ``_drive`` returns a coroutine."""

        @property
        def _resolve(self) -> Callable[[Any], redis.asyncio.Redis]: ...

    class Operation(Generic[_S, _P, _T]):
        """An @operation method: called on an instance it returns the generator's result
        (awaitable on an async facade); on the class, ``.op`` is the generator itself."""

        op: Callable[Concatenate[_S, _P], Generator[Request, Any, _T]]

        @overload
        def __get__(self, obj: None, owner: Any) -> Operation[_S, _P, _T]: ...
        @overload
        def __get__(self, obj: _AsyncHost, owner: Any) -> Callable[_P, Awaitable[_T]]: ...
        @overload
        def __get__(self, obj: _AsyncClient, owner: Any) -> Callable[_P, Awaitable[_T]]: ...
        @overload
        def __get__(self, obj: object, owner: Any) -> Callable[_P, _T]: ...
        def __get__(self, obj: Any, owner: Any) -> Any: ...

    @overload
    def operation(fn: Callable[Concatenate[_S, _P], Generator[Request, Any, _R]]
                  ) -> Operation[_S, _P, _R]: ...
    # A generator annotated with its result (``-> JobRef``), as modules not yet checked
    # strictly still write it (the pyproject [tool.mypy] overrides list them).
    @overload
    def operation(fn: Callable[Concatenate[_S, _P], _R]) -> Operation[_S, _P, _R]: ...
    def operation(fn: Any) -> Any: ...
else:
    def operation(fn: Callable[..., Op]) -> Callable[..., Any]:
        """Make generator method ``fn`` a public operation: ``self._drive(fn(self, ...))``.

        The undecorated generator stays reachable as ``.op``, so one operation can
        ``yield from`` another inside the same drive.
        """
        @functools.wraps(fn)
        def public(self: Any, *args: Any, **kwargs: Any) -> Any:
            return self._drive(fn(self, *args, **kwargs))

        public.op = fn
        return public


def expand_columns(slots: Sequence[Tuple[Any, ...]],
                   columns: Sequence[Sequence[Any]]) -> List[List[bytes]]:
    """The per-call argument lists a :class:`Columns` request stands for."""
    if rows_per_call(slots) > 1:
        return [keys + args for keys, args in column_calls(0, slots, columns)]
    n = len(columns[0]) if columns else 0
    prefixes = [as_bytes(slot[0]) for slot in slots]
    picks = [slot[1] for slot in slots]
    return [[p if k is None else p + as_bytes(columns[k][i]) for p, k in zip(prefixes, picks)]
            for i in range(n)]


def rows_per_call(slots: Sequence[Tuple[Any, ...]]) -> int:
    """Rows each call of a :class:`Columns` bulk carries: its slots' ``each``, else 1."""
    return max((slot[2] for slot in slots if len(slot) > 2 and slot[2]), default=1)


def column_calls(numkeys: int, slots: Sequence[Tuple[Any, ...]],
                 columns: Sequence[Sequence[Any]]) -> List[Tuple[List[bytes], List[bytes]]]:
    """The (KEYS, ARGV) of every call a :class:`Columns` bulk stands for (``numkeys``
    counts its key slots)."""
    rows = rows_per_call(slots)
    if rows == 1:
        return [(call[:numkeys], call[numkeys:]) for call in expand_columns(slots, columns)]
    n = len(columns[0]) if columns else 0
    out = []
    for lo in range(0, n, rows):
        hi = min(lo + rows, n)
        keys = _call_values(slots[:numkeys], columns, lo, hi)
        out.append((keys, _call_values(slots[numkeys:], columns, lo, hi)))
    return out


def _call_values(slots: Sequence[Tuple[Any, ...]], columns: Sequence[Sequence[Any]],
                 lo: int, hi: int) -> List[bytes]:
    """One call's values of ``slots`` for rows ``[lo, hi)``: runs of repeated slots row
    by row, the others once (a column there gives row ``lo``'s value)."""
    def value(slot: Tuple[Any, ...], row: int) -> bytes:
        prefix = as_bytes(slot[0])
        return prefix if slot[1] is None else prefix + as_bytes(columns[slot[1]][row])

    out: List[bytes] = []
    s = 0
    while s < len(slots):
        if len(slots[s]) < 3 or not slots[s][2]:
            out.append(value(slots[s], lo))
            s += 1
            continue
        e = s
        while e < len(slots) and len(slots[e]) > 2 and slots[e][2]:
            e += 1
        out += _rows(slots[s:e], columns, lo, hi)
        s = e
    return out


def _rows(run: Sequence[Tuple[Any, ...]], columns: Sequence[Sequence[Any]], lo: int,
          hi: int) -> List[bytes]:
    """The values of a run of repeated slots for rows ``[lo, hi)``, row by row (what
    :func:`_call_values` says; each slot's prefix and column looked up once, not per row)."""
    picks = [(as_bytes(slot[0]), None if slot[1] is None else columns[slot[1]])
             for slot in run]
    out: List[bytes] = []
    for row in range(lo, hi):
        for prefix, col in picks:
            if col is None:
                out.append(prefix)
                continue
            value = col[row]
            if type(value) is not bytes:
                value = as_bytes(value)
            out.append(prefix + value if prefix else value)
    return out


def as_bytes(value: Any) -> bytes:
    """A value as redis-py would send it: bytes as is, str as UTF-8, numbers as ASCII."""
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode()


# Bounded work per script call: promote/reap/trim hand a script at most this
# many jobs (the scripts refuse more than 4,000), so a 1M backlog is many calls of a few
# ms each, never one call that blocks Redis for seconds. Larger limits loop.
# Sized for ~2-4 ms of Redis time per call (SLOWLOG, bench/slowlog.py: ~7.5 us per promoted
# or trimmed job, ~15 us per reaped one), leaving room under the 20 ms target on a busy host.
PROMOTE_BATCH = 250
DUE_BATCH = 4000      # due ids read per due.lua call (its maximum); promote moves them in
                      # PROMOTE_BATCH calls pipelined together: few round trips per 1M
REAP_BATCH = 250      # reap does the most per job (lease, counters, events)
TRIM_BATCH = 500


def batches(limit: int, size: int) -> Iterator[int]:
    """Per-call counts that add up to ``limit``, none above ``size``."""
    while limit > 0:
        yield min(limit, size)
        limit -= size


def chunks(items: List[Any], size: int) -> Iterable[List[Any]]:
    """``items`` in consecutive slices of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
