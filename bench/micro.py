"""Micro-benchmarks: pytest-benchmark over ``bench/bench_micro.py`` (score
packing, backoff, C vs Python parity of the hot functions; written with the C
core). One row per benchmark: calls/s, with the Python twin as reference when
the file pairs a ``..._c`` benchmark with a ``..._python`` one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

from .common import Ctx, Result

MICRO = Path(__file__).with_name("bench_micro.py")


def run(ctx: Ctx) -> List[Result]:
    """Run the micro file in a subprocess and read its ``--benchmark-json``."""
    if not MICRO.exists():
        ctx.notes.append("micro: bench/bench_micro.py not present; skipped")
        return []
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "micro.json")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(MICRO),
               f"--benchmark-json={out}", "--benchmark-columns=ops"]
        if ctx.quick:
            cmd += ["--benchmark-max-time=0.02", "--benchmark-min-rounds=1",
                    "--benchmark-warmup=off"]
        ctx.progress("micro: pytest-benchmark")
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(MICRO.parent.parent))
        if not os.path.exists(out):
            raise RuntimeError(f"micro-benchmarks failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        data = json.load(open(out))
    by_name = {b["name"]: b for b in data["benchmarks"]}
    rows = []
    for name, b in sorted(by_name.items()):
        param = (b.get("param") or "").lower()
        twin = None
        if param == "c":  # the pure-Python twin of the same benchmark
            twin_b = by_name.get(name.replace("[c]", "[python]"))
            twin = twin_b["stats"]["ops"] if twin_b else None
        label = f"{b.get('group') or b['name']} ({param or '-'})"
        rows.append(Result(workload="micro", name=label, value=b["stats"]["ops"], unit="calls/s",
                           reference=twin, reference_label="Python twin" if twin else "",
                           ratio=b["stats"]["ops"] / twin if twin else None,
                           verified="asserted equal to _pure" if proc.returncode == 0 else "FAILED",
                           details={"test": name, "rounds": b["stats"]["rounds"]}))
    if proc.returncode != 0:
        raise RuntimeError(f"micro-benchmarks failed:\n{proc.stdout[-2000:]}")
    return rows
