"""Sending emqfast's commands without blind re-sends.

redis-py wraps every command and pipeline in the client's ``Retry``: when a connection
drops after Redis ran an EVALSHA but before its reply arrived, redis-py sends the same
EVALSHA again (10 times by default in redis-py 8), and a pipeline is re-sent whole.
emqfast's script calls must never be re-sent that way (a re-sent claim leases jobs
nobody sees; a re-sent batch reports its own jobs as duplicates), so they go through
:func:`execute` / :func:`execute_async` instead: the commands are written on one
connection taken from the client's pool (or, on Redis Cluster, from the pool of the
primary owning their slot) and their replies read back, once. The client's retry
policy never applies; the pool still reconnects on the next call.

What the caller learns when the connection fails:

- nothing of the batch was written: :class:`~emqfast.errors.ConnectionFailed`
  (``sent=False``: it certainly did not run);
- some of it was written: :class:`BatchCut`, a :class:`~emqfast.errors.ReplyLost`
  carrying one entry per command: its reply when it arrived, :data:`LOST` when it was
  written but its reply never came (it may have run), :data:`UNSENT` when it never left.

Error replies are returned in their slot (as redis-py's ``ResponseError`` instances),
never raised. On Cluster, ``MOVED`` and ``ASK`` replies (the command did not run) are
followed with redis-py's own slot map, as redis-py does; ``TRYAGAIN``/``CLUSTERDOWN``
stay in their slot (:func:`emqfast.errors.translate` makes them ``ServerBusy``). After a
connection failure the slot map is refreshed, so the next call finds a promoted replica.

``wait=(replicas, timeout_ms)`` appends ``WAIT replicas timeout_ms`` to the writes on the
same connection (per node), and the result then ends with one more entry: the smallest
number of replicas that acknowledged.

Read top to bottom: one exchange on one connection (framing, the markers, ``BatchCut``),
the entry both facades call (:func:`execute` / :func:`execute_async`), then the Cluster
routing and redirect rounds.
"""
from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Dict, Generator, Iterator, List, Optional, Sequence, Tuple

import redis
from redis.exceptions import AskError, MovedError, ResponseError

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
    if isinstance(typed, errors.CertificateRejected):  # the handshake failed: nothing ran
        return typed
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


def read_reply(conn: Any, timeout: Optional[float]) -> Any:
    """``conn.read_response()`` bounded by ``timeout`` seconds (None: the connection's own
    ``socket_timeout``) on every redis-py the package supports: from 8.0 the read takes a
    ``timeout``; before it, the socket's timeout is set around the read. A read that
    passes its deadline raises redis-py's TimeoutError, and redis-py drops the connection."""
    if timeout is None:
        return conn.read_response()
    if _takes_timeout(type(conn)):
        return conn.read_response(timeout=timeout)
    sock = getattr(conn, "_sock", None)
    if sock is None:  # not connected: read_response raises its own ConnectionError
        return conn.read_response()
    previous = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        return conn.read_response()
    finally:
        if conn._sock is sock:  # still this socket (a timeout disconnects it)
            sock.settimeout(previous)


_TAKES_TIMEOUT: Dict[type, bool] = {}


def _takes_timeout(cls: type) -> bool:
    known = _TAKES_TIMEOUT.get(cls)
    if known is None:
        known = _TAKES_TIMEOUT[cls] = \
            "timeout" in inspect.signature(getattr(cls, "read_response")).parameters
    return known


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
                replies.append(read_reply(conn, timeout))
            except _REPLY_ERRORS as exc:
                replies.append(exc)
    except BaseException as exc:
        conn.disconnect()  # unread replies or half a command: the connection is out of step
        if isinstance(exc, _NETWORK) or isinstance(exc, redis.exceptions.AuthenticationError):
            raise Failed(exc, marked(replies, written, len(commands))) from exc
        if errors.is_torn_connection(exc):
            # closed under us by another thread (the client's own close): a cut connection
            cut = redis.exceptions.ConnectionError(f"connection closed under the call: {exc}")
            raise Failed(cut, marked(replies, written, len(commands))) from exc
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
            await _send_async(conn, data)
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
        if errors.is_torn_connection(exc):
            # the client closed this connection under us (a Cluster client's aclose() on
            # CLUSTERDOWN): lost like any cut connection, never an untyped AttributeError
            cut = redis.exceptions.ConnectionError(f"connection closed under the call: {exc}")
            raise Failed(cut, marked(replies, written, len(commands))) from exc
        raise
    return replies


async def _send_async(conn: Any, data: bytes) -> None:
    """Write one frame on ``conn``. When its transport's buffer has room the bytes go
    straight to it: such a write cannot block (no deadline needed), and it spares
    redis-py's send a task and a timer per call. Else through redis-py's send, under the
    connection's write timeout. Either way a failed write surfaces as a network error, at
    the write or at the read of its reply (counted as sent then: never re-sent blindly)."""
    writer: Any = getattr(conn, "_writer", None)
    transport = getattr(writer, "transport", None)
    if transport is None or transport.is_closing() \
            or transport.get_write_buffer_size() + len(data) > _PACK_BYTES:
        await conn.send_packed_command([data], check_health=False)
        return
    writer.write(data)


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


__all__ = ["LOST", "UNSENT", "BatchCut", "Command", "Wait", "cut_error", "execute",
           "execute_async", "route_key"]


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "nodes_manager")


def _single_node_result(failed: Failed, n: int, wait: Wait) -> List[Any]:
    """What a failed exchange on one node returns (only WAIT's reply lost: the writes'
    replies and 0 replicas), else raise the typed error it left."""
    got = wait_lost(failed, n, wait)
    if got is None:
        raise cut_error(failed.cause, failed.replies[:n]) from failed.cause
    return got


def execute(client: Any, commands: Sequence[Command], wait: Wait = None,
            routes: Optional[Sequence[Any]] = None) -> List[Any]:
    """Send ``commands`` once over a blocking redis-py client (see the module doc).

    On Cluster each command goes to the primary of its EVALSHA's first key, or of
    ``routes[i]`` when given (a SCRIPT LOAD for the node that met NOSCRIPT)."""
    commands = list(commands)
    if not commands:
        return [0] if wait else []
    if _is_cluster(client):
        return cluster_execute(client, commands, wait, routes_of(commands, routes))
    try:
        got = on_pool(client, with_wait(commands, wait))
    except Failed as failed:
        got = _single_node_result(failed, len(commands), wait)
    if wait:
        got[-1] = min_acked(None, got[-1])
    return got


async def execute_async(client: Any, commands: Sequence[Command], wait: Wait = None,
                        routes: Optional[Sequence[Any]] = None) -> List[Any]:
    """:func:`execute` over a ``redis.asyncio`` client."""
    commands = list(commands)
    if not commands:
        return [0] if wait else []
    if _is_cluster(client):
        return await cluster_execute_async(client, commands, wait, routes_of(commands, routes))
    try:
        got = await on_pool_async(client, with_wait(commands, wait))
    except Failed as failed:
        got = _single_node_result(failed, len(commands), wait)
    if wait:
        got[-1] = min_acked(None, got[-1])
    return got


_REDIRECTS = 5  # MOVED/ASK rounds before the redirect stays in its slot as an error


def routes_of(commands: List[Command], routes: Optional[Sequence[Any]]) -> List[Any]:
    """The key each command is routed by: ``routes[i]`` when given, else its own."""
    if routes is None:
        return [route_key(c) for c in commands]
    return [r if r is not None else route_key(c) for c, r in zip(commands, routes)]


Round = Tuple[str, Any, List[int]]  # (kind, target, indices) of one redirect round


def cluster_rounds(n: int) -> Generator[Round, List[Any], None]:
    """The redirect loop of both cluster drivers, as a generator: yields
    ``(kind, target, indices)`` (kind ``"slot"``: each command to its slot's primary;
    ``"ask"``: to ``target`` after ASKING) and receives the replies, aligned."""
    todo: List[Round] = [("slot", None, list(range(n)))]
    for _ in range(_REDIRECTS + 1):
        again: List[Round] = []
        for kind, target, idx in todo:
            got = yield kind, target, idx
            moved: List[int] = []
            for i, reply in zip(idx, got):
                if isinstance(reply, MovedError):  # did not run: follow the new slot map
                    moved.append(i)
                elif isinstance(reply, AskError):  # did not run: this slot is migrating
                    again.append(("ask", (reply.host, reply.port), [i]))
            if moved:
                again.append(("slot", None, moved))
        if not again:
            return
        todo = again


def asking(commands: List[Command]) -> List[Command]:
    return [c for command in commands for c in (("ASKING",), command)]


def by_node(client: Any, routes: List[Any]) -> Dict[str, Tuple[Any, List[int]]]:
    """Commands grouped by the primary owning their slot: ``{name: (node, indices)}``."""
    groups: Dict[str, Tuple[Any, List[int]]] = {}
    for j, key in enumerate(routes):
        if key is None:
            node = client.get_default_node()
        else:
            node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
        groups.setdefault(node.name, (node, []))[1].append(j)
    return groups


def cluster_round(client: Any, kind: str, target: Any, commands: List[Command],
                   routes: List[Any], wait: Wait) -> Tuple[List[Any], Optional[int]]:
    """One round of a cluster batch: (replies aligned with ``commands``, fewest acks)."""
    raw: Optional[List[Any]]  # None: wait_lost saw more than WAIT's reply lost
    if kind == "ask":
        node = client.get_node(host=target[0], port=target[1])
        if node is None:
            raise Failed(redis.exceptions.ConnectionError(f"ASK to unknown node {target}"),
                          [UNSENT] * len(commands))
        try:
            raw = on_pool(client.get_redis_connection(node), with_wait(asking(commands), wait))
        except Failed as failed:
            raise Failed(failed.cause, failed.replies[1::2]) from failed.cause
        return raw[1::2], (min_acked(None, raw[-1]) if wait else None)
    out: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    for node, members in by_node(client, routes).values():
        try:
            raw = on_pool(client.get_redis_connection(node),
                           with_wait([commands[j] for j in members], wait))
        except Failed as failed:
            raw = wait_lost(failed, len(members), wait)
            if raw is None:
                for j, reply in zip(members, failed.replies):
                    out[j] = reply
                raise Failed(failed.cause, out) from failed.cause
        for j, reply in zip(members, raw):
            out[j] = reply
        if wait:
            acked = min_acked(acked, raw[-1])
    return out, acked


def cluster_execute(client: Any, commands: List[Command], wait: Wait,
                    routes: List[Any]) -> List[Any]:
    """Send ``commands`` once over a blocking cluster client, each to the primary of
    ``routes[i]``'s slot, following redirects; one reply per command (+ fewest acks)."""
    done: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    rounds = cluster_rounds(len(commands))
    try:
        kind, target, idx = next(rounds)
        while True:
            try:
                got, round_acked = cluster_round(client, kind, target,
                                                 [commands[i] for i in idx],
                                                 [routes[i] for i in idx], wait)
            except Failed as failed:
                refresh(client)
                for i, reply in zip(idx, failed.replies):
                    done[i] = reply
                raise cut_error(failed.cause, done) from failed.cause
            except redis.exceptions.RedisClusterException as exc:  # no node for the slot
                raise errors.ServerBusy(str(exc), "CLUSTERDOWN") from exc
            if wait:
                acked = min_acked(acked, round_acked)
            for i, reply in zip(idx, got):
                done[i] = reply
                if isinstance(reply, MovedError):
                    client.nodes_manager.move_slot(reply)
            kind, target, idx = rounds.send(got)
    except StopIteration:
        return done + ([acked] if wait else [])


def refresh(client: Any) -> None:
    """Re-read the slot map after a node failed (a replica may have taken over)."""
    try:
        client.nodes_manager.initialize()
    except Exception:  # every node down: the next call reports it
        pass


# --- asyncio -----------------------------------------------------------------------------

async def cluster_execute_async(client: Any, commands: List[Command], wait: Wait,
                                routes: List[Any]) -> List[Any]:
    """:func:`cluster_execute` over a ``redis.asyncio`` cluster client."""
    if getattr(client, "_initialize", False):
        try:
            await client.initialize()
        except Exception as exc:
            raise errors.translate(exc, sent=False) from exc
    done: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    rounds = cluster_rounds(len(commands))
    try:
        kind, target, idx = next(rounds)
        while True:
            try:
                got, round_acked = await cluster_round_async(
                    client, kind, target, [commands[i] for i in idx], [routes[i] for i in idx],
                    wait)
            except Failed as failed:
                await refresh_async(client)
                for i, reply in zip(idx, failed.replies):
                    done[i] = reply
                raise cut_error(failed.cause, done) from failed.cause
            except redis.exceptions.RedisClusterException as exc:
                raise errors.ServerBusy(str(exc), "CLUSTERDOWN") from exc
            if wait:
                acked = min_acked(acked, round_acked)
            for i, reply in zip(idx, got):
                done[i] = reply
                if isinstance(reply, MovedError):
                    await client.nodes_manager.move_slot(reply)
            kind, target, idx = rounds.send(got)
    except StopIteration:
        return done + ([acked] if wait else [])


async def cluster_round_async(client: Any, kind: str, target: Any, commands: List[Command],
                              routes: List[Any], wait: Wait) -> Tuple[List[Any], Optional[int]]:
    """:func:`cluster_round` over a ``redis.asyncio`` cluster client."""
    raw: Optional[List[Any]]  # None: wait_lost saw more than WAIT's reply lost
    if kind == "ask":
        node = client.nodes_manager.get_node(host=target[0], port=target[1])
        if node is None:
            raise Failed(redis.exceptions.ConnectionError(f"ASK to unknown node {target}"),
                          [UNSENT] * len(commands))
        try:
            raw = await on_node_async(node, with_wait(asking(commands), wait))
        except Failed as failed:
            raise Failed(failed.cause, failed.replies[1::2]) from failed.cause
        return raw[1::2], (min_acked(None, raw[-1]) if wait else None)
    out: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    for node, members in by_node(client, routes).values():
        try:
            raw = await on_node_async(node, with_wait([commands[j] for j in members], wait))
        except Failed as failed:
            raw = wait_lost(failed, len(members), wait)
            if raw is None:
                for j, reply in zip(members, failed.replies):
                    out[j] = reply
                raise Failed(failed.cause, out) from failed.cause
        for j, reply in zip(members, raw):
            out[j] = reply
        if wait:
            acked = min_acked(acked, raw[-1])
    return out, acked


async def refresh_async(client: Any) -> None:
    """:func:`refresh` over a ``redis.asyncio`` cluster client."""
    try:
        await client.nodes_manager.initialize()
    except Exception:
        pass
