"""Processes for the ref.wait contract (run as scripts by tests/test_wait_result.py).

    python tests/wait_procs.py work URL QUEUE      # a Worker drains QUEUE, then exits
    python tests/wait_procs.py wait URL QUEUE ID TIMEOUT_S   # waits on one job, prints

``work``'s handler, by the payload: ``{"ok": v}`` returns v; ``{"fail": text}`` raises
RuntimeError(text) (the job retries while it has attempts); ``{"bytes": s}`` returns
``s`` as bytes. It runs until the queue is idle (scheduled retries included).
``wait`` prints one line: ``ok <json result>`` or ``<ExceptionClass> <message>``.
The backend is the one EMQFAST_BACKEND names.
"""
from __future__ import annotations

import json
import os
import sys

try:  # the installed package (a matrix venv), else this checkout's
    import emqfast
except ImportError:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import emqfast


def handler(job: emqfast.Job) -> object:
    payload = job.payload
    if isinstance(payload, dict) and "fail" in payload:
        raise RuntimeError(payload["fail"])
    if isinstance(payload, dict) and "bytes" in payload:
        return payload["bytes"].encode()
    return payload.get("ok") if isinstance(payload, dict) else payload


def work(url: str, queue: str) -> None:
    q = emqfast.Queue(queue, emqfast.connect(url))
    emqfast.Worker(q, handler).run_until_idle(timeout_s=60, wait_scheduled=True)


def wait(url: str, queue: str, job_id: str, timeout_s: str) -> None:
    q = emqfast.Queue(queue, emqfast.connect(url))
    try:
        print("ok", json.dumps(q.ref(job_id).wait(float(timeout_s))), flush=True)
    except emqfast.EmqError as exc:
        print(type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    {"work": work, "wait": wait}[sys.argv[1]](*sys.argv[2:])
