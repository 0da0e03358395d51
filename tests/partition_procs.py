"""A Worker process the partition tests SIGTERM while its server is silent (run as a script).

    python tests/partition_procs.py thread|aio URL QUEUE LEDGER

Its handler appends ``<job id>`` to the file LEDGER (a record of every run outside Redis),
prints ``RUNNING <id>``, then sleeps for the payload's seconds. The Worker has
``lease_ms=2000`` and ``shutdown_timeout_s=2``; the process prints ``EXITED`` when
``run()`` returns.
"""
from __future__ import annotations

import asyncio
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import emqfast  # noqa: E402
import emqfast.aio  # noqa: E402

LEASE_MS, SHUTDOWN_S = 2000, 2.0


def _record(ledger: str, job_id: str) -> None:
    with open(ledger, "a") as f:
        f.write(job_id + "\n")
    print("RUNNING", job_id, flush=True)


def thread_worker(url: str, queue: str, ledger: str) -> None:
    def handler(job):
        _record(ledger, job.id)
        time.sleep(float(job.payload))
        return "done"
    q = emqfast.Queue(queue, emqfast.connect(url))
    emqfast.Worker(q, handler, lease_ms=LEASE_MS, shutdown_timeout_s=SHUTDOWN_S).run()


def aio_worker(url: str, queue: str, ledger: str) -> None:
    async def main() -> None:
        async def handler(job):
            _record(ledger, job.id)
            await asyncio.sleep(float(job.payload))
            return "done"
        q = emqfast.aio.Queue(queue, emqfast.aio.connect(url))
        await emqfast.aio.Worker(q, handler, lease_ms=LEASE_MS,
                                 shutdown_timeout_s=SHUTDOWN_S).run()
    asyncio.run(main())


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
    mode, url, queue, ledger = sys.argv[1:5]
    (thread_worker if mode == "thread" else aio_worker)(url, queue, ledger)
    print("EXITED", flush=True)
