"""The score layouts every sorted set is read by, and the backoff kinds: the constants the
C core (csrc/emq.h), its Python twin (:mod:`emqfast.backends.pure`) and the Lua
scripts (lua/includes/common.lua) agree on."""
from __future__ import annotations

# --- delayed scores ---------------------------------------------------------
# score = (run_at_ms - EPOCH_MS) * 0x1000 + (seq & 0xFFF)
# Sorted-set scores are doubles: integers are exact only below 2**53. Raw
# epoch-ms * 4096 crosses that in September 2039, so the ms count is taken from
# an offset epoch (2024-01-01T00:00:00Z), which keeps scores exact until 2093.
EPOCH_MS = 1_704_067_200_000
SEQ_BITS = 12
SEQ_MASK = (1 << SEQ_BITS) - 1
MAX_OFFSET_MS = (1 << (53 - SEQ_BITS)) - 1
MAX_RUN_AT_MS = EPOCH_MS + MAX_OFFSET_MS

# --- priority scores --------------------------------------------------------
# score = priority * 2**32 + (counter mod 2**32); lower runs first.
PRIORITY_BITS = 21
PRIORITY_MAX = (1 << PRIORITY_BITS) - 1
COUNTER_MOD = 1 << 32

M64 = (1 << 64) - 1


# --- backoff kinds (Backoff.kind) -----------------------------------------
KIND_FIXED = 0
KIND_EXPONENTIAL = 1
