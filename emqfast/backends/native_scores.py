"""The C core's arithmetic (csrc/), wrapped: score packing and backoff curves.

Every function returns exactly what its twin in :mod:`emqfast.backends.pure` returns.
C works on fixed-width integers, so an input it cannot represent (a Python int past
64 bits, a non-int, a jitter band above 1, ...) is handed to the ``pure`` reference
instead: rare inputs get the slow path, never a different answer.
"""
from __future__ import annotations

from array import array
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from emqfast.backends import pure as _pure
from emqfast.backends._emqcore import ffi, lib
from emqfast.core.errors import RangeError
from emqfast.core.scores import (EPOCH_MS, KIND_FIXED, M64, MAX_RUN_AT_MS, PRIORITY_MAX,
                                 SEQ_BITS)

# A stale .so built from an older emq.h must not silently disagree with pure.
if (lib.EMQ_EPOCH_MS, lib.EMQ_SEQ_BITS, lib.EMQ_MAX_RUN_AT_MS, lib.EMQ_PRIORITY_MAX,
        lib.EMQ_KIND_FIXED) != (EPOCH_MS, SEQ_BITS, MAX_RUN_AT_MS, PRIORITY_MAX, KIND_FIXED):
    raise ImportError("emqfast._emqcore is out of step with emqfast._pure; rebuild it")

_new = ffi.new
_OK, _ERANGE = lib.EMQ_OK, lib.EMQ_ERANGE

# --- scores -----------------------------------------------------------------


def pack_delayed(run_at_ms: int, seq: int) -> int:
    """Delayed-set score for a job due at ``run_at_ms``; see :func:`_pure.pack_delayed`."""
    try:
        score: int = lib.emq_pack_delayed(run_at_ms, seq)
    except (OverflowError, TypeError):
        return _pure.pack_delayed(run_at_ms, seq)
    if score < 0:
        raise RangeError(f"run_at_ms {run_at_ms} outside [0, {MAX_RUN_AT_MS}]")
    return score


def unpack_delayed(score: int) -> Tuple[int, int]:
    """Inverse of :func:`pack_delayed`: ``(run_at_ms, seq)``."""
    score = int(score)
    try:
        pair = lib.emq_unpack_delayed(score)
    except OverflowError:
        return _pure.unpack_delayed(score)
    return pair.hi, pair.lo


def pack_priority(priority: int, counter: int) -> int:
    """Pending-set score; see :func:`_pure.pack_priority`."""
    try:
        score: int = lib.emq_pack_priority(priority, counter)
    except (OverflowError, TypeError):
        return _pure.pack_priority(priority, counter)
    if score < 0:
        raise RangeError(f"priority {priority} outside [0, {PRIORITY_MAX}]")
    return score


def unpack_priority(score: int) -> Tuple[int, int]:
    """Inverse of :func:`pack_priority`: ``(priority, counter mod 2**32)``."""
    score = int(score)
    try:
        pair = lib.emq_unpack_priority(score)
    except OverflowError:
        return _pure.unpack_priority(score)
    return pair.hi, pair.lo


def _columns(xs: Iterable[Any], ys: Iterable[Any]) -> Tuple[Sequence[Any], Sequence[Any], int]:
    """Two equally long sequences with ``zip`` semantics (shortest wins)."""
    if isinstance(xs, (list, tuple, array)) and isinstance(ys, (list, tuple, array)):
        n = min(len(xs), len(ys))
        return (xs if len(xs) == n else xs[:n]), (ys if len(ys) == n else ys[:n]), n
    pairs = list(zip(xs, ys))
    return [p[0] for p in pairs], [p[1] for p in pairs], len(pairs)


_TYPECODE = {"int64_t[]": "q", "uint64_t[]": "Q"}  # 'q'/'Q' are 8 bytes everywhere


def _c_array(ctype: str, values: Sequence[Any]) -> Any:
    """A C array of ``values`` (OverflowError/TypeError for what it cannot hold).

    Goes through ``array``, which converts a list faster than ``ffi.new``, and
    is zero-copy when the caller already passes an ``array`` of that type."""
    code = _TYPECODE[ctype]
    if not (isinstance(values, array) and values.typecode == code):
        values = array(code, values)
    return ffi.from_buffer(ctype, values)


_ZEROS = array("q", [0])


def _out(n: int) -> Tuple[array[int], Any]:
    """An int64 result array and the C view of it."""
    out = _ZEROS * n
    return out, ffi.from_buffer("int64_t[]", out)


def pack_delayed_many(run_ats: Iterable[int], seqs: Iterable[int]) -> List[int]:
    """Batch form of :func:`pack_delayed`; the loop runs in C."""
    run_ats, seqs, n = _columns(run_ats, seqs)
    try:
        c_runs, c_seqs = _c_array("int64_t[]", run_ats), _c_array("int64_t[]", seqs)
    except (OverflowError, TypeError):
        return _pure.pack_delayed_many(run_ats, seqs)
    (out, c_out), failed = _out(n), _new("size_t *")
    if lib.emq_pack_delayed_many(c_runs, c_seqs, n, c_out, failed) != _OK:
        raise RangeError(f"run_at_ms {run_ats[failed[0]]} outside [0, {MAX_RUN_AT_MS}]")
    return out.tolist()


def pack_priority_many(priorities: Iterable[int], counters: Iterable[int]) -> List[int]:
    """Batch form of :func:`pack_priority`; the loop runs in C."""
    priorities, counters, n = _columns(priorities, counters)
    try:
        c_prio, c_ctr = _c_array("int64_t[]", priorities), _c_array("int64_t[]", counters)
    except (OverflowError, TypeError):
        return _pure.pack_priority_many(priorities, counters)
    (out, c_out), failed = _out(n), _new("size_t *")
    if lib.emq_pack_priority_many(c_prio, c_ctr, n, c_out, failed) != _OK:
        raise RangeError(f"priority {priorities[failed[0]]} outside [0, {PRIORITY_MAX}]")
    return out.tolist()


# --- backoff ----------------------------------------------------------------


def splitmix64(state: int) -> Tuple[int, int]:
    """One step of SplitMix64: ``(new_state, output)``; all values mod 2**64."""
    step = lib.emq_splitmix64(state & M64)
    return step.state, step.output


def _c_band(band: Any) -> Optional[float]:
    """``band`` as the double C multiplies by, or None when only Python's
    arithmetic gives the reference answer (ints >= 1 multiply exactly, Fractions...)."""
    if isinstance(band, float):
        return band
    if isinstance(band, int) and band <= 0:
        return 0.0  # no jitter either way
    return None


def backoff_delay(kind: int, base_ms: int, cap_ms: int, band: float, full: bool,
                  attempts: int, seed: int) -> int:
    """Delay in ms before retry number ``attempts``; see :func:`_pure.backoff_delay`."""
    c_band = _c_band(band)
    if c_band is not None:
        try:
            delay: int = lib.emq_backoff_delay(kind, base_ms, cap_ms, c_band,
                                               1 if full else 0, attempts, seed & M64)
        except (OverflowError, TypeError):
            delay = -lib.EMQ_EDOMAIN
        if delay >= 0:
            return delay
        if delay == -_ERANGE:
            raise RangeError("attempts must be >= 1")
    return _pure.backoff_delay(kind, base_ms, cap_ms, band, full, attempts, seed)


def backoff_delay_many(kind: int, base_ms: int, cap_ms: int, band: float, full: bool,
                       attempts: Iterable[int], seeds: Iterable[int]) -> List[int]:
    """Batch form of :func:`backoff_delay` for one policy; the loop runs in C."""
    attempts, seeds, n = _columns(attempts, seeds)
    c_band = _c_band(band)
    if c_band is not None:
        (out, c_out), failed = _out(n), _new("size_t *")
        try:
            c_attempts = _c_array("uint64_t[]", attempts)
            try:
                c_seeds = _c_array("uint64_t[]", seeds)
            except OverflowError:  # negative or wide seeds: only their low 64 bits count
                c_seeds = _c_array("uint64_t[]", [s & M64 for s in seeds])
            rc = lib.emq_backoff_delay_many(kind, base_ms, cap_ms, c_band, 1 if full else 0,
                                            c_attempts, c_seeds, n, c_out, failed)
        except (OverflowError, TypeError):
            rc = lib.EMQ_EDOMAIN
        if rc == _OK:
            return out.tolist()
        if rc == _ERANGE:
            raise RangeError("attempts must be >= 1")
    return _pure.backoff_delay_many(kind, base_ms, cap_ms, band, full, attempts, seeds)
