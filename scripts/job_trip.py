"""Which emqfast files one job's trip runs: a warmed-up ``Worker(q, handler).run_until_idle()``
serving one job, profiled on every thread (``threading.setprofile``); prints the distinct
files, those under ``emqfast/worker/``, and the totals. ``--producer``: ``q.enqueue`` instead."""
from __future__ import annotations

import argparse
import sys
import threading
import uuid
from pathlib import Path

import emqfast
from emqfast import Queue, Worker

PACKAGE = Path(emqfast.__file__).resolve().parent


def trace(fn) -> set:
    seen: set = set()

    def prof(frame, event, arg):
        f = frame.f_code.co_filename
        if f.startswith(str(PACKAGE)):
            seen.add(str(Path(f).resolve().relative_to(PACKAGE.parent)))
    threading.setprofile(prof)
    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--producer", action="store_true")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    conn = emqfast.connect()
    q = Queue(f"trip-{uuid.uuid4().hex[:6]}", conn)
    w = Worker(q, lambda job: None, concurrency=1)
    q.enqueue({"n": 0})
    w.run_until_idle()  # warm up: scripts loaded, connections made
    if a.producer:
        files = trace(lambda: q.enqueue({"n": 1}))
    else:
        q.enqueue({"n": 1})
        files = trace(lambda: Worker(q, lambda job: None, concurrency=1).run_until_idle())
    q.obliterate() if hasattr(q, "obliterate") else None
    worker = sorted(f for f in files if f.startswith("emqfast/worker/"))
    if a.v:
        print("\n".join(sorted(files)))
    print(f"files: {len(files)}  under emqfast/worker/: {len(worker)}")


if __name__ == "__main__":
    main()
