"""A Worker's heartbeat record (the Workers page, ``emqfast workers``): written on its
beat by ``heartbeat.lua``, removed when it stops (read back by
:mod:`emqfast.facade.workers`)."""
from __future__ import annotations

import json
import logging
import os
import socket
from typing import Any, Dict, List, Optional

from emqfast.core.errors import EmqError
from emqfast.core.ops import Batch, Cmd, Op, Returns
from emqfast.worker import calls

log = logging.getLogger("emqfast.worker")

# A child's job ids in the record, at most: a child may hold a few dozen queued beside the
# one it runs, and the record is rewritten on every beat
IDS_PER_CHILD = 4


def children_fields(report: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """A process Worker's ``children`` and ``child_events`` as compact JSON fields (a
    child's ``running``, the jobs its handlers began, cut to :data:`IDS_PER_CHILD` ids;
    ``held``, how many it holds, queued ones included); nothing for a Worker running
    its handlers in threads."""
    if not report:
        return {}
    children: List[Dict[str, Any]] = []
    for child in report.get("children", []):
        ids = list(child.get("running", []))
        children.append({**child, "running": ids[:IDS_PER_CHILD],
                         "held": child.get("held", len(ids))})
    return {"children": json.dumps(children, separators=(",", ":")),
            "child_events": json.dumps(report.get("child_events", {}),
                                       separators=(",", ":"), sort_keys=True)}


class Heartbeat:
    """A beat hook of one Worker: ``hook()`` writes its heartbeat (sync), or returns the
    awaitable doing it (an :mod:`emqfast.aio` Worker, whose queue drives coroutines)."""

    def __init__(self, machine: Any):
        self.machine = machine
        self.host = socket.gethostname()

    def fields(self) -> Dict[str, Any]:
        """What the record says about the worker now."""
        m = self.machine
        queues, concurrency, in_hand = m._crew.presence(m)  # a many-queue Worker's: all
        children = getattr(m, "_children_report", lambda: None)()  # handler processes
        kind = "asyncio" if getattr(m.queue, "is_async", False) else "thread"
        return {"host": self.host, "pid": os.getpid(), "queues": queues,
                "concurrency": concurrency, "in_hand": in_hand,
                "kind": "process" if children else kind, **children_fields(children)}

    def ttl_ms(self) -> int:
        return max(calls.MIN_TTL_MS, int(self.machine.beat_s * 1000 * calls.BEATS_KEPT))

    def op(self) -> Op:
        """The heartbeat as an operation (driven by the worker's queue)."""
        m = self.machine
        return (yield calls.beat_call(m.queue.keys, m.name, self.ttl_ms(), self.fields()))

    def sign_off_op(self) -> Returns[Any]:
        """The worker stopped: its record goes now (it would linger until it expires)."""
        m, keys = self.machine, self.machine.queue.keys
        return (yield Batch([Cmd.of("DEL", keys.worker_record(m.name)),
                             Cmd.of("ZREM", keys.workers, m.name)]))

    def beat(self) -> Op:
        """The heartbeat on the Worker's beat (run by its driver); a failure is logged."""
        try:
            yield from self.op()
        except EmqError as exc:  # never stop a worker over its heartbeat
            log.warning("heartbeat of %s not written: %s", self.machine.name, exc)

    def sign_off(self) -> Any:
        """Remove the record of a stopped worker (sync; the awaitable under asyncio)."""
        queue = self.machine.queue
        if getattr(queue, "is_async", False):
            return self._sign_off_async()
        try:
            return queue._drive(self.sign_off_op())
        except EmqError as exc:  # never stop a worker over its heartbeat
            log.warning("heartbeat of %s not removed: %s", self.machine.name, exc)
            return None

    async def _sign_off_async(self) -> Any:
        try:
            return await self.machine.queue._drive(self.sign_off_op())
        except EmqError as exc:
            log.warning("heartbeat of %s not removed: %s", self.machine.name, exc)
            return None
