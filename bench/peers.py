"""Optional comparison with peers (``--peers``): BullMQ (Python), RQ and arq run
the same workloads on the same Redis in the same run, from their own
virtualenv (created on first use; ``pip install bullmq rq arq``).

Workloads: bulk enqueue of tiny jobs, one worker process draining no-op jobs,
and (BullMQ) Redis bytes per pending/delayed job. emqfast runs the identical
workloads here too, so each ratio compares like with like.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

import emqfast

from .common import Ctx, Result, check, fresh_queue, rate, stopwatch
from .server import isolated

PEERS = ("bullmq", "rq", "arq")
DRIVER = Path(__file__).with_name("peer_driver.py")


def default_venv() -> Path:
    """``$EMQ_BENCH_PEERS_VENV``, else ``~/.cache/emqfast-bench/peers-venv``."""
    explicit = os.environ.get("EMQ_BENCH_PEERS_VENV")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "emqfast-bench" / "peers-venv"


def ensure_venv(path: Path, progress=lambda m: None) -> Path:
    """The venv's python, creating the venv and installing the peers when missing."""
    python = path / "bin" / "python"
    probe = [str(python), "-c", "import bullmq, rq, arq"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    progress(f"peers: creating {path} and installing {', '.join(PEERS)}")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PEERS], check=True)
    return python


def drive(python: Path, peer: str, workload: str, url: str, n: int) -> Dict:
    """Run one peer workload in the peers' venv; its JSON answer."""
    proc = subprocess.run([str(python), str(DRIVER), peer, workload, url, str(n)],
                          capture_output=True, text=True, timeout=3600)
    check(proc.returncode == 0,
          f"{peer} {workload} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emqfast_enqueue(ctx: Ctx, n: int) -> float:
    """emqfast on the peers' enqueue workload: ``enqueue_many`` of n ``{}`` jobs."""
    with fresh_queue(ctx, "peers") as q:
        with stopwatch() as t:
            refs = q.enqueue_many([{}] * n)
        check(len(refs) == n and q.redis.zcard(q.keys.pending) == n, "not all enqueued")
        return rate(n, t[0])


def emqfast_drain(ctx: Ctx, n: int) -> float:
    """emqfast on the peers' drain workload: default Worker, no-op handler."""
    with fresh_queue(ctx, "peers") as q:
        ids = [r.id for r in q.enqueue_many([{}] * n)]
        seen: List[str] = []
        w = emqfast.Worker(q, lambda job: seen.append(job.id), keep_completed=n + 1)
        with stopwatch() as t:
            w.run_until_idle(timeout_s=600)
        check(len(seen) == n and set(seen) == set(ids), "not exactly once")
        check(q.redis.zcard(q.keys.completed) == n, "not all completed")
        return rate(n, t[0])


def run(ctx: Ctx) -> List[Result]:
    """Peer rows (ratio = emqfast / peer, higher is better for emqfast)."""
    python = ensure_venv(Path(ctx.peers_venv) if ctx.peers_venv else default_venv(),
                         ctx.progress)
    url = ctx.server.url
    n, dn = ctx.peers_n, ctx.peers_drain_n
    out: List[Result] = []
    for workload, count, ours in (("enqueue", n, emqfast_enqueue), ("drain", dn, emqfast_drain)):
        ctx.progress(f"peers: emqfast {workload} {count:,}")
        mine = ours(ctx, count)
        out.append(Result(workload="peers", name=f"emqfast {workload} {count:,} tiny jobs",
                          value=mine, unit="jobs/s", verified=f"{count}/{count}",
                          details={"backend": emqfast.backend()}))
        for peer in PEERS:
            ctx.progress(f"peers: {peer} {workload} {count:,}")
            got = drive(python, peer, workload, url, count)
            out.append(Result(workload="peers", name=f"{peer} {got['version']} {workload}",
                              value=got["jobs_per_s"], unit="jobs/s",
                              reference=mine, reference_label="emqfast, same workload",
                              ratio=mine / got["jobs_per_s"], target="emqfast faster",
                              ok=mine > got["jobs_per_s"], verified=got["verified"],
                              details=got))
    mem_n = ctx.n(100_000, 5_000)
    for state in ("pending", "delayed", "prioritized"):
        ctx.progress(f"peers: bullmq memory per {state} job")
        with isolated(ctx.server) as server:  # as emqfast's own memory rows are measured
            got = drive(python, "bullmq", f"memory-{state}", server.url, mem_n)
        out.append(Result(workload="peers", name=f"bullmq {got['version']} bytes per {state} job",
                          value=got["bytes_per_job"], unit="bytes", verified=got["verified"],
                          details=got))
    return out


def attach_memory(results: List[Result]) -> None:
    """Give the memory rows their BullMQ reference when the peers ran."""
    bull = {r.details.get("workload"): r.value for r in results
            if r.workload == "peers" and r.name.startswith("bullmq") and r.unit == "bytes"}
    for r in results:
        if r.workload != "memory":
            continue
        ref: Optional[float] = bull.get(f"memory-{r.details.get('state')}")
        if ref is None:
            r.reference_label = "BullMQ: run with --peers"
            continue
        r.reference, r.reference_label = ref, "BullMQ, same job, same run"
        r.ratio = r.value / ref
        r.ok = r.value <= ref
