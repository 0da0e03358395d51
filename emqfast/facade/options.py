"""A job's options as stored in its hash field ``opts``, and the library defaults.

``opts`` is compact JSON ``{"a": max attempts, "p": priority, "b": backoff, ...extra}``.
A job whose options equal :data:`DEFAULT_OPTIONS` stores no ``opts`` field at all
(about 50 bytes less per job); readers take a missing or empty ``opts`` as exactly
those defaults. They are the *library's* defaults, not a queue's current ones, so a
job keeps the options it was enqueued with. Hashes written before this rule (always
with ``opts``) read the same.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Mapping, NamedTuple, Optional

from emqfast.core.errors import PayloadError
from emqfast.core.validation import check_int
from emqfast.facade.backoff import DEFAULT_BACKOFF, Backoff

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
