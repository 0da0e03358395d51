"""Pure-Python twin of the C core's arithmetic: score packing and backoff curves.

This module is the *reference*: the C functions in ``csrc/`` must return exactly
what these return for every input (tests/test_parity.py checks it with
hypothesis). Keep both in lock-step; change the spec here first.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

from emqfast.core.errors import RangeError
from emqfast.core.scores import (COUNTER_MOD, EPOCH_MS, KIND_EXPONENTIAL, KIND_FIXED, M64,  # noqa: F401
                                 MAX_OFFSET_MS, MAX_RUN_AT_MS, PRIORITY_BITS, PRIORITY_MAX,
                                 SEQ_BITS, SEQ_MASK)

def pack_delayed(run_at_ms: int, seq: int) -> int:
    """Delayed-set score for a job due at ``run_at_ms`` (epoch ms).

    Run-ats before the offset epoch are already due and clamp to offset 0;
    anything negative or past ``MAX_RUN_AT_MS`` is a :class:`RangeError`.
    """
    if run_at_ms < 0 or run_at_ms > MAX_RUN_AT_MS:
        raise RangeError(f"run_at_ms {run_at_ms} outside [0, {MAX_RUN_AT_MS}]")
    offset = run_at_ms - EPOCH_MS if run_at_ms > EPOCH_MS else 0
    return (offset << SEQ_BITS) | (seq & SEQ_MASK)


def unpack_delayed(score: int) -> Tuple[int, int]:
    """Inverse of :func:`pack_delayed`: ``(run_at_ms, seq)``."""
    score = int(score)
    return EPOCH_MS + (score >> SEQ_BITS), score & SEQ_MASK


def pack_priority(priority: int, counter: int) -> int:
    """Pending-set score: the tier in the high bits, arrival in the low 32."""
    if priority < 0 or priority > PRIORITY_MAX:
        raise RangeError(f"priority {priority} outside [0, {PRIORITY_MAX}]")
    return (priority << 32) + (counter % COUNTER_MOD)


def unpack_priority(score: int) -> Tuple[int, int]:
    """Inverse of :func:`pack_priority`: ``(priority, counter mod 2**32)``."""
    score = int(score)
    return score >> 32, score & (COUNTER_MOD - 1)


def pack_delayed_many(run_ats: Iterable[int], seqs: Iterable[int]) -> List[int]:
    """Batch form of :func:`pack_delayed`."""
    return [pack_delayed(r, s) for r, s in zip(run_ats, seqs)]


def pack_priority_many(priorities: Iterable[int], counters: Iterable[int]) -> List[int]:
    """Batch form of :func:`pack_priority`."""
    return [pack_priority(p, c) for p, c in zip(priorities, counters)]


# --- backoff ----------------------------------------------------------------
def splitmix64(state: int) -> Tuple[int, int]:
    """One step of SplitMix64: ``(new_state, output)``; all values mod 2**64."""
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def backoff_delay(kind: int, base_ms: int, cap_ms: int, band: float, full: bool,
                  attempts: int, seed: int) -> int:
    """Delay in ms before retry number ``attempts`` (1-based).

    - fixed: ``base_ms`` every time; exponential: ``min(base_ms * 2**(attempts-1), cap_ms)``.
    - ``band`` (0..1): proportional jitter, uniform integer in ``[d - w, d + w]``
      with ``w = floor(d * band)`` (exponential(1000, jitter=0.2), attempt 3 -> [3200, 4800]).
    - ``full``: full jitter, uniform integer in ``[0, d]`` (applied after the band).
    Random draws come from SplitMix64 seeded with
    ``seed ^ (attempts * 0xD1B54A32D192ED03)`` (mod 2**64); a draw in ``[0, n]`` is
    ``output % (n + 1)``. Same (policy, attempts, seed) -> same delay, in C and here.
    """
    if attempts < 1:
        raise RangeError("attempts must be >= 1")
    if kind == KIND_FIXED:
        d = base_ms
    else:
        shift = attempts - 1
        # base << shift > cap  <=>  shift >= bit budget left under cap
        if shift >= 63 or base_ms > (cap_ms >> shift):
            d = cap_ms
        else:
            d = min(base_ms << shift, cap_ms)
    state = (seed ^ ((attempts * 0xD1B54A32D192ED03) & M64)) & M64
    if band > 0.0 and d > 0:
        w = int(d * band)  # truncation == floor for non-negative values
        if w > 0:
            state, r = splitmix64(state)
            d = d - w + r % (2 * w + 1)
    if full:
        state, r = splitmix64(state)
        d = r % (d + 1)
    return d


def backoff_delay_many(kind: int, base_ms: int, cap_ms: int, band: float, full: bool,
                       attempts: Iterable[int], seeds: Iterable[int]) -> List[int]:
    """Batch form of :func:`backoff_delay` for one policy."""
    return [backoff_delay(kind, base_ms, cap_ms, band, full, a, s)
            for a, s in zip(attempts, seeds)]


def optional_seed(seed: Optional[int]) -> int:
    """A 64-bit seed: the caller's, or a fresh random one."""
    if seed is None:
        import random
        return random.getrandbits(64)
    return seed & M64
