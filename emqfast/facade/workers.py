"""Worker heartbeats: each Worker says on its beat that it is alive, so tools (the web
dashboard's Workers page) can list the live workers of a queue.

One bounded, expiring record per worker under the queue's slot (``lua/heartbeat.lua``):

- ``emq:{q}:worker:<token>`` hash: ``beat`` (server ms), ``host``, ``pid``, ``queues``,
  ``concurrency``, ``in_hand`` (jobs it holds), ``kind`` (thread, asyncio or process); a
  process Worker adds ``children`` (JSON: per handler process its ``pid``, ``jobs`` run,
  ``rss_kb``, a few ids of the jobs it holds as ``running`` and their number as
  ``held``) and ``child_events`` (JSON: counters such as ``restarts``, ``crash``,
  ``kill:timeout``, ``recycled:memory``); PEXPIRE'd
  after a few beats (:data:`emqfast.worker.calls.BEATS_KEPT`), so a worker that died vanishes by itself;
- ``emq:{q}:workers`` zset: token -> last beat (server ms), trimmed of stale entries on
  every write, at most 10,000 entries, expiring with its last worker.

The Worker writes them (``heartbeat.lua``, :class:`emqfast.worker.heartbeat.Heartbeat`); this
module reads them."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Cmd, Op, Returns, operation


MAX_LISTED = 500  # the most workers one read lists
# what one record's children fields may hold: it is read from Redis, whoever wrote it
MAX_CHILDREN = 1024
MAX_CHILD_IDS = 16
MAX_EVENTS = 32
MAX_FIELD_BYTES = 1 << 20


def worker_key(keys: QueueKeys, token: str) -> str:
    """The hash of one worker's last heartbeat (:meth:`QueueKeys.worker_record`)."""
    return keys.worker_record(token)


def registry_key(keys: QueueKeys) -> str:
    """The zset of a queue's workers, scored by their last beat (server ms)."""
    return keys.workers


@dataclass(frozen=True)
class ChildInfo:
    """One handler process of a process Worker, as its last heartbeat described it."""

    pid: Optional[int]
    jobs: Optional[int]  # jobs it has run
    rss_kb: Optional[int]  # resident memory (None where the platform does not say)
    running: List[str]  # ids of jobs it holds (a few: the record is rewritten each beat)
    held: int  # how many jobs it holds: the one it runs and those queued in it


@dataclass(frozen=True)
class WorkerInfo:
    """One live worker as its last heartbeat described it."""

    token: str
    host: str
    pid: Optional[int]
    queues: List[str]
    concurrency: Optional[int]
    in_hand: Optional[int]
    kind: str
    beat_ms: int
    age_ms: int  # how long ago that beat was, on the server clock
    children: List[ChildInfo] = field(default_factory=list)  # a process Worker's
    child_events: Dict[str, int] = field(default_factory=dict)  # restarts, crash, kill:...


def _int(value: Optional[bytes]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _text(value: Optional[bytes]) -> str:
    return value.decode("utf-8", "replace") if value is not None else ""


def _json(value: Optional[bytes]) -> Any:
    """A JSON field of the record, None when absent, too long or not JSON."""
    if value is None or len(value) > MAX_FIELD_BYTES:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return None


def _count(value: Any) -> Optional[int]:
    """A non-negative int, else None (a bool is not a count)."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else None


def _children(value: Optional[bytes]) -> List[ChildInfo]:
    """The ``children`` field, each entry checked: what is not as the Worker writes it
    is left out or None."""
    found = _json(value)
    out: List[ChildInfo] = []
    for c in found[:MAX_CHILDREN] if isinstance(found, list) else []:
        if not isinstance(c, dict):
            continue
        ids = c.get("running")
        running = [i for i in ids[:MAX_CHILD_IDS] if isinstance(i, str)] \
            if isinstance(ids, list) else []
        out.append(ChildInfo(pid=_count(c.get("pid")), jobs=_count(c.get("jobs")),
                             rss_kb=_count(c.get("rss_kb")), running=running,
                             held=max(_count(c.get("held")) or 0, len(running))))
    return out


def _events(value: Optional[bytes]) -> Dict[str, int]:
    """The ``child_events`` field: name -> count, non-counts left out."""
    found = _json(value)
    if not isinstance(found, dict):
        return {}
    pairs = ((k, _count(v)) for k, v in list(found.items())[:MAX_EVENTS]
             if isinstance(k, str))
    return {k: n for k, n in pairs if n is not None}


def _info(token: str, h: Dict[bytes, bytes], now_ms: int) -> WorkerInfo:
    beat = _int(h.get(b"beat")) or 0
    return WorkerInfo(token=token, host=_text(h.get(b"host")), pid=_int(h.get(b"pid")),
                      queues=[q for q in _text(h.get(b"queues")).split(",") if q],
                      concurrency=_int(h.get(b"concurrency")), in_hand=_int(h.get(b"in_hand")),
                      kind=_text(h.get(b"kind")), beat_ms=beat, age_ms=max(0, now_ms - beat),
                      children=_children(h.get(b"children")),
                      child_events=_events(h.get(b"child_events")))


def live_workers_op(keys: QueueKeys, limit: int = MAX_LISTED) -> Returns[List[WorkerInfo]]:
    """The live workers of a queue, freshest beat first (at most ``limit``): those whose
    record has not expired."""
    (sec, usec), tokens = yield Batch([Cmd.of("TIME"),
                                       Cmd.of("ZREVRANGE", registry_key(keys), 0, limit - 1)])
    now_ms = int(sec) * 1000 + int(usec) // 1000
    names = [t.decode("utf-8", "replace") for t in tokens]
    if not names:
        return []
    rows = yield Batch([Cmd.of("HGETALL", worker_key(keys, t)) for t in names])
    return [_info(t, h, now_ms) for t, h in zip(names, rows) if h]


class QueueWorkers:
    """``QueueWorkers(queue).list()``: the live workers of ``queue`` (sync or awaited,
    as the queue's other reads)."""

    def __init__(self, queue: Any):
        self.queue = queue

    def _drive(self, op: Op) -> Any:
        return self.queue._drive(op)

    @operation
    def list(self, limit: int = MAX_LISTED) -> Returns[List[WorkerInfo]]:
        """Live workers, freshest beat first."""
        return (yield from live_workers_op(self.queue.keys, limit))
