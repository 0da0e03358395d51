"""Worker heartbeats: each Worker says on its beat that it is alive, so tools (the web
dashboard's Workers page) can list the live workers of a queue.

One bounded, expiring record per worker under the queue's slot (``lua/heartbeat.lua``):

- ``emq:{q}:worker:<token>`` hash: ``beat`` (server ms), ``host``, ``pid``, ``queues``,
  ``concurrency``, ``in_hand`` (jobs it holds), ``kind`` (thread or asyncio); PEXPIRE'd
  after :data:`BEATS_KEPT` beats, so a worker that died vanishes by itself;
- ``emq:{q}:workers`` zset: token -> last beat (server ms), trimmed of stale entries on
  every write, at most 10,000 entries, expiring with its last worker.

The Worker's beat runs :meth:`Heartbeat.beat`; a failed heartbeat is logged and never stops
a Worker (it is information, not part of the job's safety)."""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from emqfast.backends.scripts import load
from emqfast.core.errors import EmqError
from emqfast.core.keys import QueueKeys
from emqfast.core.ops import Batch, Call, Cmd, Op, Returns, operation
from emqfast.core.version import KEYSPACE_VERSION

log = logging.getLogger("emqfast.worker")

_HEARTBEAT = load("heartbeat")
BEATS_KEPT = 3  # a record outlives its last beat by this many beats
MIN_TTL_MS = 3000  # ... and at least this long (a beat may be late under load)
MAX_LISTED = 500  # the most workers one read lists


def worker_key(keys: QueueKeys, token: str) -> str:
    """The hash of one worker's last heartbeat (keys of a queue's slot, like QueueKeys')."""
    return keys.base + "worker:" + token


def registry_key(keys: QueueKeys) -> str:
    """The zset of a queue's workers, scored by their last beat (server ms)."""
    return keys.base + "workers"


def beat_call(keys: QueueKeys, token: str, ttl_ms: int, fields: Dict[str, Any]) -> Call:
    """heartbeat.lua recording ``fields`` for worker ``token``, alive for ``ttl_ms``."""
    pairs = [x for item in fields.items() for x in (item[0], str(item[1]))]
    return Call(_HEARTBEAT, [worker_key(keys, token), registry_key(keys), keys.meta],
                [token, ttl_ms, KEYSPACE_VERSION, *pairs])


class Heartbeat:
    """A beat hook of one Worker: ``hook()`` writes its heartbeat (sync), or returns the
    awaitable doing it (an :mod:`emqfast.aio` Worker, whose queue drives coroutines)."""

    def __init__(self, machine: Any):
        self.machine = machine
        self.host = socket.gethostname()

    def fields(self) -> Dict[str, Any]:
        """What the record says about the worker now."""
        m = self.machine
        return {"host": self.host, "pid": os.getpid(), "queues": m.queue.name,
                "concurrency": m.concurrency, "in_hand": len(m._running),
                "kind": "asyncio" if getattr(m.queue, "is_async", False) else "thread"}

    def ttl_ms(self) -> int:
        return max(MIN_TTL_MS, int(self.machine.beat_s * 1000 * BEATS_KEPT))

    def op(self) -> Op:
        """The heartbeat as an operation (driven by the worker's queue)."""
        m = self.machine
        return (yield beat_call(m.queue.keys, m.name, self.ttl_ms(), self.fields()))

    def sign_off_op(self) -> Returns[Any]:
        """The worker stopped: its record goes now (it would linger until it expires)."""
        m = self.machine
        keys = m.queue.keys
        return (yield Batch([Cmd.of("DEL", worker_key(keys, m.name)),
                             Cmd.of("ZREM", registry_key(keys), m.name)]))

    def beat(self) -> Op:
        """The heartbeat on the Worker's beat (run by its driver); a failure is logged."""
        try:
            yield from self.op()
        except EmqError as exc:  # never stop a worker over its heartbeat
            log.warning("heartbeat of %s not written: %s", self.machine.name, exc)

    def sign_off(self) -> Any:
        """Remove the record of a stopped worker (sync; the awaitable under asyncio)."""
        return self._run(self.sign_off_op(), "removed")

    def _run(self, op: Any, what: str) -> Any:
        queue = self.machine.queue
        if getattr(queue, "is_async", False):
            return self._run_async(op, what)
        try:
            return queue._drive(op)
        except EmqError as exc:  # never stop a worker over its heartbeat
            log.warning("heartbeat of %s not %s: %s", self.machine.name, what, exc)
            return None

    async def _run_async(self, op: Any, what: str) -> Any:
        try:
            return await self.machine.queue._drive(op)
        except EmqError as exc:
            log.warning("heartbeat of %s not %s: %s", self.machine.name, what, exc)
            return None


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


def _int(value: Optional[bytes]) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _text(value: Optional[bytes]) -> str:
    return value.decode("utf-8", "replace") if value is not None else ""


def _info(token: str, h: Dict[bytes, bytes], now_ms: int) -> WorkerInfo:
    beat = _int(h.get(b"beat")) or 0
    return WorkerInfo(token=token, host=_text(h.get(b"host")), pid=_int(h.get(b"pid")),
                      queues=[q for q in _text(h.get(b"queues")).split(",") if q],
                      concurrency=_int(h.get(b"concurrency")), in_hand=_int(h.get(b"in_hand")),
                      kind=_text(h.get(b"kind")), beat_ms=beat, age_ms=max(0, now_ms - beat))


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
