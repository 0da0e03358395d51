"""The thread Worker's handler pool: up to ``size`` threads taking tasks from one queue.

What :class:`concurrent.futures.ThreadPoolExecutor` does for the Worker, without a
``Future`` (and its ``Condition``) per task: the Worker submits a handler slot's drain
loop each time jobs wait for a free slot, many times a second on a busy drain, and never
reads a result (a slot reports its outcomes itself). Threads start as tasks need them and
are not daemons: like the executor's, a handler still running at interpreter exit is
waited for, and :meth:`HandlerThreads.shutdown` (or the exit) ends the idle ones.
"""
from __future__ import annotations

import logging
import queue as queue_mod
import threading
import weakref
from typing import Any, Callable, List, Optional, Tuple

log = logging.getLogger("emqfast.worker")

Task = Optional[Tuple[Callable[..., Any], Tuple[Any, ...]]]  # None: a thread's stop

_live: "weakref.WeakSet[HandlerThreads]" = weakref.WeakSet()
_exiting = False


def _at_exit() -> None:
    """Interpreter exit: idle threads end (running handlers are waited for)."""
    global _exiting
    _exiting = True
    for pool in list(_live):
        pool.shutdown(wait=False)


threading._register_atexit(_at_exit)  # type: ignore[attr-defined]  # the executor's hook too


class HandlerThreads:
    """``submit(fn, *args)`` runs ``fn(*args)`` on one of at most ``size`` threads."""

    def __init__(self, size: int, name: str = "emq-handler"):
        self._size = size
        self._name = name
        self._tasks: "queue_mod.SimpleQueue[Task]" = queue_mod.SimpleQueue()
        self._idle = threading.Semaphore(0)  # threads waiting for a task
        self._threads: List[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False
        _live.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        with self._lock:
            if self._closed or _exiting:
                raise RuntimeError("cannot run handlers after the pool was shut down")
            self._tasks.put((fn, args))
            if self._idle.acquire(timeout=0):  # an idle thread takes it
                return
            if len(self._threads) < self._size:
                thread = threading.Thread(target=self._work, daemon=False,
                                          name=f"{self._name}_{len(self._threads)}")
                self._threads.append(thread)
                thread.start()

    def _work(self) -> None:
        get, idle = self._tasks.get, self._idle
        while True:
            task = get()
            if task is None:
                return
            fn, args = task
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a slot's loop reports its own outcomes
                log.exception("handler thread: a task raised")
            del task, fn, args
            idle.release()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """No more tasks; idle threads end (``cancel_futures``: tasks not begun are
        dropped; ``wait``: until every thread has ended)."""
        with self._lock:
            if cancel_futures:
                try:
                    while True:
                        self._tasks.get_nowait()
                except queue_mod.Empty:
                    pass
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._tasks.put(None)
            threads = list(self._threads)
        if wait:
            for thread in threads:
                thread.join()
