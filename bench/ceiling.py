"""The server-side ceiling: ``redis-benchmark -P 64`` running the project's own
enqueue script with the arguments ``Queue.enqueue_many`` sends.

Every call must admit a NEW job, so the job key and id carry ``__rand_int__``
(``-r 100000000``; redis-benchmark draws each occurrence independently, so key
and id differ, which costs the script nothing). The admitted count is read back
and reported: rare random collisions are cheap no-op duplicates.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from typing import List, Optional

import emqfast
from emqfast.core.keys import QueueKeys
from emqfast.backends.scripts import load
from emqfast.core.version import KEYSPACE_VERSION

from .common import Ctx, check, delete_queue_keys, queue_name

PIPELINE = 64
CLIENTS = 50  # redis-benchmark's default -c; reported with the figure


@dataclass
class Ceiling:
    """What redis-benchmark achieved."""

    calls_per_s: float
    admitted: int
    requests: int
    clients: int
    pipeline: int
    command: str  # the command line, with the payload abbreviated


def available() -> bool:
    """True when ``redis-benchmark`` is on PATH."""
    return shutil.which("redis-benchmark") is not None


def parse_csv_rps(output: str) -> float:
    """requests/s from ``redis-benchmark --csv`` (the JSON in our args breaks CSV
    quoting, so count fields from the right: rps is the 7th-last)."""
    line = [ln for ln in output.strip().splitlines() if ln.strip()][-1]
    return float(line.rsplit(",", 7)[1].strip('"'))


def enqueue_args(q: emqfast.Queue, payload_size: int, priority: int, mode: str,
                 value: int) -> List[str]:
    """EVALSHA arguments (after numkeys) exactly as enqueue_many frames one job."""
    k = q.keys
    opts = q._options(priority, None, None).decode()
    job_id = "JOB__rand_int__"
    return [k.job(job_id), k.pending, k.delayed, k.marker, k.meta, k.counter, k.events,
            job_id, "x" * payload_size, "b", opts, str(priority), mode, str(value),
            KEYSPACE_VERSION]


def measure_enqueue(ctx: Ctx, n: int, *, payload_size: int = 100, priority: int = 0,
                    mode: str = "now", value: int = 0,
                    clients: int = CLIENTS) -> Ceiling:
    """Run the enqueue script ``n`` times through redis-benchmark on a scratch queue."""
    client = ctx.client()
    script = load("enqueue")
    client.script_load(script.source)
    name = queue_name("ceiling")
    q = emqfast.Queue(name, client)
    args = enqueue_args(q, payload_size, priority, mode, value)
    srv = ctx.server
    cmd = ["redis-benchmark", "-h", srv.host, "-p", str(srv.port), "-c", str(clients),
           "-P", str(PIPELINE), "-n", str(n), "-r", "100000000", "--csv"]
    if srv.db:
        cmd += ["--dbnum", str(srv.db)]
    if srv.password:
        cmd += ["-a", srv.password]
    cmd += ["EVALSHA", script.sha, "7", *args]
    try:
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
        rps = parse_csv_rps(out.stdout)
        keys = QueueKeys(name)
        admitted = int(client.zcard(keys.pending if mode == "now" else keys.delayed))
        # Sanity: the script really ran and admitted jobs (an error reply per call would
        # otherwise look like a very fast "ceiling").
        check(admitted >= n * 0.99,
              f"redis-benchmark admitted only {admitted} of {n} jobs: the ceiling is invalid")
    finally:
        delete_queue_keys(client, name)
    shown = [a if len(a) < 40 else a[:12] + "..." for a in cmd]
    if srv.password:
        shown[shown.index("-a") + 1] = "***"
    return Ceiling(calls_per_s=rps, admitted=admitted, requests=n, clients=clients,
                   pipeline=PIPELINE, command=" ".join(shown))


def median_of(ctx: Ctx, reps: int, n: int, **kwargs: object) -> Optional[Ceiling]:
    """Median-by-rate of ``reps`` ceiling runs (None when redis-benchmark is missing)."""
    if not available():
        return None
    runs = sorted((measure_enqueue(ctx, n, **kwargs) for _ in range(reps)),  # type: ignore[arg-type]
                  key=lambda c: c.calls_per_s)
    return runs[len(runs) // 2]
