"""How much one script call may carry: the per-call batch sizes, and the helpers that
split a bigger request into bounded calls (bounded work per call)."""
from __future__ import annotations

from typing import Any, Iterable, Iterator, List

# Bounded work per script call: promote/reap/trim hand a script at most this
# many jobs (the scripts refuse more than 4,000), so a 1M backlog is many calls of a few
# ms each, never one call that blocks Redis for seconds. Larger limits loop.
# Sized for ~2-4 ms of Redis time per call (SLOWLOG, bench/slowlog.py: ~7.5 us per promoted
# or trimmed job, ~15 us per reaped one), leaving room under the 20 ms target on a busy host.
PROMOTE_BATCH = 250
DUE_BATCH = 4000      # due ids read per due.lua call (its maximum); promote moves them in
                      # PROMOTE_BATCH calls pipelined together: few round trips per 1M
REAP_BATCH = 250      # reap does the most per job (lease, counters, events)
TRIM_BATCH = 500


def batches(limit: int, size: int) -> Iterator[int]:
    """Per-call counts that add up to ``limit``, none above ``size``."""
    while limit > 0:
        yield min(limit, size)
        limit -= size


def chunks(items: List[Any], size: int) -> Iterable[List[Any]]:
    """``items`` in consecutive slices of at most ``size``."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
