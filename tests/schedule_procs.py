"""A schedule-pump process for the racing-pumps test (run as a script).

    python tests/schedule_procs.py URL QUEUE BACKEND READY_KEY GO_KEY

Announces itself on READY_KEY (RPUSH), blocks until the test releases it on
GO_KEY (BLPOP), so all pumps start together, then pumps one schedule per call
until nothing is due, and prints how many jobs it minted as one JSON line.
"""
from __future__ import annotations

import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402

from emqfast import Queue  # noqa: E402


def main(url: str, queue: str, backend: str, ready_key: str, go_key: str) -> None:
    importlib.import_module("emqfast.backend").use(backend)
    client = redis.Redis.from_url(url)
    q = Queue(queue, client)
    client.rpush(ready_key, os.getpid())
    if client.blpop([go_key], timeout=60) is None:
        raise SystemExit("never released")
    minted = 0
    while True:
        sweep = q.schedules.sweep(limit=1)
        minted += sweep.minted
        if not sweep.more and (sweep.next_run_ms is None or sweep.next_run_ms > sweep.now_ms):
            break
    print(json.dumps({"minted": minted}))


if __name__ == "__main__":
    main(*sys.argv[1:6])
