"""What crosses the C Batcher's boundary: arguments encoded to bytes the way redis-py
encodes them, replies decoded from the C core's flat node list (see csrc/emq.h), and
the C connection's failure codes mapped to emqfast's typed errors."""
from __future__ import annotations

from array import array
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from redis.exceptions import DataError

from emqfast.backends import transport
from emqfast.backends._emqcore import ffi, lib
from emqfast.core.errors import ConnectionFailed, InvalidInput, PermissionDenied

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
    return ConnectionFailed(f"redis at {where}: {message}")


def cut_again(cut: ConnectionFailed, replies: List[Any],
              missing: List[int]) -> BaseException:
    """A failure while re-sending the calls that met NOSCRIPT, reported for the batch."""
    got = getattr(cut, "replies", None) or [transport.UNSENT] * len(missing)
    full = list(replies)
    for i, reply in zip(missing, got):
        full[i] = reply
    return transport.cut_error(cut, full)
