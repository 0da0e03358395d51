"""A producer admitting a three-queue flow, for tests/test_flow_cluster.py.

    python tests/flow_procs.py URL Q0 Q1 Q2 TAG crash|complete
    python tests/flow_procs.py URL Q0 - - - drain-crash

The flow: ``JOB-<TAG>-a`` on Q0, ``JOB-<TAG>-b`` on Q1 after a, ``JOB-<TAG>-c`` on Q2 after b
(fixed ids, so a second run admits the same graph). ``crash``: the process kills itself
(SIGKILL, no cleanup) at the moment it would link b to a, i.e. after b was written on its
slot and before any cross-slot link was sent. ``complete``: admits the whole flow.
``drain-crash``: settles Q0's dependencies and SIGKILLs itself once every dependent of the
first outbox entry was resolved (in their slots), before the entry is removed.
"""
from __future__ import annotations

import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import emqfast  # noqa: E402
from emqfast.facade import deps  # noqa: E402


def drain_crash(url: str, q0: str) -> None:
    from emqfast.facade import deps as dep_settle  # the settle step lives in deps
    real = dep_settle.Batch

    def batch(items, *args, **kwargs):
        if items and getattr(items[0], "args", ("",))[0] == "DEL":  # the entry's removal
            os.kill(os.getpid(), signal.SIGKILL)
        return real(items, *args, **kwargs)
    dep_settle.Batch = batch
    emqfast.Queue(q0, emqfast.connect(url)).settle_dependencies()


def main(url: str, q0: str, q1: str, q2: str, tag: str, mode: str) -> None:
    if mode == "drain-crash":
        return drain_crash(url, q0)
    conn = emqfast.connect(url)
    queues = [emqfast.Queue(name, conn) for name in (q0, q1, q2)]
    flow = emqfast.Flow(conn)
    a = flow.add(queues[0], {"step": "a"}, job_id=f"JOB-{tag}-a")
    b = flow.add(queues[1], {"step": "b"}, job_id=f"JOB-{tag}-b", after=[a])
    flow.add(queues[2], {"step": "c"}, job_id=f"JOB-{tag}-c", after=[b])
    if mode == "crash":
        def die(dep, dependent):
            os.kill(os.getpid(), signal.SIGKILL)
        deps.link_call = die
    flow.enqueue()


if __name__ == "__main__":
    main(*sys.argv[1:])
