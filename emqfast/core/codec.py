"""Payload and result encoding: raw bytes or JSON, never pickle."""
from __future__ import annotations

import json
import math
from typing import Any, Tuple

from emqfast.core.errors import PayloadError

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024 * 1024

_dumps = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode


def encode(payload: Any, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> Tuple[bytes, bytes]:
    """``(data, enc)``: bytes pass through as ``b``; anything else must be JSON (``j``)."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        data, enc = bytes(payload), b"b"
    else:
        try:
            # strict UTF-8: text with lone surrogates is refused, not stored mangled
            data, enc = _dumps(payload).encode("utf-8"), b"j"
        except (TypeError, ValueError, RecursionError) as exc:
            raise PayloadError(f"payload is not bytes or JSON-serialisable: {exc}") from None
    if len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the limit of {max_bytes}")
    return data, enc


def decode(data: bytes | None, enc: bytes | str | None) -> Any:
    """Inverse of :func:`encode`. A stored payload that is neither (an unknown ``enc`` tag,
    JSON that does not parse: a hash edited or corrupted outside emqfast) is a
    :class:`PayloadError`, never guessed at (and never unpickled)."""
    if data is None:
        return None
    if enc in (b"b", "b"):
        return data
    if enc not in (None, b"", "", b"j", "j"):
        raise PayloadError(f"stored payload has an unknown encoding tag {enc!r} "
                           "(emqfast writes 'b' for bytes or 'j' for JSON)")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"stored payload is not valid JSON: {exc}") from None


def encode_result(value: Any) -> bytes:
    """A value as JSON text (a job's progress; handler results go through
    :func:`encode_handler_result`, which also takes bytes)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise PayloadError("result is a non-finite float")
    try:
        return _dumps(value).encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
        raise PayloadError(f"result is not JSON-serialisable: {exc}") from None


# A handler's bytes result is stored as this marker then the bytes. 0xFF never occurs in
# UTF-8, so no JSON text (what every other result is, and every result written before)
# starts with it: complete.lua stores the field as given and needs no second field.
BYTES_RESULT = b"\xffb"


def encode_handler_result(value: Any) -> bytes:
    """A handler's return value as stored: bytes behind :data:`BYTES_RESULT`, else JSON.

    Anything else is a :class:`PayloadError` that says what happened and what to return
    (the handler has already run: its side effects stay, the job fails for good)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return BYTES_RESULT + bytes(value)
    try:
        return encode_result(value)
    except PayloadError as exc:
        raise PayloadError(
            f"the handler returned a {type(value).__name__}, which is not JSON-serialisable "
            f"({exc}); the handler already ran, so its side effects happened, but the job is "
            "failed (not retried) because its result cannot be stored. Return JSON data "
            "(e.g. a list instead of a set, dt.isoformat() instead of a datetime) or bytes."
        ) from None


def decode_result(data: bytes | None) -> Any:
    """Inverse of :func:`encode_handler_result` (bytes or JSON); a stored result that is
    neither is a :class:`PayloadError`, never guessed at."""
    if data is None:
        return None
    if data[:1] == BYTES_RESULT[:1]:
        if data[:len(BYTES_RESULT)] == BYTES_RESULT:
            return data[len(BYTES_RESULT):]
        raise PayloadError(f"stored result has an unknown encoding marker {data[:2]!r}")
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(f"stored result is not valid JSON: {exc}") from None
