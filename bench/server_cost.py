"""The ``server`` workload: Redis CPU per job of enqueue_many, the job
lifecycle (claim + start + complete, a Worker draining with a no-op handler) and
promote, beside floor scripts measured in the same run, and optionally the same
workloads on an earlier commit (``--compare REF``), all against one private server.

    python -m bench.server_cost [--n 20000] [--reps 3] [--compare 408ab12]

Each emqfast workload runs in a subprocess (``bench/server_probe.py``) with
``PYTHONPATH`` on the tree measured: this one, or a ``git worktree`` of REF (its C core
built there) under ``$TMPDIR/emqfast-ref-<sha>``. Repetitions alternate the contenders
(floor, this tree, REF, floor, ...), and every figure is the median of the reps.

``enqueue_quiet`` is enqueue with the queue's events off (its ratio is against the
enqueue floor): the events' cost is the difference.

Columns: ``script us/job`` = ``INFO commandstats`` usec of EVALSHA/EVAL per job (the
Lua work, the inner commands included); ``proc us/job`` = the server process's CPU
(``INFO cpu``) per job, which adds parsing and networking (commandstats time is wall
time inside the call, inflated when the server is descheduled on a busy host: prefer
``proc``); ``jobs/s`` = wall rate of
the client (for the floors, a redis-py loop: their client rate means nothing).

Floors (the unavoidable writes, no checks, no events, no counters):
- enqueue floor: one EVALSHA per chunk of 500 jobs doing HSET job payload + ZADD
  pending per job;
- lifecycle floor: claim = ZPOPMIN 128 + ZADD active + HSET leases per job; finish =
  ZREM active, HDEL leases, HSET job result, ZADD completed per job (128 per call).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    __package__ = "bench"

import redis

from . import server
from .server_probe import data, measured

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "bench" / "server_probe.py"
PYTHON = sys.executable

ENQUEUE_FLOOR = """
for i = 1, #ARGV, 2 do
  local j = (i + 1) / 2
  redis.call('HSET', KEYS[j + 1], 'payload', ARGV[i + 1])
  redis.call('ZADD', KEYS[1], j, ARGV[i])
end
return #ARGV / 2
"""
CLAIM_FLOOR = """
local got = redis.call('ZPOPMIN', KEYS[1], ARGV[1])
local ids = {}
for i = 1, #got, 2 do
  redis.call('ZADD', KEYS[2], 99999999999999, got[i])
  redis.call('HSET', KEYS[3], got[i], 'w:1')
  ids[#ids + 1] = got[i]
end
return ids
"""
FINISH_FLOOR = """
for i = 1, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('HDEL', KEYS[2], ARGV[i])
  redis.call('HSET', KEYS[i + 3], 'result', 'null')
  redis.call('ZADD', KEYS[3], 1, ARGV[i])
end
return #ARGV
"""
FLOOR_CHUNK = 500
CLAIM_CHUNK = 128


def enqueue_floor(client: redis.Redis, n: int) -> Dict[str, float]:
    """The enqueue floor over ``n`` jobs (a fresh key prefix, deleted after)."""
    tag = f"{{floor-{time.time_ns()}}}"
    sha = client.script_load(ENQUEUE_FLOOR)
    payloads = data(n)
    ids = [f"JOB{i:023d}" for i in range(n)]

    def body() -> None:
        pipe = client.pipeline(transaction=False)
        for s in range(0, n, FLOOR_CHUNK):
            chunk = range(s, min(s + FLOOR_CHUNK, n))
            keys = [f"{tag}:pending", *(f"{tag}:job:{ids[i]}" for i in chunk)]
            args = [v for i in chunk for v in (ids[i], payloads[i])]
            pipe.evalsha(sha, len(keys), *keys, *args)
        pipe.execute()
    try:
        return measured(client, body)
    finally:
        _wipe(client, tag)


def lifecycle_floor(client: redis.Redis, n: int) -> Dict[str, float]:
    """The lifecycle floor: ``n`` jobs claimed then finished, CLAIM_CHUNK per call."""
    tag = f"{{floor-{time.time_ns()}}}"
    pending, active, leases, done = (f"{tag}:{s}" for s in
                                     ("pending", "active", "leases", "completed"))
    client.zadd(pending, {f"JOB{i:023d}": i for i in range(n)})
    claim, finish = client.script_load(CLAIM_FLOOR), client.script_load(FINISH_FLOOR)

    def body() -> None:
        while True:
            ids = client.evalsha(claim, 3, pending, active, leases, CLAIM_CHUNK)
            if not ids:
                return
            keys = [active, leases, done, *(f"{tag}:job:{i.decode()}" for i in ids)]
            client.evalsha(finish, len(keys), *keys, *ids)
    try:
        out = measured(client, body)
        assert client.zcard(done) == n
        return out
    finally:
        _wipe(client, tag)


def _wipe(client: redis.Redis, tag: str) -> None:
    batch = list(client.scan_iter(match=f"{tag}:*", count=5000))
    for s in range(0, len(batch), 5000):
        client.unlink(*batch[s:s + 5000])


FLOORS: Dict[str, Callable[[redis.Redis, int], Dict[str, float]]] = {
    "enqueue": enqueue_floor, "lifecycle": lifecycle_floor}
FLOOR_OF = {"enqueue": "enqueue", "enqueue_quiet": "enqueue", "lifecycle": "lifecycle"}


# --- the trees measured -------------------------------------------------------------------

def ref_tree(ref: str) -> Path:
    """A worktree of ``ref`` with its C core built (made once, reused by later runs)."""
    sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", ref],
                                  text=True).strip()
    where = Path(tempfile.gettempdir()) / f"emqfast-ref-{sha}"
    if not (where / "emqfast").is_dir():
        subprocess.check_call(["git", "-C", str(ROOT), "worktree", "add", "--detach",
                               str(where), sha], stdout=subprocess.DEVNULL)
    if not list((where / "emqfast" / "backends").glob("_emqcore*.so")):
        subprocess.check_call([PYTHON, "setup.py", "build_ext", "--inplace", "-q"], cwd=where,
                              stdout=subprocess.DEVNULL)
    return where


def probe(tree: Path, url: str, workload: str, n: int) -> Dict[str, Any]:
    """One run of ``workload`` by the emqfast of ``tree`` (its own process)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([PYTHON, str(PROBE), url, workload, str(n)], env=env, cwd=tree,
                         check=True, capture_output=True, text=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_job(runs: List[Dict[str, Any]], n: int) -> Dict[str, float]:
    """Medians over the repetitions: script / process µs per job, jobs/s."""
    med = statistics.median
    return {"script_us": med(r["script_us"] for r in runs) / n,
            "proc_us": med(r["process_s"] for r in runs) * 1e6 / n,
            "client_us": med(r["client_cpu_s"] for r in runs) * 1e6 / n,
            "jobs_s": med(n / r["wall_s"] for r in runs)}


def measure(url: str, n: int, reps: int, ref: Optional[str],
            workloads: List[str]) -> Dict[Tuple[str, str], Dict[str, float]]:
    """(workload, contender) -> per-job medians; contenders 'floor', 'HEAD', REF."""
    trees = {"HEAD": ROOT}
    if ref:
        trees[ref] = ref_tree(ref)
    client = redis.Redis.from_url(url)
    runs: Dict[Tuple[str, str], List[Dict[str, Any]]] = {}
    for rep in range(reps):
        for w in workloads:
            if w in FLOORS:
                runs.setdefault((w, "floor"), []).append(FLOORS[w](client, n))
            order = list(trees.items())
            if rep % 2:
                order.reverse()  # alternate: drift on a shared machine hits both
            for name, tree in order:
                runs.setdefault((w, name), []).append(probe(tree, url, w, n))
    return {key: per_job(r, n) for key, r in runs.items()}


def table(results: Dict[Tuple[str, str], Dict[str, float]], ref: Optional[str]) -> str:
    """The Markdown table of one run, ratios against the floor and REF."""
    lines = ["| workload | contender | script µs/job | proc µs/job | client µs/job | jobs/s "
             "| script ÷ floor | proc ÷ floor | jobs/s ÷ ref |", "|---" * 9 + "|"]
    for (w, who), r in results.items():
        floor = results.get((FLOOR_OF.get(w, ""), "floor"))
        base = results.get((w, ref)) if ref else None
        ratio = (lambda a, b: f"{a / b:.2f}×" if b else "-")
        lines.append(
            f"| {w} | {who} | {r['script_us']:.2f} | {r['proc_us']:.2f} | "
            f"{r['client_us']:.2f} | {r['jobs_s']:,.0f} | "
            f"{ratio(r['script_us'], floor['script_us']) if floor else '-'} | "
            f"{ratio(r['proc_us'], floor['proc_us']) if floor else '-'} | "
            f"{ratio(r['jobs_s'], base['jobs_s']) if base and who != 'floor' else '-'} |")
    return "\n".join(lines)


def run(ctx: Any) -> List[Any]:
    """The ``server`` workload of ``emqfast bench --only server`` (this tree, no --compare):
    one Result per workload, Redis CPU µs/job (the server process) against its floor."""
    from .common import Result

    n = ctx.n(100_000, 2_000)
    results = measure(ctx.server.url, n, ctx.reps, None, ["enqueue", "enqueue_quiet",
                                                          "lifecycle", "promote"])
    out = []
    for (w, who), r in results.items():
        if who == "floor":
            continue
        floor = results.get((FLOOR_OF.get(w, ""), "floor"))
        res = Result(workload="server", name=f"{w}: Redis CPU per job", value=r["proc_us"],
                     unit="µs/job", target="enqueue ≤ 1.5× floor" if w == "enqueue" else "",
                     verified=f"{n}/{n} landed", details={"n": n, **r})
        if floor:
            res.reference, res.reference_label = floor["proc_us"], f"{FLOOR_OF[w]} floor"
            res.ratio = r["proc_us"] / floor["proc_us"]
            res.ok = res.ratio <= 1.5 if w == "enqueue" else None
        out.append(res)
    return out


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.server_cost", description=__doc__)
    p.add_argument("--n", type=int, default=20_000, help="jobs per run (default 20,000)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (median; default 3)")
    p.add_argument("--compare", metavar="REF", default=None, help="also measure commit REF")
    p.add_argument("--only", default="enqueue,enqueue_quiet,lifecycle,promote",
                   help="comma-separated workloads (enqueue, enqueue_quiet, lifecycle, promote,"
                        " promote_due: N jobs due at one instant, bench.promote's 1M case)")
    args = p.parse_args(argv)
    srv = server.start(private=True)
    try:
        results = measure(srv.url, args.n, args.reps, args.compare,
                          [w.strip() for w in args.only.split(",") if w.strip()])
    finally:
        srv.stop()
    head = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                   text=True).strip()
    print(f"server cost per job, n={args.n}, medians of {args.reps}, HEAD={head}"
          f" (plus uncommitted changes, if any), redis-server private")
    print(table(results, args.compare))


if __name__ == "__main__":
    main()
