"""Input checks shared by every layer: integers in range and the names that end up in keys.

They raise emqfast's typed errors (:class:`~emqfast.errors.InvalidInput`,
:class:`~emqfast.errors.RangeError`, :class:`~emqfast.errors.KindError`) before anything
is sent, so bad input never reaches Redis.
"""
from __future__ import annotations

import re
from typing import Any

from emqfast.core.errors import InvalidInput, KindError, RangeError

JOB_BRAND = "JOB"
MAX_NAME_BYTES = 200
# Control characters: C0 (\x00..\x1f), DEL and C1 (\x80..\x9f, e.g. the 8-bit CSI \x9b a
# terminal may obey like ESC [). In a name or an id they break line-based output
# (`emqfast stats`, logs) or steer the terminal that shows them, and are never meant.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_int(value: Any, name: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``, else :class:`RangeError` / :class:`InvalidInput`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an int, not {type(value).__name__}")
    if not lo <= value <= hi:
        raise RangeError(f"{name}={value} outside [{lo}, {hi}]")
    return value


def check_printable_name(name: str, what: str) -> str:
    """Refuse a whitespace-only ``name`` or one holding a control character (``\\n``,
    ``\\t``, NUL, ...): such names print as nothing or break line-based output."""
    if not name.strip():
        raise InvalidInput(f"{what} name must not be whitespace only, got {name[:40]!r}")
    return check_no_control(name, f"{what} name")


def check_no_control(text: str, label: str) -> str:
    """Refuse ``text`` holding a control character (C0, DEL or C1): the one rule for
    every name and every new job id (``label`` says which, e.g. ``"job id"``)."""
    if _CONTROL.search(text):
        raise InvalidInput(f"{label} must not contain control characters "
                           f"(newline, tab, NUL, ESC, C1 such as \\x9b ...), got {text[:40]!r}")
    return text


def _check_key_name(name: Any, what: str, no_nul: bool = False) -> str:
    """The rules every name that becomes part of a key obeys: non-empty text, no ``{``/``}``
    (they would move the hash tag), not whitespace only, no control characters, valid
    unicode, at most :data:`MAX_NAME_BYTES` UTF-8 bytes."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{what} name must be a non-empty str")
    if "{" in name or "}" in name or (no_nul and "\0" in name):
        forbidden = "'{', '}' or NUL" if no_nul else "'{' or '}'"
        raise InvalidInput(f"{what} name must not contain {forbidden} (they would break the "
                           "hash tag)")
    check_printable_name(name, what)
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidInput(f"{what} name longer than {MAX_NAME_BYTES} bytes")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} name must be valid unicode text") from None
    return name


def check_queue_name(name: str) -> str:
    """Validate a queue name (the hash tag of every key of the queue)."""
    return _check_key_name(name, "queue")


def check_job_id(job_id: str) -> str:
    """Validate a caller-chosen job id: text with the ``JOB`` brand (the EMQKIND gate)."""
    if not isinstance(job_id, str):
        raise InvalidInput("job id must be a str")
    if not job_id.startswith(JOB_BRAND):
        raise KindError(f"job id must start with {JOB_BRAND!r} (got {job_id[:40]!r}): ids "
                        "emqfast mints do (JobRef.id); to key jobs by your own ids, enqueue "
                        f"with job_id={JOB_BRAND!r} + your id and look them up the same way")
    if len(job_id) > MAX_NAME_BYTES:
        raise InvalidInput(f"job id longer than {MAX_NAME_BYTES} characters")
    try:
        job_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("job id must be valid unicode text") from None
    return job_id


def check_new_job_id(job_id: str) -> str:
    """Validate the id of a job about to be created: :func:`check_job_id`, no control
    character (C0, DEL or C1: the rule names obey, :func:`check_no_control`; an id is
    printed by the CLI and logged) and no ``:``.

    A job's own sets extend its hash key ``emq:{q}:job:<id>`` with ``:deps`` and
    ``:dependents``; an id holding a ``:`` could name another job's set (``JOBb:deps`` is
    ``JOBb``'s dependency set), so new ids never hold one. Looking a job up by an id with a
    ``:`` stays allowed (:func:`check_job_id`)."""
    check_job_id(job_id)
    check_no_control(job_id, "job id")
    if ":" in job_id:
        raise InvalidInput(f"job id must not contain ':' (got {job_id[:40]!r}): it separates "
                           "the parts of a job's keys (emq:{q}:job:<id>:deps)")
    return job_id


def check_schedule_name(name: str) -> str:
    """Validate a schedule name. It is both the registry member and the suffix of its
    record key (``emq:{q}:repeat:<name>``), so it obeys the same rules as a queue name."""
    return _check_key_name(name, "schedule")


def check_group_name(name: str) -> str:
    """Validate a group (lane) name: the suffix of the lane key
    ``emq:{q}:g:<group>:pending``; claim.lua files active grouped jobs under
    ``<group>\\0<job id>``, so no NUL inside (named in the error)."""
    return _check_key_name(name, "group", no_nul=True)
