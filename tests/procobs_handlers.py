"""Handlers the tests of a process Worker's observability run (CLI, heartbeat, dashboard,
metrics): importable by name, as child processes import them."""
from __future__ import annotations

import os
import time
from typing import Any


def handle(job: Any) -> Any:
    """What ``job.payload["k"]`` says: return at once, nap ``s`` seconds (noting that it
    began in the ``mark`` file first), or die (``exit``)."""
    p = job.payload if isinstance(job.payload, dict) else {"k": "quick"}
    mark = p.get("mark")
    if mark:
        with open(mark, "a") as f:
            f.write(f"{job.id} {os.getpid()}\n")
    kind = p.get("k", "quick")
    if kind == "nap":
        time.sleep(p["s"])
    elif kind == "exit":
        os._exit(1)
    return {"pid": os.getpid()}
