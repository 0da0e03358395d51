"""Job ids: ``JOB`` + 12 hex digits of mint time (ms) + 4 of process nonce + 8 of counter.

They sort by mint time (to the millisecond across processes, exactly within one),
carry the ``JOB`` brand the scripts check, and are cheap to mint in bulk.
"""
from __future__ import annotations

import os
import threading
import time
from typing import List

_lock = threading.Lock()
_nonce = int.from_bytes(os.urandom(2), "big")
_last_ms = 0
_counter = 0


def _reserve(n: int) -> tuple:
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms, _counter = ms, 0
        # same (or earlier, if the clock stepped back) millisecond: keep counting
        first = _counter
        _counter += n
        if _counter > 0xFFFFFFFF:  # counter exhausted: borrow the next millisecond
            _last_ms += 1
            first, _counter = 0, n
        return _last_ms, first


def new_id() -> str:
    """One fresh job id."""
    ms, first = _reserve(1)
    return f"JOB{ms:012X}{_nonce:04X}{first:08X}"


def new_ids(n: int) -> List[str]:
    """``n`` fresh ids, in mint order."""
    if n <= 0:
        return []
    ms, first = _reserve(n)
    prefix = f"JOB{ms:012X}{_nonce:04X}"
    return [f"{prefix}{i:08X}" for i in range(first, first + n)]


def mint_time_ms(job_id: str) -> int | None:
    """Mint time of an id minted here (None for caller-chosen ids)."""
    try:
        return int(job_id[3:15], 16) if len(job_id) == 27 else None
    except ValueError:
        return None
