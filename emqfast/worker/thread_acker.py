"""The thread Worker's acker: one thread that writes the handlers' outcomes in batches.

Handler threads queue their outcomes (a handful per item) on ``_acks``; the acker takes
up to ``ACK_BATCH`` at a time and writes them with the live backend's Batcher (hiredis
under the C backend) through the machine's acking logic
(:mod:`emqfast.worker.acking`). A ``None`` on the queue is the shutdown's sentinel.
"""
from __future__ import annotations

import queue as queue_mod
from typing import TYPE_CHECKING, Any, List, Optional

from emqfast.backends import select as backend
from emqfast.worker.acking import ACK_BATCH
from emqfast.worker.effects import Logic
from emqfast.worker.outcomes import Outcome

if TYPE_CHECKING:
    from emqfast.worker.machine import WorkerMachine as _Host
else:
    _Host = object


class ThreadAcker(_Host):
    """The acker thread's loop (mixed into :class:`emqfast.Worker`)."""

    _acks: "queue_mod.SimpleQueue[Optional[List[Outcome]]]"
    _ack_batcher: Any
    _redis: Any

    if TYPE_CHECKING:
        def _drive(self, logic: Logic) -> Any: ...

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
        """The next batch (up to ``ACK_BATCH`` queued outcomes); None: stop."""
        first = self._acks.get()
        if first is None:
            return None
        batch = list(first)
        while len(batch) < ACK_BATCH:
            try:
                item = self._acks.get_nowait()
            except queue_mod.Empty:
                break
            if item is None:
                self._acks.put(None)  # finish this batch, then exit
                break
            batch += item
        return batch

    def _write_outcomes(self, batch: List[Outcome], batcher: Any) -> None:
        """Write a batch (``batcher``: the acker's), then its run times."""
        replies = self._drive(self._write_batch(batch))
        self._drive(self._write_run_times(batch, replies))
