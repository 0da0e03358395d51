"""Job ids: ``JOB`` + 8 base-62 digits of mint time (ms) + 11 of a 64-bit process nonce
+ 4 of a per-millisecond counter (26 characters).

They sort by mint time (to the millisecond across processes, exactly within one: the
base-62 alphabet is in ASCII order and every field is fixed-width), carry the ``JOB``
brand the scripts check, and are cheap to mint in bulk. Base 62 keeps them shorter than
the 27-character hex ids they replace, although they carry 48 more random bits: an id
is stored several times per job (hash key, set members), so each character costs memory.

The nonce is 64 random bits drawn per process, and drawn again in a forked child
(``os.register_at_fork``): a pre-forking server or ``multiprocessing`` would otherwise
mint the parent's ids in the same millisecond, and the second enqueue of an id is a
silent ``duplicate``. With 64 bits, two of a million live producers share a nonce with
probability ~3e-8, and even then only ids minted in the same millisecond could meet.

Lengths: 26 here, 27 for the older hex form (``JOB`` + 12 hex ms + 4 hex nonce + 8 hex
counter, still parsed by :func:`mint_time_ms`), 32 for schedule occurrence ids
(:func:`emqfast.facade.schedules.occurrence_of`).
"""
from __future__ import annotations

import os
import threading
import time
from typing import List, Optional, Tuple

_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # ASCII order
_TIME_DIGITS = 8  # 62**8 ms: past the year 8000
_NONCE_DIGITS = 11  # 62**11 > 2**64
_COUNTER_DIGITS = 4
_COUNTER_LIMIT = 62 ** _COUNTER_DIGITS  # 14.7M ids per process per ms, then the next ms
ID_LENGTH = 3 + _TIME_DIGITS + _NONCE_DIGITS + _COUNTER_DIGITS
_LEGACY_LENGTH = 27  # JOB + 12 hex ms + 4 hex nonce + 8 hex counter (the older id layout)


def _base62(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, rem = divmod(value, 62)
        digits.append(_ALPHABET[rem])
    return "".join(reversed(digits))


# every 2-digit string, in order: a 4-digit counter is two look-ups, not a divmod loop
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]


def _counter_str(i: int) -> str:
    return _PAIRS[i // 3844] + _PAIRS[i % 3844]


def _draw_nonce() -> str:
    return _base62(int.from_bytes(os.urandom(8), "big"), _NONCE_DIGITS)


_lock = threading.Lock()
_nonce = _draw_nonce()
_last_ms = 0
_counter = 0


def _after_fork_in_child() -> None:
    """A forked child is a new producer: new nonce, fresh counter, a lock no thread holds."""
    global _lock, _nonce, _last_ms, _counter, _head
    _lock = threading.Lock()
    _nonce = _draw_nonce()
    _last_ms, _counter = 0, 0
    _head = (-1, "")  # it holds the parent's nonce


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _reserve(n: int) -> Tuple[int, int, str]:
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


# The last id's head ("JOB" + time digits + nonce) and its ms, as ONE tuple: threads read
# and replace it whole (two globals could pair one ms with another ms's head).
_head: Tuple[int, str] = (-1, "")


def new_id() -> str:
    """One fresh job id."""
    global _head
    ms, first, nonce = _reserve(1)
    head_ms, head = _head  # ids minted in one ms share their head: encode it once
    if head_ms != ms:
        head = f"JOB{_base62(ms, _TIME_DIGITS)}{nonce}"
        _head = (ms, head)
    return head + _counter_str(first)


def new_ids(n: int) -> List[str]:
    """``n`` fresh ids, in mint order."""
    if n <= 0:
        return []
    ms, first, nonce = _reserve(n)
    prefix = f"JOB{_base62(ms, _TIME_DIGITS)}{nonce}"
    out: List[str] = []
    end = first + n
    for high in range(first // 3844, (end - 1) // 3844 + 1):  # one high digit pair at a time
        base = high * 3844
        head = prefix + _PAIRS[high]
        out += [head + low for low in _PAIRS[max(first - base, 0):min(end - base, 3844)]]
    return out


def mint_time_ms(job_id: str) -> Optional[int]:
    """Mint time of an id minted here (None for caller-chosen ids)."""
    if not job_id.startswith("JOB"):
        return None
    try:
        if len(job_id) == ID_LENGTH:
            digits = job_id[3:3 + _TIME_DIGITS]
            if all(c in _ALPHABET for c in digits):
                value = 0
                for c in digits:
                    value = value * 62 + _ALPHABET.index(c)
                return value
            return None
        if len(job_id) == _LEGACY_LENGTH:
            return int(job_id[3:15], 16)
    except ValueError:
        return None
    return None
