"""Job ids: ``JOB`` + 12 hex digits of mint time (ms) + 11 base-62 digits of a 64-bit
process nonce + 5 base-62 digits of a per-millisecond counter (31 characters).

They sort by mint time (to the millisecond across processes, exactly within one: the
base-62 alphabet is in ASCII order and every field is fixed-width), carry the ``JOB``
brand the scripts check, and are cheap to mint in bulk.

The nonce is 64 random bits drawn per process, and drawn again in a forked child
(``os.register_at_fork``): a pre-forking server or ``multiprocessing`` would otherwise
mint the parent's ids in the same millisecond, and the second enqueue of an id is a
silent ``duplicate``. With 64 bits, two of a million live producers share a nonce with
probability ~3e-8, and even then only ids minted in the same millisecond could meet.

Length 31 keeps clear of schedule occurrence ids (length 32, see
:func:`emqfast.schedules.occurrence_of`). Ids of the older 27-character form
(16-bit nonce) still parse in :func:`mint_time_ms`.
"""
from __future__ import annotations

import os
import threading
import time
from typing import List, Optional

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # ASCII order
_NONCE_DIGITS = 11  # 62**11 > 2**64
_COUNTER_DIGITS = 5
_COUNTER_LIMIT = 62 ** _COUNTER_DIGITS  # ids per process per millisecond before borrowing
ID_LENGTH = 3 + 12 + _NONCE_DIGITS + _COUNTER_DIGITS
_LEGACY_LENGTH = 27  # JOB + 12 hex ms + 4 hex nonce + 8 hex counter (before issue 11)


def _base62(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, rem = divmod(value, 62)
        digits.append(_ALPHABET[rem])
    return "".join(reversed(digits))


# the 5-digit counter strings, built once: minting is a table look-up, not a divmod loop
_COUNTERS: Optional[List[str]] = None
_COUNTER_TABLE_SIZE = 1 << 16


def _counter_str(i: int) -> str:
    global _COUNTERS
    if i < _COUNTER_TABLE_SIZE:
        if _COUNTERS is None:
            _COUNTERS = [_base62(n, _COUNTER_DIGITS) for n in range(_COUNTER_TABLE_SIZE)]
        return _COUNTERS[i]
    return _base62(i, _COUNTER_DIGITS)


def _draw_nonce() -> str:
    return _base62(int.from_bytes(os.urandom(8), "big"), _NONCE_DIGITS)


_lock = threading.Lock()
_nonce = _draw_nonce()
_last_ms = 0
_counter = 0


def _after_fork_in_child() -> None:
    """A forked child is a new producer: new nonce, fresh counter, a lock no thread holds."""
    global _lock, _nonce, _last_ms, _counter
    _lock = threading.Lock()
    _nonce = _draw_nonce()
    _last_ms, _counter = 0, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _reserve(n: int) -> tuple:
    global _last_ms, _counter
    if n > _COUNTER_LIMIT:
        raise ValueError(f"cannot mint more than {_COUNTER_LIMIT} ids at once")
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, 0
        # same (or earlier, if the clock stepped back) millisecond: keep counting
        first = _counter
        _counter += n
        if _counter > _COUNTER_LIMIT:  # counter exhausted: borrow the next millisecond
            _last_ms += 1
            first, _counter = 0, n
        return _last_ms, first, _nonce


def new_id() -> str:
    """One fresh job id."""
    ms, first, nonce = _reserve(1)
    return f"JOB{ms:012X}{nonce}{_counter_str(first)}"


def new_ids(n: int) -> List[str]:
    """``n`` fresh ids, in mint order."""
    if n <= 0:
        return []
    ms, first, nonce = _reserve(n)
    prefix = f"JOB{ms:012X}{nonce}"
    return [prefix + _counter_str(i) for i in range(first, first + n)]


def mint_time_ms(job_id: str) -> Optional[int]:
    """Mint time of an id minted here (None for caller-chosen ids)."""
    if len(job_id) not in (ID_LENGTH, _LEGACY_LENGTH) or not job_id.startswith("JOB"):
        return None
    try:
        return int(job_id[3:15], 16)
    except ValueError:
        return None
