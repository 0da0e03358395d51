"""Completed/failed per minute, from the growth of the metrics counters.

The metrics hash keeps exact totals (``completed``, ``failed``), not rates. The dashboard
samples the totals each time it reads the overview (at most every :data:`MIN_GAP_S`) and
derives the per-minute rate over the last minute of samples, and the chart's series
(jobs finished per second between samples, all queues together). Samples live in this
process only: a freshly started dashboard shows rates after its second read."""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

MIN_GAP_S = 1.0
WINDOW_S = 60.0
SERIES_POINTS = 120

Totals = Tuple[int, int]  # (completed, failed)


class Throughput:
    """Samples of every queue's outcome totals (thread-safe: uvicorn may run requests in
    a thread pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: Deque[Tuple[float, Dict[str, Totals]]] = deque()
        self._series: Deque[Tuple[float, float, float]] = deque(maxlen=SERIES_POINTS)

    def record(self, totals: Iterable[Tuple[str, int, int]], now: Optional[float] = None) -> None:
        """Note ``(queue, completed, failed)`` totals read at ``now`` (monotonic s)."""
        now = time.monotonic() if now is None else now
        snapshot = {name: (done, failed) for name, done, failed in totals}
        with self._lock:
            if self._samples and now - self._samples[-1][0] < MIN_GAP_S:
                return
            if self._samples:
                self._add_point(now, snapshot)
            self._samples.append((now, snapshot))
            while self._samples and now - self._samples[0][0] > WINDOW_S:
                self._samples.popleft()

    def _add_point(self, now: float, snapshot: Dict[str, Totals]) -> None:
        then, before = self._samples[-1]
        gap = max(now - then, 1e-6)
        done = sum(max(c - before.get(q, (c, f))[0], 0) for q, (c, f) in snapshot.items())
        failed = sum(max(f - before.get(q, (c, f))[1], 0) for q, (c, f) in snapshot.items())
        self._series.append((now, done / gap, failed / gap))

    def per_minute(self, queue: str) -> Optional[Tuple[float, float]]:
        """``(completed, failed)`` per minute over the last minute, or None (one sample)."""
        with self._lock:
            first = next((s for s in self._samples if queue in s[1]), None)
            last = self._samples[-1] if self._samples else None
        if first is None or last is None or last[0] - first[0] < MIN_GAP_S \
                or queue not in last[1]:
            return None
        span = last[0] - first[0]
        (c0, f0), (c1, f1) = first[1][queue], last[1][queue]
        return max(c1 - c0, 0) * 60 / span, max(f1 - f0, 0) * 60 / span

    def per_minute_all(self) -> Dict[str, Tuple[float, float]]:
        """:meth:`per_minute` of every queue of the last sample, in one pass."""
        with self._lock:
            if len(self._samples) < 2:
                return {}
            last_at, last = self._samples[-1]
            firsts = list(self._samples)
        out: Dict[str, Tuple[float, float]] = {}
        missing = set(last)
        for at, sample in firsts:  # oldest first: each queue's earliest sample
            if not missing or last_at - at < MIN_GAP_S:
                break
            span = last_at - at
            for name in [q for q in missing if q in sample]:
                (c0, f0), (c1, f1) = sample[name], last[name]
                out[name] = (max(c1 - c0, 0) * 60 / span, max(f1 - f0, 0) * 60 / span)
                missing.discard(name)
        return out

    def series(self) -> Tuple[List[float], List[float]]:
        """Completed and failed per second between samples, oldest first."""
        with self._lock:
            points = list(self._series)
        return [p[1] for p in points], [p[2] for p in points]
