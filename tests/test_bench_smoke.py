"""Keeps the benchmark suite honest: ``emqfast bench --quick`` runs every
end-to-end workload on small N against the test Redis and must verify every job
it counts (all enqueued / all completed exactly once). Timings are not checked
here: the targets are benchmarks (see BENCHMARKS.md), not timed tests."""
from __future__ import annotations

import importlib
import json
import os
import sys

import redis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ["enqueue", "backends", "drain", "wake", "promote", "scale", "memory"]


def _bench_run():
    """``emqfast.bench.run`` when installed, else ``bench.run`` from the source tree."""
    try:
        return importlib.import_module("emqfast.bench.run")
    except ModuleNotFoundError as exc:
        if exc.name not in ("emqfast.bench", "emqfast.bench.run"):
            raise  # the suite is installed but one of its imports is broken: say so
        if ROOT not in sys.path:
            sys.path.insert(0, ROOT)
        return importlib.import_module("bench.run")


def test_quick_bench_verifies_every_job_and_cleans_up(redis_url, tmp_path):
    out = tmp_path / "bench.json"
    run = _bench_run()
    before = set(redis.Redis.from_url(redis_url).scan_iter(match="emq:{bench-*", count=1000))
    status = run.main(["--quick", "--url", redis_url, "--json", str(out),
                       "--only", ",".join(WORKLOADS)])
    report = json.loads(out.read_text())
    assert report["failures"] == [] and status == 0
    rows = {(r["workload"], r["name"]): r for r in report["results"]}
    assert {w for w, _ in rows} == set(WORKLOADS)
    for r in report["results"]:
        verified = r["verified"]
        if "/" in verified:  # "N/N ..." : every counted job was found
            got, want = verified.split()[0].split("/")
            assert got == want, r
        assert r["value"] > 0, r
    enqueue = [r for r in report["results"] if r["workload"] == "enqueue"]
    modes = [r for r in enqueue if r["name"].startswith("enqueue_many ")]  # now/delayed/prio
    assert len(modes) == 3 and all(r["unit"] == "jobs/s" for r in enqueue)
    if modes[0]["reference"] is not None:  # redis-benchmark present: ceiling measured
        assert all(r["ratio"] == r["value"] / r["reference"] for r in modes)
    [aio] = [r for r in enqueue if r not in modes]  # emqfast.aio against the sync path
    assert aio["ratio"] == aio["value"] / aio["reference"]
    drain = next(r for r in report["results"] if r["workload"] == "drain")
    assert drain["verified"].endswith("completed exactly once")
    # nothing the bench wrote is left behind
    after = set(redis.Redis.from_url(redis_url).scan_iter(match="emq:{bench-*", count=1000))
    assert after <= before
