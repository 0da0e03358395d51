"""The two drivers that run the sans-IO operations of :mod:`emqfast.core.ops`.

- :func:`run` drives an operation with a blocking ``redis.Redis`` / ``RedisCluster``
  (the sync facade; ``Batch(via_batcher=True)`` and :class:`~emqfast.core.ops.Columns` go
  through the backend Batcher, hiredis under C);
- :func:`run_async` drives it with ``redis.asyncio`` (the :mod:`emqfast.aio` facade).

Failures are typed (:func:`emqfast.errors.translate`) and thrown into the operation at
its ``yield``. Script calls are never re-sent blindly (:mod:`emqfast.backends.transport`).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, cast

import redis

from emqfast.backends import gather, transport
from emqfast.backends import select as backend
from emqfast.backends.scripts import map_error, send, send_async
from emqfast.backends.transport import UNSENT, Wait, cut_error
from emqfast.core import errors
from emqfast.core.ops import (WAITS, Batch, Call, Cmd, Columns, Gathered, Request, Returns, Scan,
                              Waits, Watched, column_calls)

__all__ = ["BatcherSource", "run", "run_async", "run_calls", "typed", "typed_failure"]


# --- the blocking driver ------------------------------------------------------------------

BatcherSource = Callable[[], Any]  # returns the Batcher to use (the caller's cached one)
_R = TypeVar("_R")


def run(client: Any, op: Returns[_R], batcher: Optional[BatcherSource] = None,
        waits: Optional[Waits] = None) -> _R:
    """Drive ``op`` to completion over the blocking redis-py ``client``.

    ``batcher`` returns the Batcher to use for :class:`Columns` and
    ``Batch(via_batcher=True)``; without it a Batcher is made and closed per request.
    ``waits`` performs a Worker's waits (:data:`~emqfast.core.ops.Wait`).
    """
    try:
        request = op.send(None)
        while True:
            try:
                if isinstance(request, WAITS):
                    reply = waits.perform(request)  # type: ignore[union-attr]
                else:
                    reply = _perform(client, request, batcher)
            except Exception as exc:
                request = op.throw(typed_failure(exc))
            else:
                request = op.send(reply)
    except StopIteration as done:
        result: _R = done.value  # what the operation returned
        return result
    finally:
        op.close()


# Plain commands that are not idempotent (a re-send adds twice): sent once through
# emqfast.backends.transport, never through a client's retry. (Reads and idempotent writes such as
# ZADD of a fixed score may go through redis-py: a re-send changes nothing.)
# How Redis words an ACL denial of a command a script calls (no NOPERM code prefix).
_SCRIPT_NOPERM = "user executing the script can't run this command"

ONCE_ONLY = frozenset({"ZINCRBY", "INCR", "INCRBY", "HINCRBY"})


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise map_error(reply)
    return reply


def typed_failure(exc: BaseException) -> BaseException:
    """emqfast's typed error for a driver failure (cause chained). A redis-py connection
    error on a plain command counts as sent unless it failed while connecting."""
    if isinstance(exc, errors.EmqError):  # typed already (a Worker's own waits raise them)
        return errors.certificate_rejected(exc) or exc
    sent = "connecting to" not in str(exc)
    typed = errors.translate(exc, sent=sent)
    if not isinstance(typed, errors.EmqError) and _SCRIPT_NOPERM in str(typed):
        typed = errors.PermissionDenied(str(typed))
    if typed is not exc and typed.__cause__ is None:
        typed.__cause__ = exc
    return typed


def _outcome(outcome: Any) -> Any:
    """A gathered item's outcome: raised when it is an exception (its caller's own)."""
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def _perform(client: Any, req: Request, batcher: Optional[BatcherSource]) -> Any:
    if isinstance(req, Gathered):  # a group commit (backends/gather.py)
        return _outcome(gather.submit(client, req, lambda op: run(client, op, batcher)))
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
            calls = cast(List[Call], list(req.items))  # a Batch holds one kind
            if req.via_batcher:
                return _with_batcher(client, batcher, lambda b: run_calls(b, calls, req.wait))
            return send(client, calls, req.wait)
        pipe = client.pipeline(transaction=False)
        for c in req.items:
            pipe.execute_command(*c.args, **c.options)  # type: ignore[union-attr]
        return pipe.execute()
    if isinstance(req, Columns):
        # ``wait`` only when set: the Batchers' wrappers forward positional arguments
        waited = (req.wait,) if req.wait else ()
        return _with_batcher(client, batcher, lambda b: b.evalsha_columns(
            req.script.sha, req.script.source_bytes, req.numkeys, req.slots, req.columns,
            *waited))
    if isinstance(req, Scan):
        return list(client.scan_iter(match=req.match, count=req.count))
    if isinstance(req, Watched):
        return _watched_sync(client, req)
    raise TypeError(f"unknown request {req!r}")


def _with_batcher(client: Any, source: Optional[BatcherSource],
                  use: Callable[[Any], Any]) -> Any:
    """``use(batcher)`` with the caller's Batcher, or a fresh one closed afterwards."""
    if source is not None:
        return use(source())
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

async def run_async(client: Any, op: Returns[_R], waits: Optional[Waits] = None,
                    gate: Any = None, client_of: Optional[Callable[[], Any]] = None) -> _R:
    """Drive ``op`` to completion over a ``redis.asyncio`` client (pipelines for bulk);
    ``waits`` performs a Worker's waits (its ``perform`` returns coroutines); ``gate`` (an
    ``asyncio.Semaphore``) bounds how many requests of its users are in flight at once. A
    cancellation is not thrown into the operation: it closes it and propagates.

    ``client_of`` (instead of ``client``) returns the client once the coroutine runs, in
    its event loop: a coroutine made outside its loop still gets that loop's client,
    with no coroutine wrapped around this one to pick it."""
    if client_of is not None:
        client = client_of()
    try:
        request = op.send(None)
        while True:
            try:
                if isinstance(request, WAITS):
                    reply = await waits.perform(request)  # type: ignore[union-attr]
                elif isinstance(request, Gathered) and gate is None:  # (one await less)
                    reply = _outcome(await gather.submit_async(
                        client, request, lambda op: run_async(client, op)))
                elif gate is None:
                    reply = await _perform_async(client, request)
                else:
                    async with gate:
                        reply = await _perform_async(client, request)
            except Exception as exc:
                request = op.throw(typed_failure(exc))
            else:
                request = op.send(reply)
    except StopIteration as done:
        result: _R = done.value  # what the operation returned
        return result
    finally:
        op.close()


async def _perform_async(client: Any, req: Request) -> Any:
    if isinstance(req, Gathered):  # a group commit (backends/gather.py)
        return _outcome(await gather.submit_async(client, req,
                                                  lambda op: run_async(client, op)))
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
            items = cast(List[Call], list(req.items))  # a Batch holds one kind
            return await send_async(client, items, req.wait)
        pipe = client.pipeline(transaction=False)
        for c in req.items:
            pipe.execute_command(*c.args, **c.options)  # type: ignore[union-attr]
        return await pipe.execute()
    if isinstance(req, Columns):
        # The C Batcher is a blocking socket: under asyncio a bulk goes through
        # redis.asyncio pipelines, the same calls the Batcher would frame.
        calls = [(req.script, keys, args)
                 for keys, args in column_calls(req.numkeys, req.slots, req.columns)]
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


def typed(reply: Any) -> Any:
    """A reply with a Lua error reply mapped to its typed class (for per-slot errors)."""
    return map_error(reply) if isinstance(reply, redis.RedisError) else reply


__all__ = ["run_calls"]


def run_calls(batcher: Any, calls: Sequence[Call], wait: Wait = None) -> List[Any]:
    """Run every call (no MULTI); typed error replies are returned, not raised.

    Never re-sent after a lost reply: a batch cut part-way raises
    :class:`~emqfast.backends.transport.BatchCut` whose ``replies`` are in call order
    (typed). ``wait=(replicas, timeout_ms)``: a WAIT follows each group's writes on its
    connection; the list then ends with the fewest replicas that acknowledged."""
    if len(calls) == 1 and not wait:  # one call (a single enqueue): no grouping to do
        script, keys, args = calls[0]
        try:
            [reply] = batcher.evalsha_many(script.sha, script.source_bytes, len(keys),
                                           [[*keys, *args]])
        except errors.ConnectionFailed as cut:
            got = getattr(cut, "replies", None) or [UNSENT]
            raise cut_error(cut, [_typed(r) for r in got]) from cut
        return [_typed(reply)]
    groups: Dict[Tuple[str, int], List[int]] = {}
    for i, (script, keys, _) in enumerate(calls):
        groups.setdefault((script.sha, len(keys)), []).append(i)
    replies: List[Any] = [UNSENT] * len(calls)
    acked: Optional[int] = None
    for (_, numkeys), members in groups.items():
        script = calls[members[0]][0]
        rows = [[*keys, *args] for _, keys, args in (calls[i] for i in members)]
        try:
            if wait:
                got = batcher.evalsha_many(script.sha, script.source_bytes, numkeys, rows,
                                           wait)  # positional: wrappers forward *args
                acked = got[-1] if acked is None else min(acked, got[-1])
                got = got[:-1]
            else:
                got = batcher.evalsha_many(script.sha, script.source_bytes, numkeys, rows)
        except errors.ConnectionFailed as cut:  # earlier groups landed: report them too
            for i, reply in zip(members, getattr(cut, "replies", None) or [UNSENT] * len(rows)):
                replies[i] = _typed(reply)
            raise cut_error(cut, replies) from cut
        for i, reply in zip(members, got):
            replies[i] = _typed(reply)
    return replies + [acked] if wait else replies


def _typed(reply: Any) -> Any:
    # Not only ResponseError: a LOADING reply comes back as redis-py's BusyLoadingError
    # (a ConnectionError subclass), which map_error types as ServerBusy too.
    return map_error(reply) if isinstance(reply, redis.RedisError) else reply
