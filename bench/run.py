"""The benchmark suite's entry point: ``emqfast bench`` or ``python bench/run.py``.

    emqfast bench                 # everything but the peers, full size (a few minutes)
    emqfast bench --quick         # small N: a smoke run that still verifies every job
    emqfast bench --only drain    # one workload (repeat or comma-separate for more)
    emqfast bench --only concurrent  # 16 threads / 100 tasks x q.enqueue vs enqueue_many
    emqfast bench --json out.json # machine-readable results as well as the table
    emqfast bench --peers         # also BullMQ / RQ / arq / SAQ, same workloads, same Redis
    emqfast bench --only peers --rounds 3 --update-benchmarks  # BENCHMARKS.md's peers section
    emqfast bench --only slowlog  # slowest emqfast command in SLOWLOG, 1M-job backlog
    emqfast bench --only scheduling  # due jobs behind a backlog, lanes, spin, caps
    emqfast bench --only server   # Redis CPU per job vs floor scripts

It starts its own redis-server (persistence off) unless ``EMQ_REDIS_URL`` (or
``--url``) names one, verifies every job it counts before reporting a number,
and deletes what it wrote. Exit status 1 when a workload could not be verified.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a plain script: make `bench` a package
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"
    import bench  # noqa: F401

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

import emqfast

from . import (backends, concurrent_enqueue, drain, enqueue, enqueue_latency, memory, micro,
    peers, promote, report, scale, scheduling, server, server_cost, slowlog, wake)
from .common import Ctx, Result, VerificationError, fmt, with_backend

WORKLOADS: Dict[str, Callable[[Ctx], List[Result]]] = {
    "enqueue": enqueue.run,
    "latency": enqueue_latency.run,  # one q.enqueue at a time vs a bare EVALSHA
    "concurrent": concurrent_enqueue.run,  # threads / tasks x q.enqueue vs enqueue_many
    "backends": backends.run,
    "drain": drain.run,
    "wake": wake.run,
    "promote": promote.run,
    "scale": scale.run,
    "memory": memory.run,
    "micro": micro.run,
    "peers": peers.run,
    "slowlog": slowlog.run,
    "scheduling": scheduling.run,
    "server": server_cost.run,
}
# only with --peers (or --only peers); slowlog (a 1M-job backlog, minutes) only with --only
OPTIONAL = {"peers", "slowlog", "scheduling", "server"}  # scheduling: due jobs under load;
# server: Redis CPU per job vs the floor scripts (python -m bench.server_cost
# adds --compare REF), both opt-in


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="emqfast bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small N (a smoke run; still verified)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help=f"run only these workloads: {', '.join(WORKLOADS)}")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--markdown", metavar="PATH", help="also write the results as a Markdown table")
    p.add_argument("--peers", action="store_true",
                   help="compare with BullMQ, RQ, arq and SAQ (each from its own pinned venv)")
    p.add_argument("--backend", choices=("auto", "c", "python"), default=None,
                   help="emqfast backend (default: EMQFAST_BACKEND, else auto)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (median; default 3, quick 1)")
    p.add_argument("--url", default=None, help="Redis URL (default: EMQ_REDIS_URL, else a private server)")
    p.add_argument("--peers-n", type=int, default=20_000, help="jobs per peer enqueue run")
    p.add_argument("--peers-drain-n", type=int, default=5_000, help="jobs per peer drain run")
    p.add_argument("--peers-venv", default="",
                   help="directory of the peers' virtualenvs, one per peer (created if missing; "
                        "default: EMQ_BENCH_PEERS_VENV, else ~/.cache/emqfast-bench/peers)")
    p.add_argument("--rounds", type=int, default=3,
                   help="peer rounds, contenders' order rotated each round (median, min-max)")
    p.add_argument("--peers-markdown", action="store_true",
                   help="also print the peers' comparison as Markdown (implies --peers)")
    p.add_argument("--update-benchmarks", nargs="?", const="BENCHMARKS.md", default=None,
                   metavar="PATH", help="rewrite the peers section of BENCHMARKS.md "
                                        "(or PATH) from this run (implies --peers)")
    return p.parse_args(argv)


def selected(args: argparse.Namespace) -> List[str]:
    """Workload names to run, in suite order."""
    only = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    unknown = only - set(WORKLOADS)
    if unknown:
        raise SystemExit(f"unknown workload(s): {', '.join(sorted(unknown))}; "
                         f"choose from {', '.join(WORKLOADS)}")
    if only:
        return [n for n in WORKLOADS if n in only]
    return [n for n in WORKLOADS if n not in OPTIONAL or (n == "peers" and args.peers)]


def _pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "-"


def machine(srv: server.BenchServer) -> Dict[str, str]:
    """What the figures were measured on."""
    mem = ""
    try:
        with open("/proc/meminfo") as fh:
            kb = int(fh.readline().split()[1])
        mem = f"{kb / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    except OSError:
        pass
    return {
        "cpus": str(os.cpu_count()), "cpu": cpu, "memory": mem,
        "os": platform.platform(), "python": platform.python_version(),
        "redis_server": srv.version(), "redis_py": _pkg_version("redis"),
        "hiredis_py": _pkg_version("hiredis"), "emqfast": emqfast.__version__,
        "backend": emqfast.backend(), "redis_url": "private" if srv.private else "EMQ_REDIS_URL",
        # the machine is shared: a high load average explains a noisy wall-clock figure
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }




def table(results: List[Result]) -> Table:
    """The results as a rich table."""
    t = Table(title="emqfast benchmarks", show_lines=False)
    for col, just in (("workload", "left"), ("benchmark", "left"), ("measured", "right"),
                      ("reference", "right"), ("reference is (same run)", "left"),
                      ("ratio", "right"), ("target", "left"), ("ok", "center"),
                      ("cpu µs/job client/redis", "right"), ("verified", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for r in results:
        ok = {True: "[green]yes[/]", False: "[red]NO[/]", None: ""}[r.ok]
        cpu = ""
        if "client_cpu_us_per_job" in r.details:
            cpu = (f"{r.details['client_cpu_us_per_job']:.1f} / "
                   f"{r.details['redis_cpu_us_per_job']:.1f}")
        t.add_row(r.workload, escape(r.name), fmt(r.value, r.unit), fmt(r.reference, r.unit),
                  r.reference_label, report.fmt_ratio(r.ratio) or "-",
                  r.target, ok, cpu, r.verified)
    return t


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the suite; returns the process exit status."""
    args = parse_args(argv)
    if args.peers_markdown or args.update_benchmarks:
        args.peers = True
        if args.only and "peers" not in {n.strip() for o in args.only for n in o.split(",")}:
            args.only.append("peers")
    names = selected(args)
    with_backend(args.backend)
    # A pipe or a file gets the full table, not an 80-column squeeze.
    console = Console() if sys.stdout.isatty() else Console(width=220)
    srv = server.start(args.url)
    results: List[Result] = []
    failures: List[str] = []
    ctx = Ctx(server=srv, quick=args.quick,
              reps=args.reps if args.reps else (1 if args.quick else 3),
              peers_n=args.peers_n, peers_drain_n=args.peers_drain_n, peers_venv=args.peers_venv,
              peers_rounds=max(1, args.rounds))
    started = time.time()
    try:
        info = machine(srv)
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console, transient=True) as progress:
            overall = progress.add_task("benchmarks", total=len(names))
            for name in names:
                ctx.progress = lambda msg: progress.update(overall, description=msg)
                progress.update(overall, description=name)
                try:
                    results += WORKLOADS[name](ctx)
                except VerificationError as exc:
                    failures.append(f"{name}: NOT VERIFIED: {exc}")
                except Exception as exc:  # keep going: one broken workload must not hide the rest
                    failures.append(f"{name}: {type(exc).__name__}: {exc}")
                    if os.environ.get("EMQ_BENCH_DEBUG"):
                        traceback.print_exc()
                progress.advance(overall)
        peers.attach_memory(results)
    finally:
        srv.stop()
    console.print(table(results))
    info["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    console.print(" ".join(f"{k}={v}" for k, v in info.items()), style="dim")
    for note in ctx.notes:
        console.print(f"note: {note}", style="dim")
    for failure in failures:
        console.print(f"FAILED {failure}", style="bold red")
    command = "emqfast bench " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.markdown:
        Path(args.markdown).write_text(report.to_markdown(results, info, command, failures))
    if (args.peers_markdown or args.update_benchmarks) and "peers" in names:
        if any(f.startswith("peers:") for f in failures):
            console.print("peers failed: BENCHMARKS.md left as it was", style="bold red")
        else:
            section = peers.to_markdown(results, info, command, peers.revision(), peers.utc_now())
            if args.peers_markdown:
                print(section)
            if args.update_benchmarks:
                peers.update_benchmarks(Path(args.update_benchmarks), section)
                console.print(f"wrote the peers section of {args.update_benchmarks}")
    if args.json:
        payload = {"command": command,
                   "started": started, "seconds": time.time() - started, "quick": args.quick,
                   "reps": ctx.reps, "machine": info, "results": [r.to_json() for r in results],
                   "failures": failures, "notes": ctx.notes}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
