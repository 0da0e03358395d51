"""due.lua (read-only): which members of a queue's time-scored sets are due on the server
clock, so the caller can declare their keys to the move it sends next (promote, reap, a
schedule's mint). Its reply is read by name here, never by position elsewhere."""
from __future__ import annotations

from typing import Any, List, NamedTuple

from emqfast.backends.scripts import load
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Call

_DUE = load("due")


class Due(NamedTuple):
    """A due.lua reply."""

    now_ms: int      # the server clock the script read
    grouped: bool    # the queue has ever held grouped jobs (False when meta was not asked)
    ids: List[str]   # due members, oldest first


def delayed_due(k: QueueKeys, limit: int) -> Call:
    """Due job ids on ``delayed`` (packed run-at scores), with the queue's grouped flag."""
    return Call(_DUE, [k.delayed, k.meta], [limit, 1])


def expired_leases(k: QueueKeys, limit: int) -> Call:
    """Job ids on ``active`` whose lease deadline passed, with the grouped flag."""
    return Call(_DUE, [k.active, k.meta], [limit, 0])


def due_schedules(k: QueueKeys, limit: int) -> Call:
    """Schedule names whose next run (``repeat`` score, epoch ms) has come."""
    return Call(_DUE, [k.repeat], [limit, 0])


def parse_due(reply: List[Any], with_meta: bool = True) -> Due:
    """Read a due.lua reply; ``with_meta``: the call declared the meta hash."""
    first = 2 if with_meta else 1
    return Due(int(reply[0]), with_meta and bool(int(reply[1])),
               [_text(member) for member in reply[first:]])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
