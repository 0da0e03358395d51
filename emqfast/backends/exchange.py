"""One exchange on one connection: emqfast's commands written once, their replies read
once, and what a failure left marked (see :mod:`emqfast.backends.transport` for why).

A failed exchange raises :class:`Failed` carrying one entry per command: its reply when
it arrived, :data:`LOST` when it was written but its reply never came (it may have run),
:data:`UNSENT` when it never left. :func:`cut_error` turns that into the caller's typed
error (:class:`BatchCut` when anything may have run).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import redis
from redis.exceptions import ResponseError

from emqfast.core import deadlines, errors

Command = Sequence[Any]
Wait = Optional[Tuple[int, int]]

# Network failures: redis-py's own and the builtins its lower layers may let through.
_NETWORK = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
            ConnectionError, TimeoutError, OSError)
_PACK_BYTES = 64 << 10  # bytes framed per write (few syscalls, bounded copies)
# Error replies kept in their slot. redis-py raises LOADING as BusyLoadingError, a
# ConnectionError subclass, but it is a whole reply (the connection is in step) saying the
# command did not run: typed ServerBusy like the C batcher's, not a lost reply.
_REPLY_ERRORS = (ResponseError, redis.exceptions.BusyLoadingError)
# A full pool (redis-py >= 6) is not a network failure: nothing was sent, and retrying
# meets the same full pool (errors.PoolExhausted, naming its size).
_POOL_FULL: Any = getattr(redis.exceptions, "MaxConnectionsError", ())


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


LOST = _Marker("LOST")  # written, reply lost: may have run
UNSENT = _Marker("UNSENT")  # never left the client: did not run


class BatchCut(errors.ReplyLost):
    """The connection failed after part of a batch was written.

    ``replies`` has one entry per command sent: its reply, :data:`LOST` or :data:`UNSENT`.
    Still a :class:`~emqfast.errors.ReplyLost` (and a builtin ``ConnectionError``), so
    code that does not look at the partial replies handles it as a lost reply."""

    def __init__(self, message: str, replies: List[Any]):
        super().__init__(message)
        self.replies = replies


def cut_error(exc: BaseException, replies: List[Any]) -> BaseException:
    """The typed error for a failure that left ``replies`` (with markers): BatchCut when
    anything may have run, else what :func:`errors.translate` says with ``sent=False``."""
    if all(r is UNSENT for r in replies):
        return errors.translate(exc, sent=False)
    typed = errors.translate(exc, sent=True)
    text = str(typed) if isinstance(typed, errors.ConnectionFailed) else \
        f"{type(exc).__name__}: {exc}"
    return BatchCut(text, replies)


def route_key(command: Command) -> Any:
    """The key a command is routed by on Cluster: an EVALSHA's first key, else None."""
    if len(command) > 3 and command[0] == "EVALSHA" and int(command[2]) > 0:
        return command[3]
    return None


try:  # hiredis frames a command in C; redis.asyncio's own packer is pure Python
    from hiredis import pack_command as _hiredis_pack_fn
    _hiredis_pack: Optional[Callable[..., bytes]] = _hiredis_pack_fn
except ImportError:  # pragma: no cover - hiredis is a dependency
    _hiredis_pack = None


def _packer(conn: Any) -> Callable[[Command], List[bytes]]:
    """How to frame one command for ``conn``: hiredis when the connection encodes str as
    strict UTF-8 (hiredis's encoding: the bytes are the same), else the connection's own."""
    enc = getattr(conn, "encoder", None)
    if _hiredis_pack is None or enc is None \
            or str(enc.encoding).lower().replace("-", "") != "utf8" \
            or enc.encoding_errors != "strict":
        return lambda args: conn.pack_command(*args)

    def pack(args: Command) -> List[bytes]:
        try:
            return [_hiredis_pack(tuple(args))]
        except TypeError:  # a type hiredis does not frame: redis-py says what is wrong
            return conn.pack_command(*args)  # type: ignore[no-any-return]
    return pack


def _frames(conn: Any, commands: Sequence[Command]) -> Iterator[Tuple[bytes, int]]:
    """(bytes, index after the last command in it) per ~64 KB of framed commands."""
    buf: List[bytes] = []
    size = 0
    pack = _packer(conn)
    for i, args in enumerate(commands):
        for piece in pack(args):
            buf.append(piece)
            size += len(piece)
        if size >= _PACK_BYTES:
            yield b"".join(buf), i + 1
            buf, size = [], 0
    if buf:
        yield b"".join(buf), len(commands)


class Failed(Exception):
    """An exchange failed: ``replies`` with markers, ``cause`` the network error."""

    def __init__(self, cause: BaseException, replies: List[Any]):
        super().__init__(str(cause))
        self.cause = cause
        self.replies = replies


def _deadlines(conn: Any, commands: Sequence[Command]) -> List[Optional[float]]:
    """Per command, the read deadline to give ``read_response`` (None: the connection's
    own ``socket_timeout``): every read has one (:mod:`emqfast.core.deadlines`) however
    the connection was set up, and a WAIT gets its block time plus a margin."""
    configured = getattr(conn, "socket_timeout", None)
    plain = None if configured is not None and configured > 0 else \
        deadlines.read_timeout(None)
    out: List[Optional[float]] = []
    for args in commands:
        if args and args[0] == "WAIT":  # (with_wait's spelling)
            out.append(deadlines.blocking_read_timeout(int(args[2]) / 1000, configured))
        else:
            out.append(plain)
    return out


def marked(replies: List[Any], written: int, total: int) -> List[Any]:
    """``replies`` padded to ``total``: LOST for what was written, UNSENT for the rest."""
    return replies + [LOST] * (written - len(replies)) + [UNSENT] * (total - max(written,
                                                                                 len(replies)))


# --- blocking ----------------------------------------------------------------------------

def exchange(conn: Any, commands: Sequence[Command]) -> List[Any]:
    """Write ``commands`` on ``conn`` and read every reply; never re-sent."""
    replies: List[Any] = []
    written = 0
    try:
        conn.connect()
        for data, upto in _frames(conn, commands):
            conn.send_packed_command([data], check_health=False)
            written = upto
        for timeout in _deadlines(conn, commands):
            try:
                replies.append(conn.read_response() if timeout is None
                               else conn.read_response(timeout=timeout))
            except _REPLY_ERRORS as exc:
                replies.append(exc)
    except BaseException as exc:
        conn.disconnect()  # unread replies or half a command: the connection is out of step
        if isinstance(exc, _NETWORK) or isinstance(exc, redis.exceptions.AuthenticationError):
            raise Failed(exc, marked(replies, written, len(commands))) from exc
        raise
    return replies


def on_pool(client: Any, commands: Sequence[Command]) -> List[Any]:
    """:func:`exchange` on a connection of a ``redis.Redis`` client."""
    single = getattr(client, "connection", None)
    if single is not None:
        lock = getattr(client, "single_connection_lock", None)
        if lock is None:
            return exchange(single, commands)
        with lock:
            return exchange(single, commands)
    pool = client.connection_pool
    try:
        conn = pool.get_connection()
    except _POOL_FULL as exc:
        raise errors.pool_exhausted(getattr(pool, "max_connections", None), exc) from exc
    except BaseException as exc:
        if isinstance(exc, _NETWORK) or isinstance(exc, redis.exceptions.AuthenticationError):
            raise Failed(exc, [UNSENT] * len(commands)) from exc
        raise
    try:
        return exchange(conn, commands)
    finally:
        pool.release(conn)


def wait_lost(failed: "Failed", n: int, wait: Wait) -> Optional[List[Any]]:
    """When only WAIT's reply was lost (every write replied), the writes landed and their
    replication is unconfirmed: their replies and 0 replicas, not a failure."""
    if wait and all(r is not LOST and r is not UNSENT for r in failed.replies[:n]):
        return failed.replies[:n] + [0]
    return None


def with_wait(commands: List[Command], wait: Wait) -> List[Command]:
    """``commands`` followed by ``WAIT replicas timeout_ms`` when ``wait`` asks for it."""
    return commands + [("WAIT", wait[0], wait[1])] if wait else commands


def min_acked(acked: Optional[int], reply: Any) -> Optional[int]:
    """The fewer of ``acked`` and a WAIT ``reply`` (an error reply counts as 0)."""
    if isinstance(reply, Exception):  # e.g. WAIT refused: count it as no replica
        reply = 0
    return int(reply) if acked is None else min(acked, int(reply))


# --- asyncio -----------------------------------------------------------------------------

async def exchange_async(conn: Any, commands: Sequence[Command]) -> List[Any]:
    """:func:`exchange` on a ``redis.asyncio`` connection."""
    replies: List[Any] = []
    written = 0
    try:
        await conn.connect()
        for data, upto in _frames(conn, commands):
            await conn.send_packed_command([data], check_health=False)
            written = upto
        for timeout in _deadlines(conn, commands):
            try:
                replies.append(await (conn.read_response() if timeout is None
                                      else conn.read_response(timeout=timeout)))
            except _REPLY_ERRORS as exc:
                replies.append(exc)
    except BaseException as exc:
        try:
            await asyncio.shield(conn.disconnect())
        except BaseException:
            pass
        if isinstance(exc, _NETWORK) or isinstance(exc, redis.exceptions.AuthenticationError):
            raise Failed(exc, marked(replies, written, len(commands))) from exc
        raise
    return replies


async def on_pool_async(client: Any, commands: Sequence[Command]) -> List[Any]:
    """:func:`exchange_async` on a connection of a ``redis.asyncio.Redis`` client."""
    single = getattr(client, "connection", None)
    if single is not None:
        async with client._single_conn_lock:
            return await exchange_async(single, commands)
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()
    except _POOL_FULL as exc:
        raise errors.pool_exhausted(getattr(pool, "max_connections", None), exc) from exc
    except BaseException as exc:
        if isinstance(exc, _NETWORK) or isinstance(exc, redis.exceptions.AuthenticationError):
            raise Failed(exc, [UNSENT] * len(commands)) from exc
        raise
    try:
        return await exchange_async(conn, commands)
    finally:
        await pool.release(conn)


async def on_node_async(node: Any, commands: Sequence[Command]) -> List[Any]:
    """:func:`exchange_async` on a connection of one ``redis.asyncio`` cluster node."""
    try:
        conn = node.acquire_connection()
    except BaseException as exc:
        if isinstance(exc, _NETWORK):
            raise Failed(exc, [UNSENT] * len(commands)) from exc
        raise
    try:
        return await exchange_async(conn, commands)
    finally:
        node.release(conn)
