"""The thread Worker's acker: one thread that writes the handlers' outcomes in batches.

Handler threads queue each outcome on ``_acks`` as their handler returns; the acker takes
up to ``ACK_BATCH`` at a time and writes them with the live backend's Batcher (hiredis
under the C backend) through the machine's acking logic
(:mod:`emqfast.worker.acking`). A ``None`` on the queue is the shutdown's sentinel.

Batching is the acker's: while more outcomes are coming (jobs wait for a handler, or more
handlers run than outcomes are in hand) it lets them gather for up to ``GATHER_S`` before
writing, so a busy drain writes dozens of outcomes per round trip, while a lone job's
outcome is written at once. The handler threads never hold one back (a slot that batched
its own outcomes kept a finished job unwritten for as long as its next handler ran).
"""
from __future__ import annotations

import queue as queue_mod
import time
from typing import TYPE_CHECKING, Any, List, Optional

from emqfast.backends import select as backend
from emqfast.worker.acking import ACK_BATCH
from emqfast.core.ops import Logic
from emqfast.worker.outcomes import Outcome

if TYPE_CHECKING:
    from emqfast.worker.machine import WorkerMachine as _Host
else:
    _Host = object

GATHER = 64       # outcomes in hand that are worth a write without gathering more...
GATHER_S = 0.001  # ...else gather for this long while more are coming


class ThreadAcker(_Host):
    """The acker thread's loop (mixed into :class:`emqfast.Worker`)."""

    _acks: "queue_mod.SimpleQueue[Optional[Outcome]]"
    _ack_batcher: Any
    _redis: Any

    if TYPE_CHECKING:
        def _drive(self, logic: Logic) -> Any: ...
        _ready: Any
        _in_hand: int

    def _ack_loop(self) -> None:
        """The acker thread: write batches of queued outcomes until the None sentinel."""
        try:
            while True:
                batch = self._next_ack_batch()
                if batch is None:
                    return
                try:
                    if self._ack_batcher is None:  # the live backend's pipeline
                        self._ack_batcher = backend.batcher_for(self._redis)
                    self._write_outcomes(batch, self._ack_batcher)
                except Exception as exc:  # noqa: BLE001 - the acker must outlive any one batch
                    self._ack_failed(batch, exc)
        finally:
            batcher, self._ack_batcher = self._ack_batcher, None
            if batcher is not None:
                batcher.close()

    def _next_ack_batch(self) -> Optional[List[Outcome]]:
        """The next batch (up to ``ACK_BATCH`` queued outcomes), counted as pending and
        its leases no longer renewed; None: stop."""
        first = self._acks.get()
        if first is None:
            return None
        batch = [first]
        stop = self._take_queued(batch)
        if not stop and len(batch) < GATHER and self._more_coming(len(batch)):
            time.sleep(GATHER_S)  # not a blocking get: a put wakes no one meanwhile
            stop = self._take_queued(batch)
        if stop:
            self._acks.put(None)  # finish this batch, then exit
        with self._guard:
            self._pending_acks += len(batch)
            self._mark_acking(batch)
        return batch

    def _take_queued(self, batch: List[Outcome]) -> bool:
        """Add the outcomes queued now to ``batch`` (up to ``ACK_BATCH``); True when the
        shutdown's sentinel was met."""
        get = self._acks.get_nowait
        while len(batch) < ACK_BATCH:
            try:
                item = get()
            except queue_mod.Empty:
                return False
            if item is None:
                return True
            batch.append(item)
        return False

    def _more_coming(self, in_batch: int) -> bool:
        """More outcomes are due soon: jobs wait for a handler, or more handlers run than
        outcomes are in this batch (an estimate read without the lock)."""
        return bool(self._ready) or self._in_hand > in_batch

    def _write_outcomes(self, batch: List[Outcome], batcher: Any) -> None:
        """Write a batch (``batcher``: the acker's), then its run times."""
        replies = self._drive(self._write_batch(batch))
        self._drive(self._write_run_times(batch, replies))
