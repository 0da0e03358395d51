"""Optional comparison with peers (``--peers``): BullMQ (Python), RQ, arq and SAQ
run the same workloads on the same Redis in the same run, each from its own
virtualenv with the version pinned in :data:`PINS` (created on first use).

Workloads: bulk enqueue of tiny jobs and one worker process draining no-op
jobs, ``--rounds`` rounds (default 3) with the contenders' order rotated each
round, reported as medians with the min–max of the rounds; and (BullMQ, one
round) Redis bytes per pending/delayed/prioritized job. emqfast runs the
identical workloads in the same rounds, so each ratio compares like with like.
Every drain counts how many of its jobs ran, ran twice and never ran; a peer's
duplicates or losses are reported, not hidden (emqfast's fail the run).

``--peers-markdown`` prints the comparison as Markdown; ``--update-benchmarks``
writes it between :data:`BEGIN` and :data:`END` in BENCHMARKS.md.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import emqfast

from .common import Ctx, Result, check, fresh_queue, rate, stopwatch
from .server import isolated

# The one place the peers' versions live: a pip requirement per peer, pinned exactly.
PINS: Dict[str, str] = {
    "bullmq": "bullmq==3.4.4",
    "rq": "rq==3.0.0",
    "arq": "arq==0.28.0",
    "saq": "saq[redis]==0.26.4",
}
# Installed beside a pin: SAQ 0.26.4 imports typing_extensions without requiring it.
ALSO_INSTALL: Dict[str, Tuple[str, ...]] = {"saq": ("typing_extensions",)}
LABELS = {"emqfast": "emqfast", "bullmq": "BullMQ-py", "rq": "RQ", "arq": "arq", "saq": "SAQ"}
# What each contender runs, disclosed beside its figures (peer_driver.py implements it;
# 8 is peer_driver.CONCURRENCY, 32 peer_driver.IN_FLIGHT).
SETTINGS: Dict[str, Dict[str, str]] = {
    "emqfast": {"enqueue": "`Queue.enqueue_many` (one call)",
                "drain": "`Worker` defaults (concurrency 8, threads), `run_until_idle`"},
    "bullmq": {"enqueue": "`Queue.addBulk` (one call)",
               "drain": "`Worker` concurrency 8 (asyncio)"},
    "rq": {"enqueue": "`Queue.enqueue_many` inside one pipeline",
           "drain": "`SimpleWorker` in-process (no fork per job), burst"},
    "arq": {"enqueue": "no bulk API: `enqueue_job` (a WATCH/MULTI transaction each), "
                       "32 awaited together",
            "drain": "`Worker` max_jobs 8, burst; otherwise arq's defaults "
                     "(it polls for jobs: poll_delay 0.5 s)"},
    "saq": {"enqueue": "no bulk API: `Queue.enqueue` (one script call each), "
                       "32 awaited together",
            "drain": "`Worker` concurrency 8, otherwise SAQ's defaults"},
}
WORKLOADS = ("enqueue", "drain")
DRIVER = Path(__file__).with_name("peer_driver.py")
CLOSE_TIMEOUT_S = 20  # peer_driver.CLOSE_TIMEOUT_S
BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"


def pinned_version(requirement: str) -> str:
    """The exact version of a ``name[extras]==X.Y.Z`` pin (ValueError when not pinned)."""
    name, sep, ver = requirement.partition("==")
    if not sep or not ver.strip() or any(c in ver for c in "<>=!~*,; "):
        raise ValueError(f"not an exact pin: {requirement!r}")
    return ver.strip()


def venv_root(explicit: str = "") -> Path:
    """Where the peers' virtualenvs live: ``explicit``, ``$EMQ_BENCH_PEERS_VENV``, else
    ``~/.cache/emqfast-bench/peers`` (one ``<peer>-<version>`` venv each)."""
    chosen = explicit or os.environ.get("EMQ_BENCH_PEERS_VENV")
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "emqfast-bench" / "peers"


def ensure_venv(root: Path, peer: str, progress: Callable[[str], None] = lambda m: None) -> Path:
    """The python of ``peer``'s own venv, creating it and installing the pin when missing."""
    want = pinned_version(PINS[peer])
    path = root / f"{peer}-{want}"
    python = path / "bin" / "python"
    probe = [str(python), "-c",
             f"import {peer}, importlib.metadata as m; print(m.version({peer!r}))"]
    if python.exists():
        got = subprocess.run(probe, capture_output=True, text=True)
        if got.returncode == 0 and got.stdout.strip() == want:
            return python
    progress(f"peers: creating {path} ({PINS[peer]})")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", PINS[peer],
                    *ALSO_INSTALL.get(peer, ())], check=True)
    got = subprocess.run(probe, capture_output=True, text=True)
    check(got.returncode == 0 and got.stdout.strip() == want,
          f"{path} has {peer} {got.stdout.strip() or got.stderr.strip()[-300:]}, not {want}")
    return python


def drive(python: Path, peer: str, workload: str, url: str, n: int) -> Dict:
    """Run one peer workload in the peer's venv; its JSON answer."""
    proc = subprocess.run([str(python), str(DRIVER), peer, workload, url, str(n)],
                          capture_output=True, text=True, timeout=900)
    check(proc.returncode == 0,
          f"{peer} {workload} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def emqfast_enqueue(ctx: Ctx, n: int) -> Dict:
    """emqfast on the peers' enqueue workload: ``enqueue_many`` of n ``{}`` jobs."""
    with fresh_queue(ctx, "peers") as q:
        with stopwatch() as t:
            refs = q.enqueue_many([{}] * n)
        check(len(refs) == n and q.redis.zcard(q.keys.pending) == n, "not all enqueued")
        return {"jobs_per_s": rate(n, t[0]), "version": emqfast.__version__}


def emqfast_drain(ctx: Ctx, n: int) -> Dict:
    """emqfast on the peers' drain workload: default Worker, no-op handler (exactly once)."""
    with fresh_queue(ctx, "peers") as q:
        ids = [r.id for r in q.enqueue_many([{}] * n)]
        seen: List[str] = []
        w = emqfast.Worker(q, lambda job: seen.append(job.id), keep_completed=n + 1)
        with stopwatch() as t:
            w.run_until_idle(timeout_s=600)
        check(len(seen) == n and set(seen) == set(ids), "not exactly once")
        check(q.redis.zcard(q.keys.completed) == n, "not all completed")
        return {"jobs_per_s": rate(n, t[0]), "version": emqfast.__version__,
                "runs": n, "distinct": n, "duplicates": 0, "lost": 0}


class Spread(NamedTuple):
    """The median of the rounds and their min–max."""

    median: float
    low: float
    high: float


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of the rounds' values."""
    check(len(values) > 0, "no rounds")
    return Spread(float(statistics.median(values)), float(min(values)), float(max(values)))


def rotated(contenders: Sequence[str], round_no: int) -> List[str]:
    """The running order of round ``round_no``: each round starts one contender later,
    so none always runs first (on a cold cache) or last (beside a warm one)."""
    k = round_no % len(contenders)
    return list(contenders[k:]) + list(contenders[:k])


def summarize(samples: Dict[Tuple[str, str], List[Dict]], counts: Dict[str, int]
              ) -> List[Result]:
    """One row per contender and workload (value: the median rate of the rounds).

    ``samples[(contender, workload)]`` holds each round's driver answer; ``counts``
    the jobs per round of each workload. Rows compare against emqfast's median.
    """
    out: List[Result] = []
    for workload in WORKLOADS:
        ours = samples.get(("emqfast", workload))
        mine = spread([s["jobs_per_s"] for s in ours]).median if ours else None
        for (who, wl), rounds in samples.items():
            if wl != workload:
                continue
            s = spread([r["jobs_per_s"] for r in rounds])
            n = counts[workload]
            details = {"contender": who, "workload": workload, "n": n, "rounds": len(rounds),
                       "per_round": [r["jobs_per_s"] for r in rounds], "min": s.low,
                       "max": s.high, "version": rounds[0].get("version", ""),
                       "settings": SETTINGS.get(who, {}).get(workload, "")}
            if workload == "drain":
                for key in ("runs", "duplicates", "lost", "close_timed_out"):
                    details[key] = sum(int(r.get(key, 0)) for r in rounds)
                verified = (f"{n}/{n} exactly once, each of {len(rounds)} rounds"
                            if details["duplicates"] == 0 and details["lost"] == 0 else
                            f"{details['duplicates']} ran twice, {details['lost']} never ran "
                            f"(of {n} x {len(rounds)} rounds)")
            else:
                verified = f"{n}/{n} queued, each of {len(rounds)} rounds"
            row = Result(workload="peers",
                         name=f"{who} {details['version']} {workload} {n:,} tiny jobs",
                         value=s.median, unit="jobs/s", verified=verified, details=details)
            if who != "emqfast" and mine is not None:
                row.reference, row.reference_label = mine, "emqfast, same rounds"
                row.ratio, row.target = mine / s.median, "emqfast faster"
                row.ok = mine > s.median
            out.append(row)
    return out


def run(ctx: Ctx) -> List[Result]:
    """Peer rows: medians of ``ctx.peers_rounds`` rounds, then BullMQ's bytes per job."""
    root = venv_root(ctx.peers_venv)
    pythons = {peer: ensure_venv(root, peer, ctx.progress) for peer in PINS}
    url = ctx.server.url
    counts = {"enqueue": ctx.peers_n, "drain": ctx.peers_drain_n}
    ours = {"enqueue": emqfast_enqueue, "drain": emqfast_drain}
    samples: Dict[Tuple[str, str], List[Dict]] = defaultdict(list)
    contenders = ["emqfast", *PINS]
    for round_no in range(ctx.peers_rounds):
        for workload in WORKLOADS:
            for who in rotated(contenders, round_no):
                ctx.progress(f"peers round {round_no + 1}/{ctx.peers_rounds}: "
                             f"{who} {workload} {counts[workload]:,}")
                if who == "emqfast":
                    got = ours[workload](ctx, counts[workload])
                else:
                    got = drive(pythons[who], who, workload, url, counts[workload])
                samples[(who, workload)].append(got)
    out = summarize(samples, counts)
    mem_n = ctx.n(100_000, 5_000)
    for state in ("pending", "delayed", "prioritized"):
        ctx.progress(f"peers: bullmq memory per {state} job")
        with isolated(ctx.server) as server:  # as emqfast's own memory rows are measured
            got = drive(pythons["bullmq"], "bullmq", f"memory-{state}", server.url, mem_n)
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


# --- Markdown ---------------------------------------------------------------------------
def _jobs(value: float) -> str:
    """A rate: whole jobs/s, one decimal below 100."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _rate_cell(r: Result) -> str:
    return f"{_jobs(r.value)} jobs/s ({_jobs(r.details['min'])}–{_jobs(r.details['max'])})"


def _ratio_cell(r: Optional[Result]) -> str:
    return "—" if r is None or r.ratio is None else f"{r.ratio:.1f}×"


def to_markdown(results: List[Result], machine: Dict[str, str], command: str,
                revision: str = "", when: str = "") -> str:
    """The peers' comparison as Markdown: medians with spread, ratios, duplicates and
    losses, every setting, the versions and the machine (BENCHMARKS.md's section)."""
    rows = {(r.details["contender"], r.details["workload"]): r for r in results
            if r.workload == "peers" and "contender" in r.details}
    check(bool(rows), "no peer rows to render (run with --peers)")
    who_order = [w for w in ("emqfast", *PINS) if any((w, wl) in rows for wl in WORKLOADS)]
    first = next(iter(rows.values()))
    n_enq = rows.get((who_order[0], "enqueue"), first).details["n"]
    n_drain = rows.get((who_order[0], "drain"), first).details["n"]
    rounds = first.details["rounds"]
    at = (f" at commit {revision}" if revision else "") + (f", {when}" if when else "")
    lines = [
        f"Measured by `{command}`{at}: {rounds} rounds, the contenders' order rotated each "
        "round; each figure is the median of the rounds with their min–max, each ratio "
        "emqfast's median over the peer's. Every peer runs from its own virtualenv at the "
        "pinned version below, against the same Redis, with the same jobs (payload `{}`, "
        "2 bytes; peers' jobs take no arguments). Every drained job is counted: runs, "
        "runs twice, never ran.",
        "",
        f"| | bulk enqueue, {n_enq:,} jobs | emqfast × | one worker process draining "
        f"{n_drain:,} no-op jobs | emqfast × | drain, all rounds: ran twice / never ran |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for who in who_order:
        enq, dr = rows.get((who, "enqueue")), rows.get((who, "drain"))
        version = (enq or dr).details["version"]  # type: ignore[union-attr]
        label = f"{LABELS.get(who, who)} {version}"
        if who == "emqfast":
            label += f" ({machine.get('backend', emqfast.backend())} backend)"
        dup = "" if dr is None else f"{dr.details['duplicates']} / {dr.details['lost']}"
        lines.append(f"| {label} | {_rate_cell(enq) if enq else '—'} | "
                     f"{'' if who == 'emqfast' else _ratio_cell(enq)} | "
                     f"{_rate_cell(dr) if dr else '—'} | "
                     f"{'' if who == 'emqfast' else _ratio_cell(dr)} | {dup} |")
    lines += ["", "| contender | version (pin) | bulk enqueue API | drain worker |",
              "|---|---|---|---|"]
    for who in who_order:
        pin = "this checkout" if who == "emqfast" else f"`{PINS[who]}`"
        r = rows.get((who, "enqueue")) or rows[(who, "drain")]
        lines.append(f"| {LABELS.get(who, who)} | {r.details['version']} ({pin}) | "
                     f"{SETTINGS[who]['enqueue']} | {SETTINGS[who]['drain']} |")
    bull = {r.details["workload"].split("-", 1)[1]: r.value for r in results
            if r.workload == "peers" and r.unit == "bytes"}
    lines.append("")
    if bull:
        lines.append("BullMQ's Redis bytes per job (one round, fresh server, payload excluded): "
                     + ", ".join(f"{state} {value:.1f}" for state, value in bull.items()) + ".")
        lines.append("")
    for who in who_order:
        stuck = rows[(who, "drain")].details.get("close_timed_out", 0) if (who, "drain") in rows else 0
        if stuck:
            lines.append(f"{LABELS.get(who, who)}'s worker did not finish closing within "
                         f"{CLOSE_TIMEOUT_S} s after {stuck} of {rounds} drains (after the "
                         "clock stopped, so no figure includes it; the driver went on).")
            lines.append("")
    if "rq" in who_order:
        lines.append("RQ's drain rate is its per-job overhead: `SimpleWorker` makes dozens of "
                     "Redis calls per job (registries, heartbeats, result), one round trip "
                     "after another, whatever the handler does.")
        lines.append("")
    rounds_line = "; ".join(
        f"{LABELS.get(w, w)} {wl} " + " / ".join(_jobs(v) for v in rows[(w, wl)].details["per_round"])
        for wl in WORKLOADS for w in who_order if (w, wl) in rows)
    lines += [f"Rounds (jobs/s): {rounds_line}.", "",
              "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()) + "."]
    return "\n".join(lines) + "\n"


def replace_section(text: str, section: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``section``
    (markers kept, the rest untouched); with no markers, a Peers section is appended."""
    body = f"{BEGIN}\n{section.rstrip()}\n{END}"
    start, stop = text.find(BEGIN), text.find(END)
    if start == -1 and stop == -1:
        return text.rstrip("\n") + "\n\n## Peers (`emqfast bench --peers`)\n\n" + body + "\n"
    check(0 <= start < stop, f"BENCHMARKS.md: {BEGIN} and {END} must both appear, in order")
    return text[:start] + body + text[stop + len(END):]


def update_benchmarks(path: Path, section: str) -> None:
    """Rewrite the peers section of ``path`` (BENCHMARKS.md) with ``section``."""
    check(path.is_file(), f"{path} not found: run from the checkout's root or name the file")
    path.write_text(replace_section(path.read_text(), section))


def revision() -> str:
    """The checkout's commit (``-dirty`` when it has uncommitted changes), or ""."""
    try:
        got = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return got.stdout.strip() if got.returncode == 0 else ""


def utc_now() -> str:
    """Now, UTC, for the section's header."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
