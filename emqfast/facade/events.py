"""A queue's events stream (``emq:{q}:events``): typed events and the read operation.

Every Lua move that changes a job's state appends an event (``XADD ... MAXLEN ~``):
``enqueued``, ``promoted``, ``active``, ``progress``, ``completed``, ``failed``,
``retrying``, ``stalled``, ``cancelled``, ``retried`` (manual), ``released``.
Moves of many jobs at once (``promoted``, ``active``, ``completed``) write one stream
entry per 16 jobs (``ids`` and per-job fields as JSON arrays, or as one plain value when
it is the same for every job of the entry: an XADD per job was a third of a promote's
Redis CPU). ``enqueue_many`` writes one ``enqueued`` entry per 100 jobs
whose ids were minted together (their shared head once, then each id's last 4
characters: 4 bytes a job), else one per job. :func:`read_op` expands them, so readers
see one :class:`Event` per job, those of one entry sharing its stream id. The stream's
cap is the queue's ``events`` setting (``Queue.configure_events``; 0 turns events off),
counted in stream entries: a batched entry counts once, so a busy queue's stream keeps
more events than ``events`` (up to 16x, or 100x for bulk enqueues). :func:`read_op` is
the sans-IO read both facades iterate.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from emqfast.core.errors import InvalidInput
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Cmd, Op

TAIL_WIDTH = 4  # enqueue_many.lua's compact 'enqueued' entries: characters per id's tail
DEFAULT_EVENTS_CAP = 10_000  # common.lua's default when meta has no 'events' setting
# Longest single XREAD BLOCK: well under redis-py's default 5 s socket timeout, so a
# long or endless wait is a series of server-side blocks, never a client timeout.
BLOCK_CHUNK_MS = 1000


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Event:
    """One stream entry: ``id`` (the stream position, ``<ms>-<seq>`` on the server
    clock), ``name`` (``completed``, ...), ``job_id`` and any other fields as text."""

    id: str
    name: str
    job_id: str
    fields: Dict[str, str] = field(default_factory=dict)

    @property
    def time_ms(self) -> int:
        """Server time (epoch ms) the event was written (the stream id's first half)."""
        return int(self.id.split("-", 1)[0])

    @property
    def attempt(self) -> Optional[int]:
        """The run's attempt number (``active``, ``completed``, ``failed``, ``retrying``)."""
        value = self.fields.get("attempt")
        return int(value) if value is not None else None

    @property
    def delay_ms(self) -> Optional[int]:
        """Backoff before the next attempt (``retrying``)."""
        value = self.fields.get("delay")
        return int(value) if value is not None else None

    @property
    def error(self) -> Optional[str]:
        """The error message (``failed``, ``retrying``)."""
        return self.fields.get("error")

    @property
    def value(self) -> Any:
        """The decoded progress value (``progress``)."""
        raw = self.fields.get("value")
        return json.loads(raw) if raw is not None else None


def parse_entry(entry_id: Any, raw: Any) -> List[Event]:
    """The :class:`Event` s of one XREAD/XRANGE entry (field dict or flat list): one, or one
    per job of a batched entry, all at the entry's stream id. A batched entry names its
    jobs by ``ids`` (a JSON array; another field holding a JSON array as long gives each
    job its value, any other field is shared by all) or by ``head`` + ``tails`` (each id
    is the head and the next :data:`TAIL_WIDTH` characters of the tails; every other
    field is shared)."""
    if isinstance(raw, dict):
        items = {_text(k): _text(v) for k, v in raw.items()}
    else:
        items = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}
    position = _text(entry_id)
    name = items.pop("event", "")
    tails = items.pop("tails", None)
    if tails is not None:  # enqueue_many's ids minted together: one head, 4-char tails
        head = items.pop("head", "")
        return [Event(position, name, head + tails[i:i + TAIL_WIDTH], dict(items))
                for i in range(0, len(tails), TAIL_WIDTH)]
    batch = items.pop("ids", None)
    if batch is None:
        return [Event(position, name, items.pop("id", ""), items)]
    ids = json.loads(batch)
    columns, shared = {}, {}
    for key, value in items.items():
        parsed = json.loads(value) if value.startswith("[") else None
        if isinstance(parsed, list) and len(parsed) == len(ids):
            columns[key] = parsed
        else:
            shared[key] = value
    return [Event(position, name, str(job_id),
                  {**shared, **{key: str(values[i]) for key, values in columns.items()}})
            for i, job_id in enumerate(ids)]


def check_position(since: Any) -> str:
    """A stream position: ``"0-0"`` (the start), ``"$"`` (only new events) or ``<ms>-<seq>``."""
    if not isinstance(since, str):
        raise InvalidInput("since must be a str stream id such as '0-0' or '$'")
    if since == "$":
        return since
    head, _, tail = since.partition("-")
    if not head.isdigit() or (tail and not tail.isdigit()):
        raise InvalidInput(f"since must be '$' or a stream id '<ms>-<seq>', not {since!r}")
    return since


def block_chunk_ms(client: Any) -> int:
    """Longest XREAD BLOCK safe on ``client``: :data:`BLOCK_CHUNK_MS`, or half its
    socket timeout when that is shorter (a block outliving it would raise TimeoutError)."""
    pool = getattr(client, "connection_pool", None)
    timeout = getattr(pool, "connection_kwargs", {}).get("socket_timeout") if pool else None
    if not timeout:
        return BLOCK_CHUNK_MS
    return max(1, min(BLOCK_CHUNK_MS, int(timeout * 500)))


class Waits:
    """How long each XREAD of an iteration blocks, for ``block_ms`` per wait
    (None: never block; 0: forever), in chunks of at most ``chunk_ms``.
    :meth:`next` is None (do not block), a chunk in ms, or -1 when this wait
    has used up ``block_ms``."""

    def __init__(self, block_ms: Optional[int], chunk_ms: int = BLOCK_CHUNK_MS):
        self.block_ms = block_ms
        self.chunk_ms = chunk_ms
        self.restart()

    def restart(self) -> None:
        """A read brought events: the next wait gets the full ``block_ms`` again."""
        self.started = time.monotonic()

    def next(self) -> Optional[int]:
        if self.block_ms is None:
            return None
        if self.block_ms == 0:
            return self.chunk_ms
        left = self.block_ms - (time.monotonic() - self.started) * 1000
        if left <= 0:
            return -1
        return max(1, min(self.chunk_ms, int(left)))


def last_id_op(keys: QueueKeys) -> Op:
    """The newest event's id, or ``"0-0"``: what ``"$"`` means at this instant (an
    iteration pins it once, so events between two blocking reads are not skipped)."""
    last = yield Cmd.of("XREVRANGE", keys.events, "+", "-", "COUNT", 1)
    return _text(last[0][0]) if last else "0-0"


def read_op(keys: QueueKeys, since: str, count: int, block_ms: Optional[int]) -> Op:
    """One XREAD after ``since``: ``[Event, ...]`` (empty when nothing came in time)."""
    args: List[Any] = ["XREAD", "COUNT", count]
    if block_ms is not None:
        args += ["BLOCK", block_ms]
    reply = yield Cmd.of(*args, "STREAMS", keys.events, since)
    if not reply:
        return []
    # RESP2 gives [[stream, entries]], RESP3 a {stream: [entries]} dict
    streams = reply.values() if isinstance(reply, dict) else [s[1] for s in reply]
    return [event for entries in streams for entry_id, raw in entries
            for event in parse_entry(entry_id, raw)]
