"""Drive many read operations side by side, one pipeline per round.

The facade's reads are sans-IO generators (:mod:`emqfast.core.ops`): ``Queue.counts.op(q)``
yields a :class:`~emqfast.core.ops.Batch` and waits for its replies. Driving one queue's
read at a time costs a round trip per queue, 1,000 of them for the overview of 1,000
queues. :func:`run_many` steps every operation together instead: each round gathers what
all of them ask for (plain commands and batches of commands) into one pipeline, then
hands each its replies. The result is what each operation returns, or the typed error
it raised, so one broken queue does not blank the page.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import redis

from emqfast.backends.drive import typed_failure
from emqfast.core.ops import Batch, Cmd, Op

hiredis: Any  # the module, or None without it (then redis-py's own pipeline is used)
try:  # redis-py's own dependency when fast parsing is on (emqfast requires it)
    import hiredis
except ImportError:  # pragma: no cover
    hiredis = None

_PENDING = object()  # an operation still running


def run_many(client: Any, ops: Sequence[Op]) -> List[Any]:
    """Run ``ops`` (reads yielding :class:`Cmd` or a :class:`Batch` of them) to the end,
    each round's requests in one pipeline; returns each result or its exception."""
    results: List[Any] = [_PENDING] * len(ops)
    waiting: Dict[int, Any] = {}
    for i, op in enumerate(ops):
        _advance(i, op, ("send", None), waiting, results)
    while waiting:
        plan, commands = _plan(waiting)
        replies = _execute(client, commands)
        waiting = {}
        for i, single, start, n in plan:
            part = replies[start:start + n]
            failure = next((r for r in part if isinstance(r, Exception)), None)
            step = ("throw", typed_failure(failure)) if failure is not None else \
                ("send", part[0] if single else list(part))
            _advance(i, ops[i], step, waiting, results)
    return results


def _plan(waiting: Dict[int, Any]) -> Tuple[List[Tuple[int, bool, int, int]], List[Cmd]]:
    """(op index, single command?, first reply, reply count) per waiting op, and the
    commands of the round in order."""
    plan: List[Tuple[int, bool, int, int]] = []
    commands: List[Cmd] = []
    for i, request in waiting.items():
        cmds = [request] if isinstance(request, Cmd) else list(request.items)
        plan.append((i, isinstance(request, Cmd), len(commands), len(cmds)))
        commands.extend(cmds)
    return plan, commands


def _execute(client: Any, commands: List[Cmd]) -> List[Any]:
    if not commands:
        return []
    kwargs = client.connection_pool.connection_kwargs if type(client) is redis.Redis else {}
    if hiredis is not None and kwargs and kwargs.get("protocol") in (None, 2, "2") \
            and not kwargs.get("decode_responses"):
        return _execute_packed(client, commands)
    pipe = client.pipeline(transaction=False)
    for c in commands:
        pipe.execute_command(*c.args, **c.options)
    try:
        replies: List[Any] = pipe.execute(raise_on_error=False)
        return replies
    except Exception as exc:  # the connection itself failed: every op gets the error
        return [exc] * len(commands)


def _execute_packed(client: redis.Redis, commands: List[Cmd]) -> List[Any]:
    """The pipeline on one pooled connection, framed by hiredis's C packer (redis-py's
    own packing of ~10,000 commands costs about 4x as much) and each reply put through
    the client's response callbacks as redis-py's pipeline does; an error reply stays in
    its slot. Reads only: a broken connection fails every slot (nothing re-sent)."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()  # redis-py's Connection methods are unannotated
    try:
        conn.send_packed_command([b"".join(hiredis.pack_command(c.args) for c in commands)],
                                 check_health=False)
        raw = _read_all(conn, len(commands))
        if raw is None:  # no socket to read in bulk: one reply at a time
            return [_reply(client, conn, c) for c in commands]
        callbacks: Dict[Any, Any] = {}
        return [_decoded(client, c, r, callbacks) for c, r in zip(commands, raw)]
    except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
        conn.disconnect()
        return [exc] * len(commands)
    finally:
        pool.release(conn)


def _read_all(conn: Any, n: int) -> Optional[List[Any]]:
    """``n`` replies read from the connection's socket by one hiredis Reader (a reply
    at a time through redis-py costs ~2.5x as much); None when the connection exposes no
    socket. An error reply is kept as its ResponseError; bytes past the ``n`` replies
    (none are expected) drop the connection rather than confuse its next user."""
    sock = getattr(conn, "_sock", None)
    if sock is None:
        return None
    reader = hiredis.Reader(replyError=redis.ResponseError)
    out: List[Any] = []
    while len(out) < n:
        data = sock.recv(1 << 16)
        if not data:
            raise redis.ConnectionError("connection closed while reading replies")
        reader.feed(data)
        while len(out) < n:
            reply = reader.gets()
            if reply is False:
                break
            out.append(reply)
    if reader.gets() is not False or reader.has_data():
        conn.disconnect()
    return out


def _decoded(client: redis.Redis, cmd: Cmd, raw: Any, seen: Optional[Dict[Any, Any]] = None
             ) -> Any:
    """A reply as redis-py's pipeline returns it (the client's response callbacks;
    ``seen`` caches them by command name for one round)."""
    if isinstance(raw, Exception):
        return raw
    name = cmd.args[0]
    if seen is not None and name in seen:
        callback = seen[name]
    else:
        callbacks: Dict[Any, Any] = client.response_callbacks  # a dict (case-insensitive)
        callback = callbacks.get(str(name).upper())
        if seen is not None:
            seen[name] = callback
    if callback is None:
        return raw
    return callback(raw, **cmd.options) if cmd.options else callback(raw)


def _reply(client: redis.Redis, conn: Any, cmd: Cmd) -> Any:
    try:
        raw = conn.read_response()
    except redis.ResponseError as exc:  # an error reply: read, so the stream stays in step
        return exc
    return _decoded(client, cmd, raw)


def _advance(i: int, op: Op, step: Tuple[str, Any], waiting: Dict[int, Any],
             results: List[Any]) -> None:
    """Send a reply (or throw an error) into op ``i`` and note what it asks next."""
    kind, value = step
    try:
        request = op.send(value) if kind == "send" else op.throw(value)
    except StopIteration as done:
        results[i] = done.value
        return
    except Exception as exc:  # noqa: BLE001 - kept as this op's result
        results[i] = exc
        return
    # a Batch holds calls or commands, never both: its first item says which
    if isinstance(request, Cmd) or (isinstance(request, Batch) and (
            not request.items or isinstance(request.items[0], Cmd))):
        waiting[i] = request
        return
    op.close()
    results[i] = TypeError(f"run_many drives plain reads only, not {type(request).__name__}")
