"""Retry backoff policies: a pure function of (policy, attempts[, seed]) -> delay ms.

The delay is computed above the wire (by the C core or its Python twin) and the
Lua scripts only receive the number, so retry timing is testable.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from emqfast.backends import select as backend
from emqfast.core.scores import KIND_EXPONENTIAL, KIND_FIXED
from emqfast.core.errors import InvalidInput

_MAX_MS = 1 << 62


def _ms(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an int (ms), not {type(value).__name__}")
    if value < minimum or value > _MAX_MS:
        raise InvalidInput(f"{name} must be in [{minimum}, 2**62]")
    return value


@dataclass(frozen=True)
class Backoff:
    """A retry delay curve. Build one with :meth:`fixed`, :meth:`exponential` or :meth:`jitter`."""

    kind: int
    base_ms: int
    cap_ms: int
    band: float = 0.0
    full: bool = False

    @classmethod
    def fixed(cls, ms: int) -> "Backoff":
        """The same delay before every retry."""
        ms = _ms(ms, "ms", 0)
        return cls(KIND_FIXED, ms, ms)

    @classmethod
    def exponential(cls, base: int, cap: int = 3_600_000, jitter: Optional[float] = None) -> "Backoff":
        """``min(base * 2**(attempts-1), cap)``; ``jitter=0.2`` spreads it over a ±20 % band."""
        base = _ms(base, "base", 1)
        cap = _ms(cap, "cap", 1)
        band = 0.0
        if jitter is not None:
            if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) \
                    or not math.isfinite(jitter) or not 0 <= jitter <= 1:
                raise InvalidInput("jitter must be a fraction in [0, 1]")
            band = float(jitter)
        return cls(KIND_EXPONENTIAL, base, cap, band)

    @classmethod
    def jitter(cls, inner: "Backoff") -> "Backoff":
        """Full jitter: a uniform draw in ``[0, inner.delay_ms(attempts)]``."""
        if not isinstance(inner, Backoff):
            raise InvalidInput("Backoff.jitter wraps another Backoff")
        return cls(inner.kind, inner.base_ms, inner.cap_ms, inner.band, True)

    def delay_ms(self, attempts: int, seed: Optional[int] = None) -> int:
        """Delay before retrying after failed attempt number ``attempts`` (1-based).

        Policies with jitter draw from a seeded PRNG: the same seed gives the same
        delay under both backends; ``seed=None`` draws a fresh seed.
        """
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise InvalidInput("attempts must be an int >= 1")
        core = backend.impl()
        delay: int = core.backoff_delay(self.kind, self.base_ms, self.cap_ms, self.band,
                                        self.full, attempts, core.optional_seed(seed))
        return delay

    def delays_ms(self, attempts: Sequence[int], seeds: Sequence[int]) -> List[int]:
        """Batch form of :meth:`delay_ms` (one call into the C core)."""
        core = backend.impl()
        delays: List[int] = core.backoff_delay_many(self.kind, self.base_ms, self.cap_ms,
                                                    self.band, self.full, attempts, seeds)
        return delays

    def to_json(self) -> List[Any]:
        """Compact form stored in the job's options."""
        return [self.kind, self.base_ms, self.cap_ms, self.band, int(self.full)]

    @classmethod
    def from_json(cls, data: Any) -> "Backoff":
        """Inverse of :meth:`to_json`."""
        kind, base, cap, band, full = data
        return cls(int(kind), int(base), int(cap), float(band), bool(full))

    def __repr__(self) -> str:
        if self.kind == KIND_FIXED:
            text = f"Backoff.fixed({self.base_ms})"
        else:
            j = f", jitter={self.band}" if self.band else ""
            text = f"Backoff.exponential({self.base_ms}, cap={self.cap_ms}{j})"
        return f"Backoff.jitter({text})" if self.full else text


DEFAULT_BACKOFF = Backoff.exponential(1000, cap=60_000)
