"""Operations without I/O, and the two drivers that run them ("sans-IO").

Every public operation of :class:`~emqfast.Queue`, :class:`~emqfast.schedules.Schedules`,
:class:`~emqfast.Leaderboard` and :func:`~emqfast.promote_many` is written once,
as a generator: it validates its input, ``yield``s what it needs sent (a
:class:`Call` of a Lua move, a plain :class:`Cmd`, a pipelined :class:`Batch`,
...) and receives the reply, then ``return``s the result. It never touches a
socket, so the same code serves both facades:

- :func:`run` drives it with a blocking ``redis.Redis`` / ``RedisCluster``
  (the sync facade; bulk calls go through the backend Batcher, C when built);
- :func:`run_async` drives it with ``redis.asyncio`` (the :mod:`emqfast.aio` facade).

A class opts in with :func:`operation` on its generator methods and a ``_drive``
method: the sync classes return :func:`run`'s result, the async subclasses
return :func:`run_async`'s coroutine, so ``q.enqueue(x)`` and
``await aq.enqueue(x)`` share every line of logic.

Failures are typed (:func:`emqfast.errors.translate`: ``ConnectionFailed``/``ReplyLost``,
``ServerBusy``, ``ServerFull``, ``PermissionDenied``, the Lua ``EMQ*`` classes) and thrown
into the operation at its ``yield``: most let them propagate, a bulk operation catches
them to report what landed (``enqueue_many``'s :class:`~emqfast.errors.PartialBatch`).
Script calls are never re-sent blindly (:mod:`emqfast.transport`).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import (Any, Callable, Dict, Generator, List, NamedTuple, Optional, Sequence, Tuple,
                    Union)

import redis

from . import errors, transport
from .scripts import Script, map_error, run_pipeline, run_pipeline_async, send, send_async

__all__ = ["Call", "Cmd", "Batch", "Columns", "Scan", "Watched", "Op", "operation", "run",
           "run_async"]


class Call(NamedTuple):
    """Run one Lua move (EVALSHA, NOSCRIPT reload); reply as the script returns it.

    A Lua error is raised as its typed :mod:`emqfast.errors` class. A tuple, so
    lists of calls also feed :func:`~emqfast.scripts.run_pipeline` and
    :func:`~emqfast.wire.run_calls` as they are.
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
    slot (not raised); for commands an error reply raises. ``wire=True`` lets
    the sync driver send calls through the backend Batcher (hiredis under C).
    ``wait=(replicas, timeout_ms)`` (calls only) sends ``WAIT`` on the connection that
    wrote them; the replies then end with the fewest replicas that acknowledged.
    """

    items: Sequence[Union[Call, Cmd]]
    wire: bool = False
    wait: Optional[Tuple[int, int]] = None


@dataclass(frozen=True)
class Columns:
    """A bulk of one script framed as columns (see ``Batcher.evalsha_columns``):
    call ``i``'s argument ``s`` is ``slots[s][0]`` plus, when ``slots[s][1]`` is a
    column index, ``columns[slots[s][1]][i]``. Replies in order, errors in their slot."""

    script: Script
    numkeys: int
    slots: Sequence[Tuple[Any, Optional[int]]]
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


Request = Union[Call, Cmd, Batch, Columns, Scan, Watched]
Op = Generator[Request, Any, Any]


def operation(fn: Callable[..., Op]) -> Callable[..., Any]:
    """Make generator method ``fn`` a public operation: ``self._drive(fn(self, ...))``.

    The undecorated generator stays reachable as ``.op``, so one operation can
    ``yield from`` another inside the same drive.
    """
    @functools.wraps(fn)
    def public(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self._drive(fn(self, *args, **kwargs))

    public.op = fn  # type: ignore[attr-defined]
    return public


# --- the blocking driver ------------------------------------------------------------------

def run(client: Any, op: Op, wire: Optional[Callable[[], Any]] = None) -> Any:
    """Drive ``op`` to completion over the blocking redis-py ``client``.

    ``wire`` returns the Batcher to use for :class:`Columns` and wired batches
    (the caller's cached one); without it a Batcher is made and closed per request.
    """
    try:
        request = op.send(None)
        while True:
            try:
                reply = _perform(client, request, wire)
            except Exception as exc:
                request = op.throw(typed_failure(exc))
            else:
                request = op.send(reply)
    except StopIteration as done:
        return done.value
    finally:
        op.close()


# Plain commands that are not idempotent (a re-send adds twice): sent once through
# emqfast.transport, never through a client's retry. (Reads and idempotent writes such as
# ZADD of a fixed score may go through redis-py: a re-send changes nothing.)
ONCE_ONLY = frozenset({"ZINCRBY", "INCR", "INCRBY", "HINCRBY"})


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise map_error(reply)
    return reply


def typed_failure(exc: BaseException) -> BaseException:
    """emqfast's typed error for a driver failure (cause chained). A redis-py connection
    error on a plain command counts as sent unless it failed while connecting."""
    sent = "connecting to" not in str(exc)
    typed = errors.translate(exc, sent=sent)
    if typed is not exc and typed.__cause__ is None:
        typed.__cause__ = exc
    return typed


def _perform(client: Any, req: Request, wire: Optional[Callable[[], Any]]) -> Any:
    if isinstance(req, Call):
        return req.script(client, req.keys, req.args)
    if isinstance(req, Cmd):
        if req.args[0] in ONCE_ONLY and not req.options:
            return _raised(transport.execute(client, [req.args], routes=[req.args[1]])[0])
        return client.execute_command(*req.args, **req.options)
    if isinstance(req, Batch):
        if not req.items:
            return []
        if isinstance(req.items[0], Call):
            calls = list(req.items)
            if req.wire:
                from .wire import run_calls
                return _with_batcher(client, wire, lambda b: run_calls(b, calls, req.wait))
            return send(client, calls, req.wait)
        pipe = client.pipeline(transaction=False)
        for c in req.items:
            pipe.execute_command(*c.args, **c.options)  # type: ignore[union-attr]
        return pipe.execute()
    if isinstance(req, Columns):
        if req.wait:
            return _with_batcher(client, wire, lambda b: b.evalsha_columns(
                req.script.sha, req.script.source.encode(), req.numkeys, req.slots, req.columns,
                req.wait))
        return _with_batcher(client, wire, lambda b: b.evalsha_columns(
            req.script.sha, req.script.source.encode(), req.numkeys, req.slots, req.columns))
    if isinstance(req, Scan):
        return list(client.scan_iter(match=req.match, count=req.count))
    if isinstance(req, Watched):
        return _watched_sync(client, req)
    raise TypeError(f"unknown request {req!r}")


def _with_batcher(client: Any, wire: Optional[Callable[[], Any]],
                  use: Callable[[Any], Any]) -> Any:
    if wire is not None:
        return use(wire())
    from . import backend
    batcher = backend.batcher_for(client)
    try:
        return use(batcher)
    finally:
        batcher.close()


def _watched_sync(client: Any, req: Watched) -> Tuple[Any, List[Any]]:
    # client.transaction (not a hand-made WATCH loop): RedisCluster supports only this form
    seen: Dict[str, Any] = {}

    def txn(pipe: Any) -> None:
        first = pipe.execute_command(*req.read.args, **req.read.options)  # WATCHed: runs now
        seen["first"] = first
        pipe.multi()
        for c in req.then(first):
            pipe.execute_command(*c.args, **c.options)

    replies = client.transaction(txn, *req.keys)
    return seen["first"], replies


# --- the asyncio driver -------------------------------------------------------------------

async def run_async(client: Any, op: Op) -> Any:
    """Drive ``op`` to completion over a ``redis.asyncio`` client (pipelines for bulk)."""
    try:
        request = op.send(None)
        while True:
            try:
                reply = await _perform_async(client, request)
            except Exception as exc:
                request = op.throw(typed_failure(exc))
            else:
                request = op.send(reply)
    except StopIteration as done:
        return done.value
    finally:
        op.close()


async def _perform_async(client: Any, req: Request) -> Any:
    if isinstance(req, Call):
        return await req.script.call_async(client, req.keys, req.args)
    if isinstance(req, Cmd):
        if req.args[0] in ONCE_ONLY and not req.options:
            return _raised((await transport.execute_async(client, [req.args],
                                                          routes=[req.args[1]]))[0])
        return await client.execute_command(*req.args, **req.options)
    if isinstance(req, Batch):
        if not req.items:
            return []
        if isinstance(req.items[0], Call):
            return await send_async(client, list(req.items), req.wait)
        pipe = client.pipeline(transaction=False)
        for c in req.items:
            pipe.execute_command(*c.args, **c.options)  # type: ignore[union-attr]
        return await pipe.execute()
    if isinstance(req, Columns):
        # The C Batcher is a blocking socket: under asyncio a bulk goes through
        # redis.asyncio pipelines, the same calls the Batcher would frame.
        calls = [(req.script, row[:req.numkeys], row[req.numkeys:])
                 for row in expand_columns(req.slots, req.columns)]
        return await send_async(client, calls, req.wait)
    if isinstance(req, Scan):
        return [k async for k in client.scan_iter(match=req.match, count=req.count)]
    if isinstance(req, Watched):
        return await _watched_async(client, req)
    raise TypeError(f"unknown request {req!r}")


async def _watched_async(client: Any, req: Watched) -> Tuple[Any, List[Any]]:
    seen: Dict[str, Any] = {}

    async def txn(pipe: Any) -> None:
        first = await pipe.execute_command(*req.read.args, **req.read.options)
        seen["first"] = first
        pipe.multi()
        for c in req.then(first):
            pipe.execute_command(*c.args, **c.options)

    replies = await client.transaction(txn, *req.keys)
    return seen["first"], replies


def expand_columns(slots: Sequence[Tuple[Any, Optional[int]]],
                   columns: Sequence[Sequence[Any]]) -> List[List[bytes]]:
    """The per-call argument lists a :class:`Columns` request stands for."""
    n = len(columns[0]) if columns else 0
    consts = [v if isinstance(v, bytes) else str(v).encode() for v, _ in slots]
    return [[c if k is None else c + _bytes(columns[k][i]) for c, (_, k) in zip(consts, slots)]
            for i in range(n)]


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    return (value if isinstance(value, str) else str(value)).encode()


def typed(reply: Any) -> Any:
    """A reply with a Lua error reply mapped to its typed class (for per-slot errors)."""
    return map_error(reply) if isinstance(reply, redis.ResponseError) else reply
