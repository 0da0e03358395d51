"""The re-send policy: which faults a Worker waits out, and the loops that re-send.

Every call a Worker makes is safe to send again with the same arguments (claim by its
request id, start/complete/fail by the lease token, extend and release are harmless
twice), so a lost reply (:class:`~emqfast.errors.ReplyLost`) or a transient server
state (LOADING, BUSY, failover: ``ServerBusy``; OOM: ``ServerFull``) is waited out with
:class:`Backoff` and the same call re-sent. Anything else is permanent
(:class:`~emqfast.errors.PermissionDenied`, :class:`~emqfast.errors.VersionMismatch`)
and stops the Worker. The loops here are sans-IO generators (see
:mod:`emqfast.core.ops`).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, List, Optional, Sequence

from emqfast.core.errors import (ConnectionFailed, EmqError, PartialBatch, PermissionDenied,
                                 is_transient, translate)
from emqfast.core.ops import Batch, Logic, Sleep

log = logging.getLogger("emqfast.worker")

# How Redis words an ACL denial of a command a script calls (no NOPERM code prefix).
_SCRIPT_NOPERM = "user executing the script can't run this command"


def typed(exc: BaseException) -> BaseException:
    """emqfast's typed error for whatever a call raised (a partial batch by its cause)."""
    if isinstance(exc, PartialBatch) and exc.__cause__ is not None:
        exc = exc.__cause__
    out = translate(exc)
    if not isinstance(out, EmqError) and _SCRIPT_NOPERM in str(out):
        return PermissionDenied(str(out))
    return out


def transient(exc: BaseException) -> bool:
    """True when the call may succeed if sent again later: a lost connection or reply, a
    server loading, busy, failing over or full. The Workers' calls are all safe to re-send
    with the same arguments (claim by its request id, start/complete/fail by the token), so
    they wait these out; anything else (PermissionDenied: an ACL or password problem) is
    permanent and stops the Worker."""
    return is_transient(typed(exc))


def raise_typed(exc: BaseException) -> None:
    """Raise ``exc`` as its typed error (itself when it already is one)."""
    out = typed(exc)
    if out is exc:
        raise exc
    raise out from exc


class Backoff:
    """Exponential waits between re-sends: 50 ms doubling to 5 s."""

    def __init__(self, first_s: float = 0.05, most_s: float = 5.0):
        self.first_s, self.most_s = first_s, most_s
        self.next_s = first_s

    def __call__(self) -> float:
        """The wait before the next try (and double the one after)."""
        wait, self.next_s = self.next_s, min(self.next_s * 2, self.most_s)
        return wait

    def reset(self) -> None:
        self.next_s = self.first_s


def transient_slots(replies: Sequence[Any]) -> List[int]:
    """Indexes of replies that are transient error replies (e.g. one call of a pipeline
    met LOADING or OOM): those calls did not run and must be sent again."""
    return [i for i, r in enumerate(replies) if isinstance(r, BaseException) and transient(r)]


def never() -> bool:
    return False


def nothing() -> None:
    pass


def _lost(exc: BaseException, lost: Callable[[], None]) -> None:
    """A lost connection makes the caller's other connections suspect: a half-open blip
    silences them all at once, and each would wait out a read deadline of its own."""
    if isinstance(typed(exc), ConnectionFailed):
        lost()


def until_done(call: Any, what: str, who: str, give_up: Callable[[], bool] = never,
               lost: Callable[[], None] = nothing) -> Logic:
    """Send a call that is safe to re-send, re-sending it after transient faults (a lost
    reply included: the same call again returns what the first send did) until it gets a
    reply or ``give_up()``: None then. Permanent errors are raised. ``who`` names the
    worker in log lines; ``lost()`` runs when a connection was lost."""
    backoff = Backoff()
    while True:
        try:
            return (yield call)
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            if not transient(exc):
                raise
            _lost(exc, lost)
            if give_up():
                return None
            wait = backoff()
            log.warning("%s: %s failed (%s); re-sending in %.2fs", who, what,
                        type(typed(exc)).__name__, wait)
            yield Sleep(wait)


def until_all(calls: Sequence[Any], what: str, who: str, give_up: Callable[[], bool] = never,
              lost: Callable[[], None] = nothing) -> Logic:
    """:func:`until_done` for calls sent together in one pipeline (one round trip), each
    safe to re-send alone: those a transient fault kept from landing (the whole pipeline
    on a lost connection or reply) are sent again, with backoff, until every call has its
    reply, or ``give_up()``: None then. A permanent error (a call's reply included) is
    raised."""
    replies: List[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    backoff = Backoff()
    while True:
        try:
            got = yield Batch([calls[i] for i in todo])
            fault: Any = None
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            fault, got = exc, []
            if not transient(exc):
                raise
            _lost(exc, lost)
        for i, reply in zip(todo, got):
            if isinstance(reply, BaseException) and not transient(reply):
                raise reply
            replies[i] = reply
        if got:
            todo = [todo[j] for j in transient_slots(got)]
            fault = replies[todo[0]] if todo else None
        if not todo:
            return replies
        if give_up():
            return None
        wait = backoff()
        log.warning("%s: %s failed (%s); re-sending in %.2fs", who, what,
                    type(typed(fault)).__name__, wait)
        yield Sleep(wait)


def until_landed(calls: Sequence[Any], who: str, until: Optional[float] = None,
                 lost: Callable[[], None] = nothing) -> Logic:
    """Every call's reply, re-sending (with backoff) the calls a transient fault kept from
    landing (a lost connection or reply, LOADING after a restart, BUSY, a failover, OOM)
    until Redis takes them: an outcome is never dropped while it can still be written.
    complete.lua and fail.lua are idempotent by token, so a re-sent call whose first send
    ran reports success. Permanent errors are raised, and so is the fault when the next
    try would pass ``until`` (monotonic s; a stopping worker's bound). ``lost()`` runs when
    a connection was lost."""
    replies: List[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    backoff = Backoff()
    while True:
        try:
            got = yield Batch([calls[i] for i in todo], via_batcher=True)
            for i, reply in zip(todo, got):
                replies[i] = reply
            todo = [todo[j] for j in transient_slots(got)]
            fault: Any = replies[todo[0]] if todo else None
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            if not transient(exc):
                raise
            _lost(exc, lost)
            fault = exc
        if not todo:
            return replies
        if until is not None and time.monotonic() + backoff.next_s > until:
            raise fault  # stopping, Redis still unreachable: the reaper will re-run them
        wait = backoff()
        log.warning("%s: cannot write %d outcome calls (%s); re-sending in %.2fs", who,
                    len(todo), type(typed(fault)).__name__, wait)
        yield Sleep(wait)


def pipeline_until(calls: Sequence[Any], until: float, what: str) -> Logic:
    """One pipeline's replies, re-sent after transient faults until ``until`` (monotonic
    s); then (or on a permanent error) the error in place of each reply, logged."""
    backoff = Backoff()
    while True:
        try:
            return (yield Batch(calls))
        except Exception as exc:  # noqa: BLE001 - sorted by transient()
            if not transient(exc) or time.monotonic() + backoff.next_s > until:
                log.warning("could not %s (%s); the reaper will", what, exc)
                return [exc] * len(calls)
            yield Sleep(backoff())


def wait_out(exc: BaseException, backoff: Backoff, who: str,
             lost: Callable[[], None] = nothing) -> Logic:
    """After a failed turn of the claim loop: wait a transient fault out (a stop ends the
    wait), raise anything else typed (PermissionDenied stops the worker)."""
    if not transient(exc):
        raise_typed(exc)
    _lost(exc, lost)
    wait = backoff()
    log.warning("%s: redis unavailable (%s); retrying in %.2fs", who,
                type(typed(exc)).__name__, wait)
    yield Sleep(wait, wake_on_stop=True)
