"""Running the thread Worker's crew (:mod:`emqfast.worker.crew`): a thread per queue.

``run()`` serves every queue until :meth:`ThreadCrew.stop` or SIGTERM/SIGINT (one signal
stops them all; a second force-quits as for one queue). A member that stops on a
permanent error stops the others, and ``run()`` raises it.

``run_until_idle()`` (``emqfast worker --burst``) returns when all queues are idle at
once: every member runs until its queue is idle, and rounds repeat until one in which no
queue claimed anything (a queue that got work while another was still draining is served
in the next round).

Members on one single-server client share what :mod:`emqfast.worker.many_shared`
makes (:meth:`ThreadCrew.shared`): one marker wait, one cancel listener, a gate on
their requests, one eviction check.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

from emqfast.server import eviction
from emqfast.worker import signals
from emqfast.worker.crew import Crew
from emqfast.worker.handler_threads import HandlerThreads
from emqfast.worker.many_shared import SharedMarkers, gate_size, shared_client
from emqfast.worker.outcomes import WorkerStats


class ThreadCrew(Crew):
    """The crew of ``emqfast.Worker([q1, q2, ...], handler, order=..., weights=...)``."""

    def __init__(self, make: Callable[[Any, Crew], Any], queues: Sequence[Any], **options: Any):
        super().__init__(make, queues, **options)
        for m in self.members:  # one lock: one notify reaches every claim loop
            m._lock = m._guard = self.lock
            m._awaiting = self.awaiting
        client = shared_client(self.queues)
        self.markers: Optional[SharedMarkers] = None
        self.gate: Any = None
        self._client = client
        if client is not None:
            self.markers = SharedMarkers(client, [m._keys.marker for m in self.members],
                                         f"worker {self.name}")
            self.gate = threading.BoundedSemaphore(gate_size(client))
        self._listener: Any = None
        self._listening = 0
        self._eviction: Optional[Tuple[Optional[str]]] = None  # the check's warning, once

    def _notify_all(self) -> None:
        """Wake every member's claim loop: they wait on one lock, so one notify reaches
        them all (the caller holds it), not one per member."""
        self.lock.notify_all()

    def shared(self) -> Optional["ThreadCrew"]:
        """Itself when its members share one single-server client (its marker wait,
        listener and gate are theirs), else None: each keeps its own."""
        return self if self._client is not None else None

    def eviction(self, client: Any) -> Optional[str]:
        """The eviction check's warning, read once for the whole Worker."""
        with self.gate:
            if self._eviction is None:
                self._eviction = (eviction.check(client),)
        return self._eviction[0]

    def listener_open(self, listener_class: Any) -> Any:
        """A member begins serving: the one cancel listener of every queue (started by the
        first member)."""
        with self.lock:
            self._listening += 1
            if self._listener is None:
                routes = {m._keys.cancel_channel: m._on_cancel for m in self.members}
                self._listener = listener_class(self._client, routes, self._recheck_cancels,
                                                f"worker {self.name}")
                self._listener.start()
            return self._listener

    def listener_close(self) -> None:
        """A member stopped serving; the last one closes the listener."""
        with self.lock:
            self._listening = max(self._listening - 1, 0)
            listener = self._listener if not self._listening else None
            if listener is not None:
                self._listener = None
        if listener is not None:
            listener.close()

    def _recheck_cancels(self) -> None:
        """The listener (re-)subscribed: each queue's running jobs' cancel marks are read
        (a cancel published while nobody listened is caught)."""
        for m in self.members:
            m._drive(m._recheck_cancels())

    # signals.install's force quit: a second signal reaches every member
    @property
    def _force_quit(self) -> bool:
        return any(getattr(m, "_force_quit", False) for m in self.members)

    @_force_quit.setter
    def _force_quit(self, value: bool) -> None:
        for m in self.members:
            m._force_quit = value

    @property
    def _stop(self) -> "ThreadCrew":  # signals.install clears it after a force quit
        return self

    def clear(self) -> None:
        for m in self.members:
            m._stop.clear()

    def stop(self) -> None:
        """Stop claiming on every queue (graceful, as for one queue); a claim loop waiting
        for a handler slot (strict: a lower queue's) hears it now, not on its beat."""
        super().stop()
        with self.lock:
            self._notify_all()

    def run(self) -> WorkerStats:
        """Serve every queue until :meth:`stop` or SIGTERM/SIGINT."""
        restore = signals.install(self.stop, self.name, worker=self)
        try:
            self._run_all(lambda m: m._serve(until_idle=False, deadline=None,
                                             wait_scheduled=False))
        finally:
            restore()
            self._done()
        return self.stats

    def run_until_idle(self, timeout_s: Optional[float], wait_scheduled: bool,
                       wait_active: bool) -> WorkerStats:
        """Process jobs until every queue is idle at once; ``TimeoutError`` after
        ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for m in self.members:
            m._wait_active = wait_active
        try:
            while not self._stopping:
                before = self.stats.claimed
                self._run_all(lambda m: m._serve(until_idle=True, deadline=deadline,
                                                 wait_scheduled=wait_scheduled))
                if self.stats.claimed == before:
                    break
        finally:
            self._done()
        return self.stats

    def _done(self) -> None:
        self._stopping = False  # a stop requested meanwhile was honoured
        self.clear()

    def _run_all(self, serve: Callable[[Any], None]) -> None:
        """Serve each member in a thread of its own (the first in the caller's); a member
        that raises stops the others; the first error is raised once all have ended."""
        errors: List[BaseException] = []

        def one(m: Any) -> None:
            try:
                serve(m)
            except BaseException as exc:  # noqa: BLE001 - raised by the caller below
                errors.append(exc)
                self.stop()

        self.order.reset()
        self.pool = HandlerThreads(self.concurrency)
        threads = [threading.Thread(target=one, args=(m,), daemon=True,
                                    name=f"emq-queue-{m.queue.name}")
                   for m in self.members[1:]]
        for t in threads:
            t.start()
        try:
            one(self.members[0])
            for t in threads:
                t.join()
        finally:  # every member has waited for its handlers: the pool has nothing to run
            pool, self.pool = self.pool, None
            pool.shutdown(wait=False, cancel_futures=True)
        if errors:
            raise errors[0]
