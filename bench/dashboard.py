"""How fast the web dashboard's pages are with many queues.

    python bench/dashboard.py [--url URL] [--queues 1000] [--big] [--rounds 15]

Fills ``--queues`` queues (5 jobs each: pending, scheduled, grouped; with ``--big``
1,000,000 jobs in all, so SCAN and the counts run over a big keyspace) on a private
``redis-server`` (or ``--url``: a server it may fill, never one in use), then times, in
process through Starlette's TestClient (no network, so what is measured is the server's
work: Redis round trips, Python, templates):

- the overview page and its JSON (every queue's counts, paused flag, rate limit and
  outcome totals, pipelined), the queue list coming from the last SCAN over
  ``emq:{*}:meta`` (rescanned in the background), and that SCAN on its own;
- one queue page listing 50 jobs.

Prints the median and slowest server time of ``--rounds`` requests of each (the app's
``Server-Timing`` header), and the median round trip through the TestClient. The
issue's targets: overview <= 150 ms, queue page <= 50 ms.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Callable, List, Tuple

import redis

import emqfast
from emqfast.web import create_app


def start_server() -> Tuple[subprocess.Popen, str, str]:
    """A private redis-server on a free loopback port: (process, URL, its dir)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="emq-bench-dash-")
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    return proc, f"redis://127.0.0.1:{port}/0", workdir


def fill(conn: redis.Redis, queues: int, jobs: int) -> None:
    """``queues`` queues holding ``jobs`` jobs in all (pending, a few scheduled/grouped)."""
    per = max(jobs // queues, 5)
    for i in range(queues):
        q = emqfast.Queue(f"bench-{i:04d}", conn)
        q.enqueue_many([b"x" * 64] * (per - 3))
        q.enqueue_in(b"later", 3_600_000)
        q.enqueue(b"g", group="tenant-1")
        q.enqueue(b"h", group="tenant-2")
        if i % 10 == 0:
            q.pause()


def timed(call: Callable[[], object], rounds: int) -> Tuple[float, float, float]:
    """(median server ms, max server ms, median round trip ms) of ``rounds`` requests
    after one warm-up. Server time is the app's ``Server-Timing`` header: from the request
    reaching the dashboard's handler to its response being ready (Redis, Python,
    template); the round trip adds Starlette's TestClient reading the body."""
    call()
    server: List[float] = []
    trip: List[float] = []
    for _ in range(rounds):
        start = time.perf_counter()
        got = call()
        trip.append((time.perf_counter() - start) * 1000)
        server.append(float(got.headers["server-timing"].split("dur=")[1]))  # type: ignore
    return statistics.median(server), max(server), statistics.median(trip)


def run(url: str, queues: int, jobs: int, rounds: int) -> None:
    from starlette.testclient import TestClient

    conn = redis.Redis.from_url(url)
    started = time.perf_counter()
    fill(conn, queues, jobs)
    print(f"filled {queues} queues, {conn.dbsize()} keys in {time.perf_counter() - started:.1f} s")
    with TestClient(create_app(url)) as client:
        dash = client.app.state.dashboard

        def page(path: str) -> Callable[[], object]:
            def get() -> object:
                got = client.get(path)
                assert got.status_code == 200, (path, got.status_code)
                return got
            return get

        scans = []
        for _ in range(3):
            start = time.perf_counter()
            assert len(dash.discovery.names(fresh=True)) >= queues
            scans.append((time.perf_counter() - start) * 1000)
        rows = [("overview page (queue list cached)", page("/")),
                ("overview JSON (the 2 s live poll)", page("/api/overview")),
                ("queue page, 50 jobs", page("/queue?q=bench-0001&state=pending")),
                ("job page", page("/job?q=bench-0001&id="
                                  + emqfast.Queue("bench-0001", conn).job_ids("pending", 0, 0)[0]))]
        print(f"{'server time (Server-Timing)':40s} {'median':>9s} {'max':>9s}   round trip")
        for name, call in rows:
            med, worst, trip = timed(call, rounds)
            print(f"{name:40s} {med:6.1f} ms {worst:6.1f} ms   {trip:6.1f} ms")
        print(f"{'queue discovery SCAN (in the background)':40s} {statistics.median(scans):6.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a Redis it may fill (default: a private one)")
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--big", action="store_true", help="1,000,000 jobs in all")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    jobs = 1_000_000 if args.big else args.queues * 5
    if args.url:
        run(args.url, args.queues, jobs, args.rounds)
        return
    proc, url, workdir = start_server()
    try:
        run(url, args.queues, jobs, args.rounds)
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
