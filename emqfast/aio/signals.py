"""One SIGTERM/SIGINT handler for every :class:`emqfast.aio.Worker` running in a process:
the first signal stops them gracefully, a second one during that shutdown force-quits
(coroutine handlers are cancelled at once instead of after ``shutdown_timeout_s``, and
their jobs, like the held ones, go back to pending)."""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any, Dict, List, Optional

log = logging.getLogger("emqfast.worker")


class SignalFanout:
    """One SIGTERM/SIGINT handler for every aio Worker running in the process.

    ``loop.add_signal_handler`` keeps one callback per signal: each Worker installing its
    own replaced the previous one's, and the first to finish removed it for all. Here the
    first Worker installs the handler (remembering what the loop had before), every
    signal stops all registered Workers, and the last one to leave restores the previous
    handler. Signals reach only the main thread's loop: Workers on other loops or threads
    are not registered (stop them with :meth:`Worker.stop <emqfast.aio.Worker.stop>`).
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: List[Any] = []
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._previous: Dict[int, Any] = {}

    def add(self, worker: Any, loop: asyncio.AbstractEventLoop) -> bool:
        """Register ``worker`` (running on ``loop``); False when signals cannot reach it."""
        with self._lock:
            if not self._workers:
                if not self._install(loop):
                    return False
            elif loop is not self._loop:
                return False  # the handler lives on another loop
            self._workers.append(worker)
            return True

    def remove(self, worker: Any) -> None:
        """Unregister ``worker``; the last one out restores the loop's previous handlers."""
        with self._lock:
            if worker not in self._workers:
                return
            self._workers.remove(worker)
            if not self._workers:
                self._restore()

    def _install(self, loop: asyncio.AbstractEventLoop) -> bool:
        # the loop's own handlers (a private map of the Unix loops): put back when we leave
        handlers = getattr(loop, "_signal_handlers", {})
        previous: Dict[int, Any] = {sig: handlers.get(sig) for sig in self.SIGNALS}
        try:
            for sig in self.SIGNALS:
                loop.add_signal_handler(sig, self._fire, sig)
        except (NotImplementedError, RuntimeError, ValueError):
            for sig in self.SIGNALS:  # not the main thread, or no signals on this platform
                self._put_back(loop, sig, previous[sig])
            return False
        self._loop, self._previous = loop, previous
        return True

    def _restore(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None or loop.is_closed():
            return
        for sig in self.SIGNALS:
            self._put_back(loop, sig, self._previous.get(sig))
        self._previous = {}

    @staticmethod
    def _put_back(loop: asyncio.AbstractEventLoop, sig: int, handle: Any) -> None:
        try:
            if handle is not None and not handle.cancelled():
                loop.add_signal_handler(sig, handle._callback, *handle._args)
            else:
                loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass

    def _fire(self, signum: int) -> None:
        for worker in list(self._workers):
            hurry = getattr(worker, "_hurry", None)
            if getattr(worker, "_stopping", False) and hurry is not None:
                # a second signal during the graceful shutdown: force quit
                log.warning("aio worker %s: signal %d again, force quit: cancelling running "
                            "handlers now; their jobs go back to pending", worker.name, signum)
                hurry.set()
            else:
                worker._on_signal(signum)


SIGNALS = SignalFanout()  # the process's one fan-out
