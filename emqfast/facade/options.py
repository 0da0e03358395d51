"""A job's options: its retry backoff policy (:class:`Backoff`) and how options are stored
in the job hash (``opts`` JSON; :func:`decode`).

A backoff is a pure function of (policy, attempts[, seed]) -> delay ms. The delay is
computed above the wire (by the C core or its Python twin) and the Lua scripts only
receive the number, so retry timing is testable.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence

from emqfast.backends import select as backend
from emqfast.core.errors import InvalidInput, PayloadError
from emqfast.core.scores import KIND_EXPONENTIAL, KIND_FIXED
from emqfast.core.validation import check_int

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


DEFAULT_ATTEMPTS = 3
DEFAULT_PRIORITY = 0
# The one definition of "default options": what a missing 'opts' field stands for.
DEFAULT_OPTIONS: Mapping[str, Any] = {"a": DEFAULT_ATTEMPTS, "p": DEFAULT_PRIORITY,
                                      "b": DEFAULT_BACKOFF.to_json()}
_KNOWN = ("a", "p", "b")


class Options(NamedTuple):
    """Decoded options: what a :class:`~emqfast.Job` carries."""

    max_attempts: int
    priority: int
    backoff: Optional[Backoff]
    extra: Dict[str, Any]  # anything else (e.g. ``g``, the group)


def encode(attempts: int, priority: int, backoff: Backoff,
           extra: Optional[Mapping[str, Any]] = None) -> bytes:
    """The ``opts`` value to store: ``b""`` (write no field) when it equals the defaults."""
    opts = {"a": attempts, "p": priority, "b": backoff.to_json(), **(extra or {})}
    if opts == DEFAULT_OPTIONS:
        return b""
    return json.dumps(opts, separators=(",", ":")).encode()


def decode(raw: Optional[bytes]) -> Options:
    """Inverse of :func:`encode`; ``None`` / empty (no field) means :data:`DEFAULT_OPTIONS`."""
    try:
        opts: Mapping[str, Any] = json.loads(raw) if raw else DEFAULT_OPTIONS
        # a stored blob without "a" reads as one run, as it always has
        return Options(int(opts.get("a", 1)), int(opts.get("p", 0)),
                       Backoff.from_json(opts["b"]) if opts.get("b") else None,
                       {k: opts[k] for k in opts if k not in _KNOWN})
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        # edited or corrupted outside emqfast: typed, never guessed at
        raise PayloadError(f"stored job options are malformed: {exc}") from None


TIMEOUT_KEY = "t"  # a run's time limit in ms (enqueue(..., timeout_ms=N))
MAX_TIMEOUT_MS = 1 << 40


def with_timeout(opts: bytes, timeout_ms: Optional[int]) -> bytes:
    """``opts`` (an encoded blob, ``b""`` for the defaults) with the job's ``timeout_ms``
    (an int of 1 .. 2**40 ms; None: no limit, ``opts`` unchanged). Workers stop a run that
    passes it (:mod:`emqfast.worker.cancels`). Bad input: typed, before anything is sent."""
    if timeout_ms is None:
        return opts
    check_int(timeout_ms, "timeout_ms", 1, MAX_TIMEOUT_MS)
    decoded = json.loads(opts) if opts else dict(DEFAULT_OPTIONS)
    decoded[TIMEOUT_KEY] = timeout_ms
    return json.dumps(decoded, separators=(",", ":")).encode()
