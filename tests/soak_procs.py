"""A Worker process the network soak runs through the fault proxy (run as a script).

    python tests/soak_procs.py thread|aio URL QUEUE LEDGER NAME

The backend is the ordinary ``EMQFAST_BACKEND`` switch (``c`` or ``python``). The handler
appends one line ``<job id> <pid> <unix time>`` to the file LEDGER before it returns: a
record of every run kept outside Redis (one ``write`` on an ``O_APPEND`` descriptor per
run, so lines of concurrent handlers and processes never interleave). The Worker has a
lease far longer than any fault (no lease may lapse while its holder is alive) and
``shutdown_timeout_s=5``; on SIGTERM it stops gracefully, prints its WorkerStats as one
JSON line and then ``EXITED``. Its log (WARNING and up) goes to stderr.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict
from typing import Any

if __name__ == "__main__":
    # before the slow imports: a SIGTERM that comes before run() installed its graceful
    # handler is held (see _unblock_sigterm_when_serving), never a kill
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import emqfast  # noqa: E402
import emqfast.aio  # noqa: E402

LEASE_MS = 120_000  # far past the longest fault: a lease lapses only if its holder is gone
SHUTDOWN_S = 5.0
CONCURRENCY = 4


def _ledger(path: str) -> Any:
    """A function that records one run of a job in the ledger file at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    def record(job_id: str) -> None:
        os.write(fd, f"{job_id} {pid} {time.time():.4f}\n".encode())
    return record


def _unblock_sigterm_when_serving(worker: Any) -> None:
    """Deliver a held SIGTERM at the first beat, inside run(): a graceful stop."""
    worker.beat_hooks.append(
        lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}))


def thread_worker(url: str, queue: str, ledger: str, name: str) -> Any:
    """Run a thread :class:`emqfast.Worker` until SIGTERM; its stats."""
    record = _ledger(ledger)

    def handler(job: emqfast.Job) -> int:
        record(job.id)
        return 1

    q = emqfast.Queue(queue, emqfast.connect(url))
    w = emqfast.Worker(q, handler, concurrency=CONCURRENCY, lease_ms=LEASE_MS,
                       keep_completed=10**9, max_stalled=1000, shutdown_timeout_s=SHUTDOWN_S,
                       name=name)
    _unblock_sigterm_when_serving(w)
    return w.run()


def aio_worker(url: str, queue: str, ledger: str, name: str) -> Any:
    """Run an :class:`emqfast.aio.Worker` until SIGTERM; its stats."""
    record = _ledger(ledger)

    async def main() -> Any:
        async def handler(job: emqfast.Job) -> int:
            record(job.id)
            return 1

        q = emqfast.aio.Queue(queue, emqfast.aio.connect(url))
        w = emqfast.aio.Worker(q, handler, concurrency=CONCURRENCY, lease_ms=LEASE_MS,
                               keep_completed=10**9, max_stalled=1000,
                               shutdown_timeout_s=SHUTDOWN_S, name=name)
        _unblock_sigterm_when_serving(w)
        return await w.run()
    return asyncio.run(main())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    mode, url, queue, ledger, name = sys.argv[1:6]
    stats = (thread_worker if mode == "thread" else aio_worker)(url, queue, ledger, name)
    print(json.dumps(asdict(stats)), flush=True)
    print("EXITED", flush=True)
