"""Typed errors. Lua scripts reply with ``<CODE> message``; :func:`from_reply` maps
the code prefix to the class below, so callers never parse strings."""
from __future__ import annotations

from typing import Dict, Type


class EmqError(Exception):
    """Base class of every error emqfast raises on purpose."""

    code = "EMQ"


class InvalidInput(EmqError, ValueError):
    """An argument is malformed; nothing was written to Redis."""

    code = "EMQINPUT"


class KindError(InvalidInput):
    """A job id that does not carry the ``JOB`` brand."""

    code = "EMQKIND"


class RangeError(InvalidInput):
    """A number outside the range the keyspace can represent exactly."""

    code = "EMQRANGE"


class PayloadError(InvalidInput):
    """A payload that is neither bytes nor JSON-serialisable, or too large."""

    code = "EMQPAYLOAD"


class JobNotFound(EmqError, LookupError):
    """The job id does not exist in this queue."""

    code = "EMQNOJOB"


class LeaseLost(EmqError):
    """The caller's lease on a job expired and was taken over (or the job ended)."""

    code = "EMQLEASE"


class JobStateError(EmqError):
    """The job is not in a state that allows the operation (e.g. retry a pending job)."""

    code = "EMQSTATE"


class VersionMismatch(EmqError):
    """The queue was written by an incompatible major version of the keyspace."""

    code = "EMQVERSION"


class BackendUnavailable(EmqError, ImportError):
    """``EMQFAST_BACKEND=c`` was asked for but the C extension is not built."""

    code = "EMQBACKEND"


class ConnectionFailed(EmqError, ConnectionError):
    """Redis could not be reached (the message never contains credentials)."""

    code = "EMQCONN"


_BY_CODE: Dict[str, Type[EmqError]] = {
    cls.code: cls
    for cls in (InvalidInput, KindError, RangeError, PayloadError, JobNotFound,
                LeaseLost, JobStateError, VersionMismatch)
}


def codes() -> Dict[str, Type[EmqError]]:
    """Every error code a Lua script may reply with, and its class."""
    return dict(_BY_CODE)


def from_reply(message: str) -> Exception | None:
    """Typed exception for a Lua error reply, or ``None`` if it is not ours."""
    code, _, text = message.partition(" ")
    cls = _BY_CODE.get(code)
    return cls(text or code) if cls else None


class Unrecoverable(Exception):
    """Raise from a handler to fail the job at once, skipping any remaining attempts."""
