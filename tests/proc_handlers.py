"""Handlers the process Worker's tests run in child processes (imported there by name).

Each run notes ``begin`` and ``end`` lines in a ledger file outside Redis (the path is in
the payload): a test reconciles every run from it, whatever Redis says.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import select
import time
from typing import Any, Dict, List, Tuple

_HELD: List[bytes] = []  # the leaky handler's memory, kept for the child's life


def note(ledger: str, event: str, job: Any) -> None:
    """Append ``event id attempt pid time`` to the ledger (one write: atomic in append
    mode for lines this short)."""
    line = f"{event} {job.id} {job.attempts} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_ledger(ledger: str) -> List[Tuple[str, str, int, int, float]]:
    """``(event, job id, attempt, pid, time)`` per line."""
    if not os.path.exists(ledger):
        return []
    out = []
    with open(ledger) as f:
        for line in f:
            event, job_id, attempt, pid, at = line.split()
            out.append((event, job_id, int(attempt), int(pid), float(at)))
    return out


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


def work(job: Any) -> Any:
    """What ``job.payload["k"]`` says: a quick result, or a way to misbehave."""
    p: Dict[str, Any] = job.payload
    ledger = p.get("ledger")
    if ledger:
        note(ledger, "begin", job)
    kind = p["k"]
    if kind == "spin":  # ignores its stop, never releases the CPU
        while True:
            pass
    elif kind == "sleep":
        time.sleep(3600)
    elif kind == "select":  # blocked in a C call on a pipe nobody writes
        r, _ = os.pipe()
        select.select([r], [], [])
    elif kind == "exit":
        os._exit(1)
    elif kind == "segv":  # a real segfault: read address 0
        ctypes.string_at(0)
    elif kind == "hang_once":  # its first run hangs; a re-run returns
        if sum(1 for row in read_ledger(ledger) if row[0] == "begin" and row[1] == job.id) == 1:
            time.sleep(3600)
    elif kind == "leak":
        _HELD.append(b"x" * (50 << 20))
    elif kind == "nap":  # a handler that takes p["s"] seconds, then returns
        time.sleep(p["s"])
    elif kind == "cpu":  # ~p["ms"] of pure-Python work
        end = time.perf_counter() + p["ms"] / 1000.0
        while time.perf_counter() < end:
            pass
    elif kind == "polite":  # stops when asked
        while not job.cancelled:
            time.sleep(0.005)
        job.raise_if_cancelled()
    elif kind == "progress":
        job.progress({"half": True})
        job.extend_lease(60_000)
    elif kind == "badstr":
        raise _Unprintable()
    elif kind == "boom":
        raise ValueError(f"bad input {p.get('n')}")
    if ledger:
        note(ledger, "end", job)
    return {"pid": os.getpid(), "n": p.get("n")}


def raw(job: Any) -> bytes:
    """A bytes payload comes back reversed, as bytes."""
    return bytes(reversed(job.payload))


async def coro(job: Any) -> Any:
    """An async handler: awaits, then returns; with ``"sleep"``, waits to be cancelled."""
    if job.payload.get("k") == "sleep":
        await asyncio.sleep(3600)
    await asyncio.sleep(0.01)
    await job.progress_async(1)
    return {"pid": os.getpid(), "async": True}
