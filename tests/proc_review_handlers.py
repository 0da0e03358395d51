"""Handlers of the process Worker's review tests (tests/test_processes_review.py), run in
child processes (imported there by name). Runs are noted in a ledger outside Redis, as
:mod:`proc_handlers` does."""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict

from proc_handlers import note


def act(job: Any) -> Any:
    """What ``job.payload["k"]`` says (a payload that is not a dict: echoed back)."""
    p = job.payload
    if not isinstance(p, dict):
        return p
    ledger = p.get("ledger")
    if ledger:
        note(ledger, "begin", job)
    kind = p.get("k")
    if kind == "exit":
        os._exit(1)
    elif kind == "gil":  # stuck in one C call that never lets go of the GIL
        sum(range(1 << 62))
    elif kind == "nap":
        time.sleep(p["s"])
    if ledger:
        note(ledger, "end", job)
    return {"pid": os.getpid(), "n": p.get("n")}


def none(job: Any) -> None:
    """Returns nothing."""
    return None


def same(job: Any) -> Any:
    """The payload, as it came."""
    return job.payload


def pid(job: Any) -> Dict[str, Any]:
    return {"pid": os.getpid()}


def kinds(job: Any) -> str:
    """The payload's type name."""
    return type(job.payload).__name__


def deps(job: Any) -> Any:
    """A bytes payload comes back as it came (bytes); a job with dependencies returns
    what their results were: ``{id: [type name, value as text]}``."""
    if isinstance(job.payload, bytes):
        return job.payload
    return {k: [type(v).__name__, v.hex() if isinstance(v, bytes) else v]
            for k, v in job.dependency_results().items()}



# a child that dies as it starts (once): the file named by EMQ_REVIEW_DIE_AT_START exists
_DIE_AT_START = os.environ.get("EMQ_REVIEW_DIE_AT_START", "")
if _DIE_AT_START and sys.argv[0] == "-c" and os.path.exists(_DIE_AT_START):
    os.remove(_DIE_AT_START)
    os._exit(3)
