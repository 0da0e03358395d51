"""Deduplication and expiry of an enqueue: validating the options and the
extra KEYS/ARGV they add to enqueue.lua / enqueue_group.lua (``lua/includes/dedupe.lua``
says what the scripts do with them).

**Deduplication** (``dedupe_key="k"``, ``dedupe_ms=T``, ``dedupe=...``). The queue's
``dedupe`` hash maps each key to the job holding it. While that job is waiting or active
(and, with ``T``, until ``T`` ms after its admission, server clock) a new enqueue with the
key is judged by the mode:

- ``"drop"`` (the default): nothing is written; the ref says ``deduplicated`` and names
  the existing job.
- ``"extend"``: as drop, and the key's window restarts: it now ends ``T`` ms from this
  call (``dedupe_ms`` is required).
- ``"replace"`` (debounce): a job still waiting gets the new payload, run-at (now + the new
  call's delay, or its ``run_at_ms``) and expiry, its window restarts, and the ref says
  ``replaced`` naming it; its options (priority, attempts, backoff, group) stay. A job
  already running (or claimed) is not touched: the new job is ADMITTED and takes the key
  (a running handler may have read the old state, so the latest call still runs once, after
  it). The replacement must name the waiting job's group (else ``InvalidInput``).

A job that ended (completed, failed, cancelled, expired), vanished, or whose window closed
holds its key no more: the next enqueue is admitted and takes the key. Atomic on the
server: 8 racing producers with one key admit exactly one job per window. The hash stays
bounded: an entry is overwritten by its key's next job and deleted with its job's record
by the retention trim (``lua/trim.lua``).

**Expiry** (``expires_ms=E``): a job not started within ``E`` ms of becoming due (its
run-at, or its enqueue when due at once) is never run: the Worker's start (``lua/start.lua``)
ends it as ``expired`` (a kept record on the ``expired`` set, an ``expired`` event and
metrics counter). A job that ran once (then retries) no longer expires.
"""
from __future__ import annotations

from typing import Any, List, NamedTuple, Optional, Tuple

from emqfast.core.errors import InputTypeError, InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.scores import MAX_OFFSET_MS
from emqfast.core.times import Delay, delay_ms as check_delay

MODES = ("drop", "replace", "extend")
MAX_KEY_BYTES = 1024
# enqueue.lua's replies beyond admitted (1, 2) and duplicate (0)
DEDUPLICATED, REPLACED, STALE = 3, 4, 5
STATUSES = {DEDUPLICATED: "deduplicated", REPLACED: "replaced"}


class Extras(NamedTuple):
    """The validated dedupe/expiry options one enqueue call shares (keys are per job)."""

    expires_ms: Optional[int]
    window_ms: Optional[int]
    mode: str


def check_key(key: Any) -> str:
    """A dedupe key: a non-empty str of at most :data:`MAX_KEY_BYTES` UTF-8 bytes."""
    if not isinstance(key, str):
        raise InputTypeError(f"dedupe_key must be a str, not {type(key).__name__}")
    size = len(key.encode("utf-8", "surrogatepass"))
    if not 0 < size <= MAX_KEY_BYTES:
        raise InvalidInput(f"dedupe_key must hold 1 to {MAX_KEY_BYTES} bytes, not {size}")
    return key


def key_list(keys: Any, n: int) -> Optional[List[Optional[str]]]:
    """``enqueue_many``'s ``dedupe_keys``: one key (or None) per payload, validated."""
    if keys is None:
        return None
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__iter__"):
        raise InputTypeError("dedupe_keys takes a list of keys (str or None), one per payload, "
                             f"not {type(keys).__name__}")
    out = [None if key is None else check_key(key) for key in keys]
    if len(out) != n:
        raise InvalidInput("dedupe_keys and payloads differ in length")
    return out


def extras(keyed: bool, dedupe_ms: Optional[Delay], dedupe: Optional[str],
           expires_ms: Optional[Delay]) -> Optional[Extras]:
    """Validate the options (``keyed``: a dedupe key was given); None when none is used,
    so a plain enqueue sends exactly what it always did."""
    if dedupe is not None and (not isinstance(dedupe, str) or dedupe not in MODES):
        raise InvalidInput(f"dedupe must be one of {', '.join(MODES)}, not {dedupe!r}")
    if not keyed and (dedupe is not None or dedupe_ms is not None):
        raise InvalidInput("dedupe and dedupe_ms need a dedupe_key")
    window = None if dedupe_ms is None else check_delay(dedupe_ms, "dedupe_ms", 1, MAX_OFFSET_MS)
    if dedupe == "extend" and window is None:
        raise InvalidInput("dedupe='extend' extends the key's window: give dedupe_ms")
    expires = None if expires_ms is None else check_delay(expires_ms, "expires_ms", 1,
                                                           MAX_OFFSET_MS)
    if not keyed and expires is None:
        return None
    return Extras(expires, window, dedupe or "drop")


def extra_keys_args(k: QueueKeys, job_id: str, x: Optional[Extras], key: Optional[str],
                    holder: Optional[str]) -> Tuple[List[str], List[Any]]:
    """The KEYS and ARGV an enqueue script takes after its own for ``x`` (see enqueue.lua's
    header): the expiry, then with a dedupe ``key`` the key, the ``holder`` the caller read
    in the dedupe hash, the window and the mode."""
    if x is None:
        return [], []
    args: List[Any] = [_ms(x.expires_ms)]
    if key is None:
        return [], args
    keys = [k.dedupe, k.job(holder or job_id), k.active]
    return keys, args + [key, holder or "", _ms(x.window_ms), x.mode]


def holder_of(raw: Any) -> Optional[str]:
    """A dedupe hash value (HGET reply) as a job id, or None."""
    return raw.decode() if isinstance(raw, bytes) else raw


def _ms(value: Optional[int]) -> str:
    return "" if value is None else str(value)
