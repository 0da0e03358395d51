"""Building many surviving objects at once without the cyclic GC's repeated passes.

A bulk enqueue of 100k jobs builds a few hundred thousand small objects (encoded payloads,
job rows, refs) that all outlive the call. CPython's cyclic collector runs once per ~700
new tracked objects and walks every young survivor, and every few runs the older ones
too: measured, a third of ``enqueue_many``'s client CPU, more than building
the refs themselves. Pausing it for the building loop frees nothing later than it would
be: reference counting frees every acyclic object at once, and the first collection
after the pause finds any cycle made meanwhile.

The switch is process-wide, so it is used only for big batches (:data:`BULK` objects or
more), around loops that make no I/O, and never re-enabled when it was off already (the
app turned it off, or another thread's pause holds it).
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator

BULK = 1000  # below this many objects a pause saves less than it costs to think about


@contextmanager
def gc_paused(count: int) -> Iterator[None]:
    """Pause the cyclic garbage collector while building ``count`` objects (no-op below
    :data:`BULK`, or when it is off already)."""
    if count < BULK or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
