"""What every workload shares: the run context, the result record, timing and
verification helpers."""
from __future__ import annotations

import statistics
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import redis

import emqfast
from emqfast.core.keys import QueueKeys

from .server import BenchServer


class VerificationError(AssertionError):
    """The jobs a benchmark counted are not all there (or not exactly once): no number."""


@dataclass
class Ctx:
    """Options of one run, shared by the workloads."""

    server: BenchServer
    quick: bool = False
    reps: int = 3
    progress: Callable[[str], None] = lambda message: None
    notes: List[str] = field(default_factory=list)
    peers_n: int = 20_000        # --peers: jobs per bulk-enqueue comparison
    peers_drain_n: int = 5_000   # --peers: jobs per drain comparison (peers are slow)
    peers_venv: str = ""         # --peers: the directory of the peers' virtualenvs
    peers_rounds: int = 3        # --peers: rounds (medians, min-max)

    def n(self, full: int, quick: int) -> int:
        """The job count for this run's size."""
        return quick if self.quick else full

    def client(self) -> redis.Redis:
        """A fresh client on the benchmark server."""
        return self.server.client()


@dataclass
class Result:
    """One line of the results table.

    ``value`` is the measured figure in ``unit``; ``reference`` is what it is
    compared with (a ceiling or a peer measured in the same run, or a fixed
    target); ``ratio`` = value / reference (or reference / value when lower is
    better); ``ok`` says whether the target holds (None: no target).
    """

    workload: str
    name: str
    value: float
    unit: str
    reference: Optional[float] = None
    reference_label: str = ""
    ratio: Optional[float] = None
    target: str = ""
    ok: Optional[bool] = None
    verified: str = ""
    details: Dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        """A plain dict for ``--json``."""
        return asdict(self)


def median(values: Iterable[float]) -> float:
    """Median of the repetitions (robust to one noisy neighbour)."""
    return float(statistics.median(list(values)))


def rate(n: int, seconds: float) -> float:
    """Jobs per second (``inf`` guarded)."""
    return n / seconds if seconds > 0 else float("inf")


@contextmanager
def stopwatch() -> Iterator[List[float]]:
    """``with stopwatch() as t: ...`` then ``t[0]`` is the elapsed wall-clock seconds."""
    box: List[float] = [0.0]
    start = time.perf_counter()
    try:
        yield box
    finally:
        box[0] = time.perf_counter() - start


@dataclass
class CpuUse:
    """CPU seconds spent by this process and by the Redis server over a block.

    Wall-clock rates swing with whatever else runs on a shared machine; CPU per
    job does not, so the workloads report both. (With ``EMQ_REDIS_URL`` the
    server's figure includes other clients.)
    """

    process_s: float = 0.0
    redis_s: float = 0.0

    def per_job_us(self, n: int) -> Dict[str, float]:
        """µs of CPU per job, client and server."""
        return {"client_cpu_us_per_job": self.process_s / n * 1e6,
                "redis_cpu_us_per_job": self.redis_s / n * 1e6}


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@contextmanager
def cpu_use(client: redis.Redis) -> Iterator[CpuUse]:
    """``with cpu_use(client) as cpu: ...`` then ``cpu.process_s`` / ``cpu.redis_s``."""
    use = CpuUse()
    p0, r0 = time.process_time(), _redis_cpu(client)
    try:
        yield use
    finally:
        use.process_s = time.process_time() - p0
        use.redis_s = _redis_cpu(client) - r0


def queue_name(label: str) -> str:
    """A queue name no other run or repetition uses."""
    return f"bench-{label}-{uuid.uuid4().hex[:8]}"


@contextmanager
def fresh_queue(ctx: Ctx, label: str, **opts: Any) -> Iterator[emqfast.Queue]:
    """A new queue on the benchmark server, obliterated afterwards."""
    q = emqfast.Queue(queue_name(label), ctx.client(), **opts)
    try:
        yield q
    finally:
        q.obliterate()


def delete_queue_keys(client: redis.Redis, name: str) -> int:
    """Delete every key of queue ``name`` (also ones written by redis-benchmark)."""
    pattern = QueueKeys(name).glob()
    n = 0
    batch: List[bytes] = []
    for key in client.scan_iter(match=pattern, count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            n += client.unlink(*batch)
            batch.clear()
    if batch:
        n += client.unlink(*batch)
    return n


def check(condition: bool, message: str) -> None:
    """Raise :class:`VerificationError` unless ``condition``."""
    if not condition:
        raise VerificationError(message)


def verify_members(client: redis.Redis, zset: str, ids: Sequence[str], chunk: int = 10_000) -> int:
    """How many of ``ids`` are members of ``zset`` (ZMSCORE in pipelined chunks)."""
    present = 0
    pipe = client.pipeline(transaction=False)
    for i in range(0, len(ids), chunk):
        pipe.zmscore(zset, list(ids[i:i + chunk]))
    for scores in pipe.execute():
        present += sum(1 for s in scores if s is not None)
    return present


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str,
               poll_s: float = 0.005) -> None:
    """Poll ``predicate`` until it holds; :class:`VerificationError` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise VerificationError(f"timed out waiting for {what}")
        time.sleep(poll_s)


def server_now_ms(client: redis.Redis) -> int:
    """The Redis server's clock in epoch ms (the clock every schedule uses)."""
    sec, usec = client.time()
    return sec * 1000 + usec // 1000


def payloads(n: int, size: int = 100) -> List[bytes]:
    """``n`` distinct byte payloads of exactly ``size`` bytes."""
    return [f"{i:0{size}d}".encode()[-size:] if size else b"" for i in range(n)]


def with_backend(name: Optional[str]) -> str:
    """Select the emqfast backend for the run (``None`` keeps the current one)."""
    from emqfast.backends.select import current, use  # (emqfast.backend the attribute is a function)

    return use(name) if name else current()

def fmt(value: Optional[float], unit: str = "") -> str:
    """A figure for the table."""
    if value is None:
        return "-"
    if unit in ("jobs/s", "calls/s") or abs(value) >= 1000:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()
