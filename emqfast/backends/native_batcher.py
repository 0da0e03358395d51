"""The C Batcher: pipelined EVALSHA over one hiredis connection of its own (csrc/).

Arguments are encoded and replies decoded by the functions below the Batcher's; what
a cut batch reports (:class:`~emqfast.backends.transport.BatchCut`) is shared with the
redis-py path in :mod:`emqfast.backends.transport`.
"""
from __future__ import annotations

import os
import threading
from array import array
from itertools import accumulate, chain
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from redis.exceptions import DataError, NoScriptError, ResponseError

from emqfast.backends import native_tls, transport
from emqfast.backends._emqcore import ffi, lib
from emqfast.core import deadlines, errors
from emqfast.core.errors import (BackendUnavailable, ConnectionFailed, InvalidInput,
                                 PermissionDenied)

_new = ffi.new
_OK = lib.EMQ_OK


try:  # redis-py's own error-reply mapping, so both Batchers return the same exceptions
    from redis._parsers.base import BaseParser as _RedisParser
except ImportError:  # redis-py < 5
    # redis-py 5+ (what mypy reads) no longer exports it here; redis-py < 5 has no other
    from redis.connection import BaseParser as _RedisParser  # type: ignore[attr-defined]
_error_reply: Callable[[str], Exception] = _RedisParser.parse_error  # redis-py: unannotated

# walk_nodes reads the reply type codes as literals, for speed: a stale .so must not
# number them differently.
if (lib.EMQ_R_INT, lib.EMQ_R_BIGNUM) != (1, 7):
    raise ImportError("emqfast._emqcore is out of step with emqfast._pure; rebuild it")

SIZE_T = next(code for code in "QLI" if array(code).itemsize == ffi.sizeof("size_t"))


# --- arguments ----------------------------------------------------------------------------

def encode(value: Any) -> bytes:
    """One argument as bytes, the way redis-py encodes it (ints/floats as ASCII)."""
    exact = _EXACT.get(type(value))  # the common types in one look-up (the per-call path)
    if exact is not None:
        return exact(value)
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):  # redis-py refuses it too: True is not "1" to everyone
        raise DataError("Invalid input of type: 'bool'. Convert to a bytes, string, int or "
                        "float first.")
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, float):
        return repr(value).encode()
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise DataError(f"Invalid input of type: '{type(value).__name__}'. Convert to a bytes, "
                    "string, int or float first.")


# Exact types only: a subclass (bool is an int) takes the checks above.
_EXACT: Dict[type, Callable[[Any], bytes]] = {
    bytes: lambda v: v, str: str.encode, int: lambda v: b"%d" % v}


def column_bytes(values: Sequence[Any]) -> List[bytes]:
    """A column as a list of bytes (str as UTF-8, ints as ASCII, like redis-py)."""
    if isinstance(values, list) and all(type(v) is bytes for v in values):
        return values
    return [v if type(v) is bytes else encode(v) for v in values]


def pack_args(values: Sequence[Any]) -> Tuple[Sequence[Any], bytes, Any]:
    """(encoded values, their concatenation, a C size_t array of their lengths)."""
    if len(values) > _SHORT:  # a bulk, often all bytes already: try the join first
        try:
            blob = b"".join(values)
            lens = array(SIZE_T, map(len, values))
            if sum(lens) == len(blob):  # (not so for a memoryview of wide items)
                return values, blob, ffi.from_buffer("size_t[]", lens)
        except TypeError:
            pass
    # str keys and ids, int arguments: the common types inline (a single call mixes them,
    # and a failed join costs more than this pass)
    values = [v if type(v) is bytes else v.encode() if type(v) is str else encode(v)
              for v in values]
    blob = b"".join(values)
    lens = array(SIZE_T, map(len, values))
    return values, blob, ffi.from_buffer("size_t[]", lens)


_SHORT = 64  # values in one call's worth of arguments


# --- replies ------------------------------------------------------------------------------

def decode_replies(r: Any) -> Tuple[List[Any], bool]:
    """The replies held by a C ``emq_replies``: (Python values, all were ints)."""
    if r.all_int:  # memoryview.tolist() beats ffi.unpack for long int arrays
        return memoryview(ffi.buffer(r.ints, 8 * r.nreplies)).cast("q").tolist(), True
    nodes = memoryview(ffi.buffer(r.nodes, 24 * r.nnodes)).cast("q").tolist()
    data = ffi.buffer(r.data, r.datalen)[:] if r.datalen else b""
    return walk_nodes(nodes, data, r.nreplies), False


def walk_nodes(nodes: List[int], data: bytes, count: int) -> List[Any]:
    """Python values from the flat (type, a, b) node list (see emq.h); the type
    codes are literals for speed, checked against lib.EMQ_R_* at import."""
    out: List[Any] = []
    stack: List[Tuple[List[Any], int]] = []  # (the array being filled, its items left)
    cur, left = out, count
    i = 0
    while True:
        while left == 0:
            if not stack:
                return out
            cur, left = stack.pop()
        kind, a, b = nodes[i], nodes[i + 1], nodes[i + 2]
        i += 3
        left -= 1
        if kind == 1:  # EMQ_R_INT
            cur.append(a)
        elif kind == 2:  # EMQ_R_BYTES
            cur.append(data[a:a + b])
        elif kind == 3:  # EMQ_R_NIL
            cur.append(None)
        elif kind == 4:  # EMQ_R_ERROR
            cur.append(_error_reply(data[a:a + b].decode("utf-8", "replace")))
        elif kind == 5:  # EMQ_R_ARRAY
            end = i + 3 * a
            if a and nodes[i:end:3].count(1) == a:  # ints only (an ack's run times): one slice
                cur.append(nodes[i + 1:end:3])
                i = end
                continue
            child: List[Any] = []
            cur.append(child)
            stack.append((cur, left))
            cur, left = child, a
        elif kind == 6:  # EMQ_R_DOUBLE (RESP3 only)
            cur.append(float(data[a:a + b]))
        else:  # EMQ_R_BIGNUM (RESP3 only)
            cur.append(int(data[a:a + b]))


# --- failures -----------------------------------------------------------------------------

def conn_failure(rc: int, message: str, where: str, secret: Optional[str]) -> Exception:
    """The typed error for C failure code ``rc`` with the connection's ``message``
    (``secret``, the password, masked should it ever appear there)."""
    if secret and secret in message:  # belt and braces: C never puts it there
        message = message.replace(secret, "***")
    if rc == lib.EMQ_ENOMEM:
        return MemoryError(message or "out of memory in the C batcher")
    if rc == lib.EMQ_EINVAL:
        return InvalidInput("every command needs at least one argument")
    if rc == lib.EMQ_EIO:
        message += " (the batch was sent, at least in part, and may have partly run)"
    if any(code in message for code in ("WRONGPASS", "NOAUTH", "NOPERM", "AUTH failed")):
        return PermissionDenied(f"redis at {where}: {message}")
    failure = ConnectionFailed(f"redis at {where}: {message}")
    return errors.certificate_rejected(failure) or failure  # a TLS one: permanent


def cut_again(cut: ConnectionFailed, replies: List[Any],
              missing: List[int]) -> BaseException:
    """A failure while re-sending the calls that met NOSCRIPT, reported for the batch."""
    got = getattr(cut, "replies", None) or [transport.UNSENT] * len(missing)
    full = list(replies)
    for i, reply in zip(missing, got):
        full[i] = reply
    return transport.cut_error(cut, full)


class Batcher:
    """Pipelined EVALSHA over one hiredis connection of its own.

    Connects lazily, on the first batch; a connection found broken before a
    batch is replaced once. A batch that fails after bytes left raises
    :class:`ConnectionFailed` and is never re-sent (it may have partly run).
    Every read has a deadline (:mod:`emqfast.core.deadlines`): ``socket_timeout``, else
    :data:`~emqfast.core.deadlines.READ_TIMEOUT_S` (a WAIT: its block time plus a margin);
    a reply that misses it drops the connection (:class:`~emqfast.core.errors.ReplyLost`)
    and the next call dials a new one. Connecting likewise, within
    ``socket_connect_timeout``.
    Safe to share between threads (calls are serialised) and across fork
    (the child opens its own connection).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 6379, path: Optional[str] = None,
                 username: Optional[str] = None, password: Optional[str] = None, db: int = 0,
                 socket_timeout: Optional[float] = None,
                 socket_connect_timeout: Optional[float] = None,
                 tls: Optional[native_tls.TlsSettings] = None) -> None:
        if path is None and not (isinstance(port, int) and 0 < port < 65536):
            raise InvalidInput(f"port must be an int in [1, 65535], not {port!r}")
        if not isinstance(db, int) or db < 0:
            raise InvalidInput(f"db must be an int >= 0, not {db!r}")
        self._host = host.encode() if isinstance(host, str) else bytes(host)
        self._port = port
        self._path = os.fsencode(path) if path is not None else None
        self._where = f"unix:{path}" if path is not None else f"{host}:{port}"
        self._tls = tls if path is None else None  # TLS over TCP only, as in redis-py
        self._username = encode(username) if username else None
        self._password = encode(password) if password else None
        self._secret = self._password.decode("utf-8", "replace") if self._password else None
        self._db = db
        self._io_timeout = deadlines.read_timeout(socket_timeout)
        self._connect_timeout = deadlines.connect_timeout(socket_connect_timeout, socket_timeout)
        self._conn = ffi.gc(lib.emq_conn_new(), lib.emq_conn_free)
        if self._conn == ffi.NULL:
            raise MemoryError("emq_conn_new")
        self._replies = ffi.gc(_new("emq_replies *"), lib.emq_replies_free)
        self._pid = -1  # process that opened the connection
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    @classmethod
    def from_redis(cls, client: Any) -> "Batcher":
        """A Batcher on the same server, credentials and db as a redis-py ``client``.

        Raises :class:`BackendUnavailable` for what hiredis here cannot speak:
        cluster and sentinel-managed clients, and TLS settings it cannot honour
        (:mod:`~emqfast.backends.native_tls`); the caller uses redis-py then.
        A Batcher is a connection: :func:`emqfast.backend.batcher_for` shares one
        per (process, thread, connection parameters) instead of making one per call.
        """
        return cls(**cls.params_from_redis(client))

    @staticmethod
    def params_from_redis(client: Any) -> Dict[str, Any]:
        """The keyword arguments :meth:`from_redis` builds a Batcher with (server,
        credentials, db, timeouts): equal dicts mean an equivalent connection."""
        import redis
        from redis.cluster import RedisCluster
        from redis.sentinel import SentinelConnectionPool

        pool = getattr(client, "connection_pool", None)
        if isinstance(client, RedisCluster) or pool is None:
            raise BackendUnavailable("the C batcher does not speak Redis Cluster")
        if isinstance(pool, SentinelConnectionPool):
            raise BackendUnavailable("the C batcher does not follow Sentinel failovers")
        conn_cls = getattr(pool, "connection_class", redis.Connection)
        kw = pool.connection_kwargs
        tls = native_tls.settings_from(kw) if issubclass(conn_cls, redis.SSLConnection) else None
        username, password = kw.get("username"), kw.get("password")
        provider = kw.get("credential_provider")
        if provider is not None:
            creds = provider.get_credentials()
            username, password = (creds[0], creds[1]) if len(creds) == 2 else (None, creds[0])
        unix = issubclass(conn_cls, redis.UnixDomainSocketConnection)
        return dict(host=kw.get("host", "localhost"), port=int(kw.get("port", 6379)),
                    path=kw.get("path") if unix else None, username=username,
                    password=password, db=int(kw.get("db") or 0),
                    socket_timeout=kw.get("socket_timeout"),
                    socket_connect_timeout=kw.get("socket_connect_timeout"), tls=tls)

    # -- public --------------------------------------------------------------
    def evalsha_many(self, sha: str, script: bytes, numkeys: int,
                     calls: Sequence[Sequence[Any]], wait: transport.Wait = None) -> List[Any]:
        """``EVALSHA sha numkeys *call`` for every call, pipelined; one reply per call.

        Values may be bytes, str (UTF-8) or int. Replies: int, bytes, None, lists,
        and error replies as ``redis.exceptions.ResponseError`` instances
        (returned, not raised; mapped by redis-py's own parser, so the message is
        what redis-py would give). NOSCRIPT is handled by loading ``script`` once.

        Never re-sent after bytes left: a connection lost mid-batch raises
        :class:`~emqfast.backends.transport.BatchCut` with the replies that arrived (and
        :data:`~emqfast.backends.transport.LOST` / ``UNSENT`` for the rest); one lost before
        anything left raises :class:`ConnectionFailed`. With ``wait=(replicas,
        timeout_ms)`` a ``WAIT`` follows on the same connection and its reply (replicas
        that acknowledged) ends the list.
        """
        if not calls:
            return [0] if wait else []
        argcs = [len(call) for call in calls]
        flat = [value for call in calls for value in call]
        if min(argcs) == max(argcs):
            return self._waited(self._evalsha(sha, script, numkeys, flat, argcs[0], None), wait)
        return self._waited(self._evalsha(sha, script, numkeys, flat, 0, argcs), wait)

    def evalsha_flat(self, sha: str, script: bytes, numkeys: int, argc: int,
                     flat: Sequence[Any], wait: transport.Wait = None) -> List[Any]:
        """:meth:`evalsha_many` for calls of ``argc`` values each, laid back to back in ``flat``."""
        if not isinstance(argc, int) or argc < 1 or len(flat) % argc:
            raise InvalidInput(f"flat holds {len(flat)} values: not a multiple of argc={argc!r}")
        if not flat:
            return [0] if wait else []
        return self._waited(self._evalsha(sha, script, numkeys, flat, argc, None), wait)

    def evalsha_columns(self, sha: str, script: bytes, numkeys: int,
                        slots: Sequence[Tuple[Any, Optional[int]]],
                        columns: Sequence[Sequence[Any]], wait: transport.Wait = None) -> List[Any]:
        """One EVALSHA per row of ``columns``, framed and streamed in C (csrc/bulk.c).

        Call ``i``'s argument ``s`` is ``slots[s][0]`` followed, when
        ``slots[s][1]`` is a column index, by ``columns[slots[s][1]][i]``: the
        constant arguments of a bulk enqueue travel once, not once per job. Slots with
        ``each`` (a third value, :class:`~emqfast.core.ops.Slot`) put that many rows in
        each call (enqueue_many.lua): one reply per call then.
        Same replies, NOSCRIPT, failure and ``wait`` handling as :meth:`evalsha_many`.
        """
        ncalls = len(columns[0]) if columns else 0
        if any(len(col) != ncalls for col in columns):
            raise InvalidInput("columns differ in length")
        if not ncalls:
            return [0] if wait else []
        return self._waited(self._columns_calls(sha, script, numkeys, slots, columns), wait)

    def _columns_calls(self, sha: str, script: bytes, numkeys: int,
                       slots: Sequence[Tuple[Any, ...]],
                       columns: Sequence[Sequence[Any]]) -> List[Any]:
        sha_b = sha.encode("ascii") if isinstance(sha, str) else bytes(sha)
        consts = [encode(slot[0]) for slot in slots]
        picks = [-1 if slot[1] is None else slot[1] for slot in slots]
        if any(not -1 <= k < len(columns) for k in picks):
            raise InvalidInput("a slot names a column that does not exist")
        each = [slot[2] if len(slot) > 2 and slot[2] else 0 for slot in slots]
        rows = max(each, default=0) or 1  # rows per call (Slot.each)
        cols = [column_bytes(col) for col in columns]
        slot_lens = array(SIZE_T, map(len, consts))
        slot_col, slot_each = array("q", picks), array("q", each)
        frame = (sha_b, numkeys, rows, consts, slot_lens, slot_col, slot_each)
        replies, all_int = self._columns(frame, cols)
        if all_int:
            return replies
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            loaded = self._script_load(sha_b, script)
            if isinstance(loaded, ResponseError):
                for i in missing:
                    replies[i] = loaded
                return replies
            # the rows of the calls that met NOSCRIPT (whole calls: the grouping holds)
            picked = [r for i in missing for r in range(i * rows, min((i + 1) * rows,
                                                                      len(cols[0])))]
            sub = [[col[r] for r in picked] for col in cols]
            try:
                again, _ = self._columns(frame, sub)
            except ConnectionFailed as cut:
                raise cut_again(cut, replies, missing) from cut
            for i, reply in zip(missing, again):
                replies[i] = reply
        return replies

    def _columns(self, frame: Tuple[Any, ...], cols: List[List[bytes]]) -> Tuple[List[Any], bool]:
        sha_b, numkeys, rows, consts, slot_lens, slot_col, slot_each = frame
        slot_data = b"".join(consts)
        col_data = b"".join(chain.from_iterable(cols))
        col_lens = array(SIZE_T, map(len, chain.from_iterable(cols)))
        c_slot_lens = ffi.from_buffer("size_t[]", slot_lens)
        c_slot_col = ffi.from_buffer("int64_t[]", slot_col)
        c_slot_each = ffi.from_buffer("int64_t[]", slot_each)
        c_col_lens = ffi.from_buffer("size_t[]", col_lens)
        nrows = len(cols[0])
        return self._run(-(-nrows // rows), lambda conn: lib.emq_evalsha_rows(
            conn, sha_b, len(sha_b), numkeys, nrows, rows, len(consts), slot_data,
            c_slot_lens, c_slot_col, c_slot_each, len(cols), col_data, c_col_lens,
            self._replies))

    def close(self) -> None:
        """Close the connection and free reply buffers (a later call reconnects)."""
        with self._locked():
            lib.emq_conn_close(self._conn)
            lib.emq_replies_free(self._replies)

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- internals -----------------------------------------------------------
    def _evalsha(self, sha: str, script: bytes, numkeys: int, flat: Sequence[Any],
                 argc: int, argcs: Optional[List[int]]) -> List[Any]:
        sha_b = sha.encode("ascii") if isinstance(sha, str) else bytes(sha)
        values, replies, all_int = self._send(sha_b, numkeys, flat, argc, argcs)
        if all_int:
            return replies
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:
            loaded = self._script_load(sha_b, script)
            if isinstance(loaded, ResponseError):  # e.g. a compile error: that is their reply
                for i in missing:
                    replies[i] = loaded
                return replies
            # Re-send only the calls that met NOSCRIPT, in their original order.
            if argcs is None:
                sub = [v for i in missing for v in values[i * argc:(i + 1) * argc]]
                sub_argcs = None
            else:
                starts = list(accumulate(argcs, initial=0))
                sub = [v for i in missing for v in values[starts[i]:starts[i + 1]]]
                sub_argcs = [argcs[i] for i in missing]
            try:
                _, again, _ = self._send(sha_b, numkeys, sub, argc, sub_argcs)
            except ConnectionFailed as cut:
                raise cut_again(cut, replies, missing) from cut
            for i, reply in zip(missing, again):
                replies[i] = reply
        return replies

    def _send(self, sha_b: bytes, numkeys: int, flat: Sequence[Any], argc: int,
              argcs: Optional[List[int]]) -> Tuple[Sequence[Any], List[Any], bool]:
        values, blob, lens = pack_args(flat)
        if argcs is None:
            ncalls, c_argcs = len(values) // argc, ffi.NULL
        else:
            ncalls, c_argcs = len(argcs), _new("size_t[]", argcs)
        replies, all_int = self._run(ncalls, lambda conn: lib.emq_evalsha_batch(
            conn, sha_b, len(sha_b), numkeys, ncalls, argc, c_argcs, blob, lens, self._replies))
        return values, replies, all_int

    def _script_load(self, sha_b: bytes, script: bytes) -> Any:
        """SCRIPT LOAD ``script``; its error reply, or raise if it is not ``sha``."""
        values, blob, lens = pack_args([b"SCRIPT", b"LOAD", script])
        (reply,), _ = self._run(1, lambda conn: lib.emq_command_batch(
            conn, 1, 3, ffi.NULL, blob, lens, self._replies))
        if isinstance(reply, bytes) and reply.lower() != sha_b.lower():
            raise InvalidInput(f"script hashes to {reply.decode()}, not to the sha {sha_b.decode()}")
        return reply

    def _run(self, ncalls: int, batch: Any, reconnect: bool = True,
             deadline_s: Optional[float] = None) -> Tuple[List[Any], bool]:
        """Run one C batch on a live connection; returns (replies, all were ints).

        A batch is retried only when not one byte of it left (EMQ_EUNSENT). Without
        ``reconnect`` (a WAIT, which must follow its writes on their connection) a
        connection found broken is an error, never replaced. ``deadline_s``: the read
        deadline of this batch when it blocks on the server longer than the usual one."""
        with self._locked():
            # A plain batch checks its connection in C (emq_batch_begin: EMQ_EUNSENT when
            # unusable, so it reconnects below) and drops the GIL once, not twice.
            if self._pid != os.getpid() or ((not reconnect or deadline_s is not None)
                                            and not lib.emq_conn_usable(self._conn)):
                if not reconnect:
                    raise errors.ReplyLost(f"redis at {self._where}: connection lost before "
                                           "WAIT: the writes reached the master, their "
                                           "replication is unconfirmed")
                self._connect()
            if deadline_s is not None:
                return self._run_blocking(ncalls, batch, deadline_s)
            rc = batch(self._conn)
            if rc == lib.EMQ_EUNSENT and reconnect:  # nothing left: a retry cannot double-apply
                self._connect()
                rc = batch(self._conn)
            if rc == lib.EMQ_EIO:
                raise self._cut(ncalls)
            if rc != _OK:
                self._raise(rc)
            return self._decode()

    def _run_blocking(self, ncalls: int, batch: Any, deadline_s: float) -> Tuple[List[Any], bool]:
        """``batch`` under the read deadline ``deadline_s``, the usual one restored after
        (a connection the batch lost is closed: its next dial sets the usual one anyway)."""
        rc = lib.emq_conn_set_timeout(self._conn, deadline_s)
        if rc == _OK:
            rc = batch(self._conn)
            if lib.emq_conn_usable(self._conn):
                lib.emq_conn_set_timeout(self._conn, self._io_timeout)
        if rc == lib.EMQ_EIO:
            raise self._cut(ncalls)
        if rc != _OK:
            self._raise(rc)
        return self._decode()

    def _cut(self, ncalls: int) -> BaseException:
        """The BatchCut of a batch that failed after bytes left: the replies that arrived
        are kept (they are the only record of what landed)."""
        got, _ = self._decode()
        nsent = max(int(self._replies.nsent), len(got))
        replies = (got + [transport.LOST] * (nsent - len(got))
                   + [transport.UNSENT] * (ncalls - nsent))
        try:
            self._raise(lib.EMQ_EIO)
        except ConnectionFailed as exc:
            return transport.cut_error(exc, replies)
        raise AssertionError("unreachable")

    def _waited(self, replies: List[Any], wait: transport.Wait) -> List[Any]:
        """``replies`` followed by WAIT's reply, sent on the connection that wrote them."""
        if not wait:
            return replies
        values, blob, lens = pack_args([b"WAIT", int(wait[0]), int(wait[1])])
        # WAIT blocks up to its timeout (0: until the replicas answer; held to the margin)
        deadline = deadlines.blocking_read_timeout(int(wait[1]) / 1000, self._io_timeout)
        try:
            (acked,), _ = self._run(1, lambda conn: lib.emq_command_batch(
                conn, 1, 3, ffi.NULL, blob, lens, self._replies), reconnect=False,
                deadline_s=deadline)
        except ConnectionFailed:  # the writes replied: landed, replication unconfirmed
            acked = 0
        return replies + [0 if isinstance(acked, Exception) else int(acked)]

    def _locked(self) -> threading.Lock:
        # A fork while another thread held the lock would leave it held forever
        # in the child, where that thread does not exist: start afresh there.
        if self._lock_pid != os.getpid():
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def _connect(self) -> None:
        conn = self._conn
        lib.emq_conn_close(conn)
        if self._path is not None:
            rc = lib.emq_conn_open_unix(conn, self._path, self._connect_timeout, self._io_timeout)
        elif self._tls is not None:
            rc = native_tls.open_tls(conn, self._host, self._port, self._connect_timeout,
                                     self._io_timeout, self._tls)
        else:
            rc = lib.emq_conn_open_tcp(conn, self._host, self._port, self._connect_timeout,
                                       self._io_timeout)
        if rc == _OK and (self._username or self._password):
            user = self._username if self._username is not None else ffi.NULL
            password = self._password or b""
            rc = lib.emq_conn_auth(conn, user, len(self._username or b""), password,
                                   len(password))
        if rc == _OK and self._db:
            rc = lib.emq_conn_select(conn, self._db)
        if rc != _OK:
            self._raise(rc)
        self._pid = os.getpid()

    def _raise(self, rc: int) -> None:
        """Raise the typed error for C failure code ``rc`` on this connection."""
        raise self._failure(rc)

    def _failure(self, rc: int) -> Exception:
        message = ffi.string(lib.emq_conn_error(self._conn)).decode("utf-8", "replace")
        return conn_failure(rc, message, self._where, self._secret)

    def _decode(self) -> Tuple[List[Any], bool]:
        return decode_replies(self._replies)
