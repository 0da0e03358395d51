"""SIGTERM/SIGINT for the thread Worker: the first stops it gracefully, a second one during
that shutdown force-quits; then the old handlers are put back.

Force quit: the Worker stops waiting for its running handlers and hands every job it
still holds back to pending at once (release.lua: the lease is dropped, the attempt not
counted), so another worker can take them now instead of after their leases expire.
Python cannot interrupt a thread: a handler still running goes on in the background and
whatever it returns is refused (its lease is gone). :meth:`Worker.run <emqfast.Worker.run>`
then raises ``KeyboardInterrupt``; ``emqfast worker`` exits at once (code 130)."""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any, Callable, List, Optional

from emqfast.worker.outcomes import job_group

log = logging.getLogger("emqfast.worker")

FORCE_RELEASE_S = 5.0  # how long a force quit keeps trying to hand its jobs back


def install(stop: Callable[[], None], name: str,
            worker: Optional[Any] = None) -> Callable[[], None]:
    """Make SIGTERM/SIGINT call ``stop`` (worker ``name``, logged); with ``worker``, a
    second signal marks it for a force quit (:func:`abandon_if_forced` acts on it). The
    function returned restores the previous handlers and, after a force quit, raises
    ``KeyboardInterrupt``. Only the main thread can install: elsewhere, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    seen: List[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) == 1 or worker is None:
            log.info("worker %s: signal %d, shutting down gracefully (send it again to "
                     "force quit)", name, signum)
        else:
            log.warning("worker %s: signal %d again, force quit: handing back every job it "
                        "holds now (running handlers are abandoned)", name, signum)
            worker._force_quit = True
        stop()

    for s in previous:
        signal.signal(s, on_signal)

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)
        if worker is not None and getattr(worker, "_force_quit", False):
            worker._force_quit = False
            worker._stop.clear()  # as run() does after a stop: the Worker may run again
            raise KeyboardInterrupt(f"worker {name} force-quit")
    return restore


def abandon_if_forced(worker: Any) -> bool:
    """After a second signal: release every job ``worker`` still runs (not those whose
    outcome is being written) and say so; True when it was forced (stop waiting)."""
    if not getattr(worker, "_force_quit", False):
        return False
    with worker._guard:
        running = [(r.job.id, r.token, job_group(r.job))
                   for r in worker._running.values() if not r.acking and not r.lost]
    if running:
        log.warning("worker %s: force quit: releasing %d running job(s) (%s); their "
                    "handlers' outcomes will be refused", worker.name, len(running),
                    ", ".join(map(repr, sorted(job_id for job_id, _, _ in running)[:10])))
        worker._drive(worker._releasing(running, time.monotonic() + FORCE_RELEASE_S))
    return True
