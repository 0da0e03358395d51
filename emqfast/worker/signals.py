"""SIGTERM/SIGINT for the thread Worker: stop gracefully, then put the old handlers back."""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any, Callable

log = logging.getLogger("emqfast.worker")


def install(stop: Callable[[], None], name: str) -> Callable[[], None]:
    """Make SIGTERM/SIGINT call ``stop`` (worker ``name``, logged); the function returned
    restores the previous handlers. Only the main thread can: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, frame: Any) -> None:
        log.info("worker %s: signal %d, shutting down gracefully", name, signum)
        stop()

    for s in previous:
        signal.signal(s, on_signal)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)
    return restore
