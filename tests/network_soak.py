"""The network soak: Worker processes drain a queue through tests/fault_proxy.py while the
network and the server misbehave in turn, and every run is reconciled from a ledger kept
outside Redis.

One run (:func:`network_soak`) starts one Worker process per backend
(tests/soak_procs.py, all of one kind: ``thread`` or ``aio``), every one of them connected
through one FaultProxy in front of ``upstream_port``. A producer thread in this process,
also through the proxy, enqueues the run's jobs with ids of its own (a failed call is
re-made with the same ids: a duplicate, never a copy) at a steady pace, and then, in turn:

- ``half-open blip``: every live proxied connection goes silent for good (no FIN, no RST);
  new connections work at once. It has no length of its own: its nominal length is the
  read deadline (``READ_TIMEOUT_S``) within which a silenced call must be given up on;
- ``blackhole``: every connection, new ones included, silent for ``blackhole_s``, healed;
- ``BUSY script``: a script that never ends holds the server (``busy-reply-threshold``
  100 ms: every other command is answered BUSY) for ``busy_s``, then ``SCRIPT KILL``;
- ``CLIENT KILL loop``: ``CLIENT KILL TYPE normal`` on the server every 100 ms for
  ``kill_s`` (the proxy passes each kill on as a closed connection).

Right after each fault ends a few probe jobs are enqueued on a direct connection (and
more each second), so every Worker has work waiting whatever the producer's own recovery,
and the run waits (bounded) until every Worker process completed a job it started after
the fault; the next fault comes then. After the last one the rest is drained, the Workers
get SIGTERM and must exit cleanly, and the run is reconciled: every id enqueued is
completed (lost = 0), and the ledger shows no job run twice. A re-run is excused only
where the job's lease lapsed (its stall counter says so: its holder could not write the
outcome in time); those are counted apart.

Recovery of a fault (per Worker, from the ledger and the job hashes read after the run):
from the fault's end to the completion of the first job that Worker both started and
completed after it (Redis stamps ``started`` and the completion; same host clock); the
row shows the slowest Worker's. The promise is recovery within twice the fault's length.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import redis

import emqfast
from emqfast import Queue
from emqfast.core.deadlines import BLOCK_MARGIN_S, READ_TIMEOUT_S
from fault_proxy import FaultProxy
from test_fault_soak import SoakResult, job_ids_for, retrying, verdict, wait_drained
from waiting import wait_until

PROCS = str(Path(__file__).with_name("soak_procs.py"))
PROBE_EVERY_S = 0.1         # after a fault, a probe job enqueued directly this often
KILL_EVERY_S = 0.1          # CLIENT KILL loop cadence
BUSY_THRESHOLD_MS = 100     # the server answers BUSY once a script ran this long
BLOCK = 25                  # ids per producer enqueue_many call
START_S = 60.0              # bound on the Workers' start (imports, first beat) when loaded
EXIT_S = 5.0 + READ_TIMEOUT_S + BLOCK_MARGIN_S + 8.0  # SIGTERM -> exit: the shutdown's own
                            # bound, one read in flight, slack for a loaded machine


# --- the report -----------------------------------------------------------------------------

@dataclass
class FaultRow:
    """One fault of a run: what it did to the jobs around it and how long recovery took."""

    fault: str
    workers: str
    length_s: float
    start: float = 0.0                  # unix time the fault began
    end: float = 0.0                    # unix time it ended (healed, killed, stopped)
    jobs: int = 0                       # jobs enqueued from its start to the next fault's
    lost: int = 0                       # of those, enqueued and never completed
    run_twice: int = 0
    rerun_lapsed: int = 0               # re-runs after a lapsed lease (excused, counted)
    recovery_s: Optional[float] = None  # slowest Worker; None: one never recovered
    per_worker: Dict[str, Optional[float]] = field(default_factory=dict)
    detail: str = ""

    @property
    def bound_s(self) -> float:
        """The promise: recovery within twice the fault's length."""
        return 2 * self.length_s

    def within(self, margin_s: float = 0.0) -> bool:
        """Whether every Worker recovered within :attr:`bound_s` plus ``margin_s``."""
        return self.recovery_s is not None and self.recovery_s <= self.bound_s + margin_s


@dataclass
class NetworkSoakResult(SoakResult):
    """A :class:`SoakResult` with the per-fault rows and how the Worker processes ended."""

    rows: List[FaultRow] = field(default_factory=list)
    rerun_lapsed: int = 0
    exits: Dict[str, Any] = field(default_factory=dict)    # worker name -> return code
    worker_logs: Dict[str, str] = field(default_factory=dict)  # name -> stderr tail

    def problems(self) -> Dict[str, Any]:
        """Every invariant that did not hold (empty when clean). A lapsed lease's re-run
        is excused, so its second attempt is not counted against ``attempts_not_1``, and
        the stalls counted are those of the jobs run twice without a lapse."""
        bad = super().problems()
        if self.rerun_lapsed:
            for name in ("stalls", "attempts_not_1"):
                bad.pop(name, None)
        not_clean = {n: rc for n, rc in self.exits.items() if rc != 0}
        if not_clean:
            bad["worker_exits"] = not_clean
        tracebacks = [n for n, log in self.worker_logs.items() if "Traceback" in log]
        if tracebacks:
            bad["worker_tracebacks"] = tracebacks
        return bad


def table(rows: Iterable[FaultRow]) -> str:
    """The closing table: fault, Workers, jobs, lost, run twice, recovery (and its bound)."""
    head = ("fault", "workers", "jobs", "lost", "run twice", "re-run (lease lapsed)",
            "recovery s", "2x length s", "within 2x")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in rows:
        rec = "never" if row.recovery_s is None else f"{row.recovery_s:.2f}"
        lines.append(" | ".join(str(x) for x in (
            row.fault, row.workers, row.jobs, row.lost, row.run_twice, row.rerun_lapsed,
            rec, f"{row.bound_s:g}", "yes" if row.within() else "NO")))
    return "\n".join(lines)


# --- the ledger -------------------------------------------------------------------------------

@dataclass
class Run:
    """One handler run, as the ledger recorded it."""

    job_id: str
    pid: int
    at: float


# --- the server side: a direct (unproxied) client that rides out the faults ----------------

class Direct:
    """A plain client on the upstream server, not behind the proxy. Its calls are re-made
    until they answer (a CLIENT KILL loop drops it too; a BUSY server refuses it)."""

    def __init__(self, port: int, qname: str):
        self.port = port
        self.client = redis.Redis(port=port, socket_timeout=10)
        self.queue = Queue(qname, self.client)
        self.errors: Counter = Counter()

    def call(self, fn: Callable[[], Any], within_s: float = 30.0) -> Any:
        """``fn()`` until it answers, for at most ``within_s``."""
        return retrying(fn, self.errors, Counter(), time.monotonic() + within_s)

    def close(self) -> None:
        self.client.close()


def _set_busy_threshold(client: redis.Redis, ms: int) -> Tuple[str, int]:
    """Set the server's BUSY threshold (Redis 7 ``busy-reply-threshold``, formerly
    ``lua-time-limit``); returns the setting's name and its previous value."""
    for name in ("busy-reply-threshold", "lua-time-limit"):
        try:
            previous = int(client.config_get(name)[name])
        except (KeyError, redis.ResponseError):
            continue
        client.config_set(name, ms)
        return name, previous
    raise RuntimeError("the server has no BUSY threshold setting")


def _answers_busy(port: int) -> bool:
    probe = redis.Redis(port=port, socket_timeout=2)
    try:
        probe.ping()
        return False
    except redis.ResponseError as exc:
        return str(exc).startswith("BUSY")
    except redis.RedisError:
        return False
    finally:
        probe.close()


# --- the faults: each returns (start, end) in unix time ----------------------------------

def half_open_blip(proxy: FaultProxy, direct: Direct, hold_s: float) -> Tuple[float, float]:
    """Silence every live proxied connection for good; new ones work at once."""
    start = time.time()
    silenced = proxy.half_open()
    assert silenced >= 1, "a half-open blip with no live connection to silence"
    return start, start


def blackhole(proxy: FaultProxy, direct: Direct, hold_s: float) -> Tuple[float, float]:
    """Every connection silent, new ones too, for ``hold_s``; then new ones work."""
    start = time.time()
    proxy.blackhole()
    threading.Event().wait(hold_s)  # the fault's length itself, not a wait for an outcome
    proxy.heal()
    return start, time.time()


def busy_script(proxy: FaultProxy, direct: Direct, hold_s: float) -> Tuple[float, float]:
    """A script that never ends holds the server for ``hold_s``, then ``SCRIPT KILL``."""
    def run_forever() -> None:
        spinning = redis.Redis(port=direct.port, socket_timeout=None)
        try:
            spinning.eval("while true do end", 0)
        except redis.ResponseError:
            pass  # "Script killed by user"
        finally:
            spinning.close()

    spinner = threading.Thread(target=run_forever, daemon=True, name="soak-busy-script")
    spinner.start()
    wait_until(lambda: _answers_busy(direct.port), 10, "the server to answer BUSY", 0.01)
    start = time.time()
    threading.Event().wait(hold_s)
    admin = redis.Redis(port=direct.port, socket_timeout=10)
    admin.script_kill()
    admin.close()
    spinner.join(10)
    assert not spinner.is_alive(), "SCRIPT KILL did not end the busy script"
    return start, time.time()


def client_kill_loop(proxy: FaultProxy, direct: Direct, hold_s: float) -> Tuple[float, float]:
    """``CLIENT KILL TYPE normal`` (all but the killer) every 100 ms for ``hold_s``."""
    admin = redis.Redis(port=direct.port, socket_timeout=10)
    start = time.time()
    stop = time.monotonic() + hold_s
    killed = 0
    while time.monotonic() < stop:
        killed += int(admin.execute_command("CLIENT", "KILL", "TYPE", "normal",
                                            "SKIPME", "yes"))
        threading.Event().wait(KILL_EVERY_S)
    admin.close()
    assert killed >= 1, "the CLIENT KILL loop found no connection to kill"
    return start, time.time()


FAULTS: Dict[str, Callable[[FaultProxy, Direct, float], Tuple[float, float]]] = {
    "half-open blip": half_open_blip, "blackhole": blackhole,
    "BUSY script": busy_script, "CLIENT KILL loop": client_kill_loop}


def plan(blackhole_s: float, busy_s: float, kill_s: float) -> List[Tuple[str, float]]:
    """The faults of a run in order, each with its length (a blip's: the read deadline)."""
    return [("half-open blip", READ_TIMEOUT_S), ("blackhole", blackhole_s),
            ("BUSY script", busy_s), ("CLIENT KILL loop", kill_s)]


# --- the moving parts of a run ------------------------------------------------------------

class LedgerTail:
    """Reads the ledger file as it grows (whole lines only)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.runs: List[Run] = []

    def poll(self) -> List[Run]:
        """Every run recorded so far."""
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        whole = data[:data.rfind(b"\n") + 1]
        self.offset += len(whole)
        for line in whole.decode().splitlines():
            job_id, pid, at = line.split()
            self.runs.append(Run(job_id, int(pid), float(at)))
        return self.runs


def read_ledger(path: Path) -> List[Run]:
    """Every run the Worker processes recorded."""
    return LedgerTail(path).poll()


class Producer:
    """Enqueues ``ids`` through ``url`` in blocks at ``rate`` ids/s; once :meth:`hurry` is
    called, the rest at once. A failed call is re-made with the same ids."""

    def __init__(self, url: str, qname: str, ids: Sequence[str], rate: float,
                 budget_s: float):
        self.conn = emqfast.connect(url)
        self.queue = Queue(qname, self.conn)
        self.ids, self.rate, self.budget_s = list(ids), rate, budget_s
        self.enqueued_at: Dict[str, float] = {}  # first attempt, unix time
        self.errors: Counter = Counter()
        self.untyped: Counter = Counter()
        self.failure: Optional[BaseException] = None
        self._hurry = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="soak-producer")

    def hurry(self) -> None:
        """Stop pacing: enqueue what is left as fast as the server takes it."""
        self._hurry.set()

    def _run(self) -> None:
        t0, deadline = time.monotonic(), time.monotonic() + self.budget_s
        try:
            for start in range(0, len(self.ids), BLOCK):
                self._hurry.wait(t0 + start / self.rate - time.monotonic())  # the pace
                block = self.ids[start:start + BLOCK]
                now = time.time()
                self.enqueued_at.update((job_id, now) for job_id in block)
                retrying(lambda: self.queue.enqueue_many([{"i": j} for j in block],
                                                         job_ids=block),
                         self.errors, self.untyped, deadline)
        except BaseException as exc:  # noqa: BLE001 - reported in the verdict
            self.failure = exc
        finally:
            self.conn.close()


class WorkerProcs:
    """One Worker process (tests/soak_procs.py) of ``kind`` per backend, all through
    ``url``, all recording their runs in ``ledger``; output kept in ``workdir``."""

    def __init__(self, kind: str, backends: Sequence[str], url: str, qname: str,
                 ledger: Path, workdir: Path):
        self.procs: Dict[str, subprocess.Popen] = {}
        self.workdir = workdir
        for backend in backends:
            name = f"{kind}-{backend}"
            env = dict(os.environ, EMQFAST_BACKEND=backend)
            with open(workdir / f"{name}.out", "w") as out, \
                    open(workdir / f"{name}.err", "w") as err:
                self.procs[name] = subprocess.Popen(
                    [sys.executable, PROCS, kind, url, qname, str(ledger), name],
                    env=env, stdout=out, stderr=err)

    def pids(self) -> Dict[str, int]:
        """Worker name -> pid (the pid its ledger lines carry)."""
        return {name: proc.pid for name, proc in self.procs.items()}

    def dead(self) -> Dict[str, int]:
        """The processes that exited (name -> return code)."""
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop(self) -> Dict[str, Any]:
        """SIGTERM every Worker; name -> its return code, or what went wrong."""
        exits: Dict[str, Any] = {n: f"exited early ({rc})" for n, rc in self.dead().items()}
        for name, proc in self.procs.items():
            if name not in exits:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            if name in exits:
                continue
            try:
                proc.wait(EXIT_S)
                exits[name] = proc.returncode if "EXITED" in self.output(name) else \
                    f"no EXITED line ({proc.returncode})"
            except subprocess.TimeoutExpired:
                exits[name] = f"still running {EXIT_S:g}s after SIGTERM"
        self.kill()
        return exits

    def kill(self) -> None:
        """Kill whatever still runs (a bound, never the verdict)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)

    def output(self, name: str, stream: str = "out") -> str:
        """What Worker ``name`` wrote to stdout (``out``) or stderr (``err``)."""
        return (self.workdir / f"{name}.{stream}").read_text()


# --- one run ----------------------------------------------------------------------------

@dataclass
class Soak:
    """The parts of one run the steps below share."""

    proxy: FaultProxy
    direct: Direct
    workers: WorkerProcs
    ledger: LedgerTail
    qname: str
    probes: Dict[str, float] = field(default_factory=dict)  # probe id -> enqueued, unix

    def feed(self, tag: str) -> None:
        """Enqueue one probe job on the direct connection. One at a time: each wakes one
        Worker (the one blocked longest), so a fast Worker cannot take every probe in one
        claim and leave a healthy one with nothing to show."""
        job_id = f"JOB-probe-{self.qname}-{tag}-{len(self.probes)}"
        now = time.time()
        self.direct.call(lambda: self.direct.queue.enqueue({"probe": tag}, job_id=job_id))
        self.probes[job_id] = now

    def every_worker_recovered(self, tag: str, since: float, within_s: float) -> str:
        """Wait (at most ``within_s``) until every Worker process completed a job it
        started at or after ``since``, feeding probes meanwhile so none waits on the
        producer. Empty when all did; else which did not, and when each last ran a job."""
        check = _RecoveryCheck(self, since)
        deadline = time.monotonic() + within_s
        while check.waiting and time.monotonic() < deadline and not self.workers.dead():
            self.feed(tag)
            check.poll()
            if check.waiting:
                threading.Event().wait(PROBE_EVERY_S)  # the poll of a bounded wait
        if self.workers.dead():
            return f"Worker processes died: {self.workers.dead()}"
        return check.describe()


class _RecoveryCheck:
    """Which Worker processes have not yet completed a job started after ``since``: their
    runs since then are looked up in Redis as they come, each until it tells (started
    before ``since``: never; completed: recovered; else: looked at again)."""

    def __init__(self, soak: Soak, since: float):
        self.soak, self.since = soak, since
        self.waiting = set(soak.workers.pids().values())
        self.seen = 0  # runs of the ledger looked at
        self.open: List[Run] = []  # runs since then still to tell

    def poll(self) -> None:
        runs = self.soak.ledger.poll()
        self.open += [r for r in runs[self.seen:] if r.at >= self.since]
        self.seen = len(runs)
        batch, self.open = self.open[:500], self.open[500:]
        if not batch:
            return
        records = self.soak.direct.call(
            lambda: _records(self.soak.direct, [r.job_id for r in batch]))
        for run in batch:
            rec = records[run.job_id]
            if (rec.started or 0) < self.since - 0.001:
                continue  # started before the fault ended: tells nothing
            if rec.completed:
                self.waiting.discard(run.pid)
            elif run.pid in self.waiting:
                self.open.append(run)

    def describe(self) -> str:
        """Empty when every Worker recovered; else which did not, and their last runs."""
        if not self.waiting:
            return ""
        names = {pid: name for name, pid in self.soak.workers.pids().items()}
        last = {run.pid: run.at for run in self.soak.ledger.poll()}
        return "no job started and completed since the fault by " + ", ".join(
            f"{names[pid]} (its last run: "
            + (f"{last[pid] - self.since:+.1f}s from the fault's end)" if pid in last
               else "none)") for pid in sorted(self.waiting))


def _drive(soak: Soak, producer: Producer, faults: Sequence[Tuple[str, float]],
           label: str, margin_s: float, result: NetworkSoakResult) -> List[FaultRow]:
    """Warm up, apply each fault and wait for every Worker to recover, then drain."""
    rows: List[FaultRow] = []
    producer.thread.start()
    late = soak.every_worker_recovered("start", 0.0, START_S)
    if late:
        result.worker_error += f"before the faults: {late}; "
    else:
        for i, (name, length) in enumerate(faults):
            row = FaultRow(name, label, length)
            row.start, row.end = FAULTS[name](soak.proxy, soak.direct, length)
            late = soak.every_worker_recovered(str(i), row.end, row.bound_s + margin_s)
            if late:
                row.detail = f"within {row.bound_s + margin_s:g}s: {late}"
            rows.append(row)
    producer.hurry()
    producer.thread.join(producer.budget_s)
    total = len(producer.ids) + len(soak.probes)
    done = lambda: soak.direct.call(lambda: soak.direct.client.zcard(  # noqa: E731
        soak.direct.queue.keys.completed))
    wait_drained(done, total, lambda: len(soak.workers.dead()) < len(soak.workers.procs),
                 time.monotonic() + producer.budget_s)
    return rows


def network_soak(upstream_port: int, qname: str, kind: str, *,
                 backends: Sequence[str] = ("c", "python"), n_jobs: int = 2_000,
                 blackhole_s: float = 3.0, busy_s: float = 2.0, kill_s: float = 2.0,
                 margin_s: float = 10.0, seed: int = 31,
                 workdir: Optional[Path] = None) -> NetworkSoakResult:
    """One run: ``n_jobs`` through the proxy to one ``kind`` Worker process per backend
    while the faults of :func:`plan` happen in turn; reconciled from the ledger. Each
    fault waits at most twice its length plus ``margin_s`` for every Worker to recover."""
    faults = plan(blackhole_s, busy_s, kill_s)
    planned_s = 3.0 + sum(length + 5.0 for _, length in faults)  # the pace; hurried after
    workdir = Path(workdir or tempfile.mkdtemp(prefix="emq-network-soak-"))
    ledger = workdir / "ledger"
    ledger.touch()
    label = f"{kind} ({'+'.join(backends)})"
    result = NetworkSoakResult(fault=f"network faults, {label}")
    t0 = time.monotonic()
    direct = Direct(upstream_port, qname)
    setting, previous = _set_busy_threshold(direct.client, BUSY_THRESHOLD_MS)
    try:
        with FaultProxy(upstream_port, seed=seed) as proxy:
            workers = WorkerProcs(kind, backends, proxy.url(), qname, ledger, workdir)
            soak = Soak(proxy, direct, workers, LedgerTail(ledger), qname)
            producer = Producer(proxy.url(), qname, job_ids_for(qname, n_jobs),
                                rate=n_jobs / planned_s, budget_s=3 * planned_s + 120)
            try:
                result.rows = _drive(soak, producer, faults, label, margin_s, result)
            finally:
                result.exits = workers.stop()
            result.worker_logs = {n: _log_digest(workers.output(n, "err"))
                                  for n in workers.procs}
            reconcile(result, soak, producer)
    finally:
        direct.call(lambda: direct.client.config_set(setting, previous))
        direct.close()
    result.seconds = round(time.monotonic() - t0, 1)
    return result


def _log_digest(log: str) -> str:
    """A Worker's log, short: its tracebacks whole, else its last lines."""
    if "Traceback" in log:
        return log[max(0, log.index("Traceback") - 200):][:4000]
    return log[-1500:]


# --- the reconciliation ---------------------------------------------------------------------

@dataclass
class JobRecord:
    """What Redis holds of one job at the end (times in unix seconds, Redis' clock)."""

    completed: bool
    started: Optional[float]
    finished: Optional[float]
    stalls: int
    attempts: Optional[int]


def _records(direct: Direct, ids: Sequence[str]) -> Dict[str, JobRecord]:
    keys = direct.queue.keys
    pipe = direct.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(keys.job(job_id), "state", "started", "finished", "stalls", "attempts")
    out = {}
    for job_id, (state, started, finished, stalls, attempts) in zip(ids, pipe.execute()):
        out[job_id] = JobRecord(
            state == b"completed", int(started) / 1000 if started else None,
            int(finished) / 1000 if finished else None, int(stalls or 0),
            int(attempts) if attempts else None)
    return out


def _recovery(row: FaultRow, runs: Sequence[Run], pids: Dict[str, int],
              records: Dict[str, JobRecord], execs: Counter) -> None:
    """Per Worker: from the fault's end to the completion of the first job that Worker
    started (and ran once) after it; the row keeps the slowest."""
    for name, pid in pids.items():
        times = [records[r.job_id].finished - row.end for r in runs
                 if r.pid == pid and r.at >= row.end and execs[r.job_id] == 1
                 and records[r.job_id].completed
                 and (records[r.job_id].started or 0) >= row.end - 0.001]
        row.per_worker[name] = round(min(times), 3) if times else None
    got = list(row.per_worker.values())
    row.recovery_s = None if None in got or not got else max(got)  # type: ignore[type-var]


def _phase_of(rows: Sequence[FaultRow], at: float) -> Optional[FaultRow]:
    """The fault a job enqueued at ``at`` went through: the last one begun by then (jobs
    of the warm-up count with the first)."""
    begun = [row for row in rows if row.start <= at]
    return begun[-1] if begun else (rows[0] if rows else None)


def reconcile(result: NetworkSoakResult, soak: Soak, producer: Producer) -> None:
    """Fill ``result`` and its rows from the ledger and what Redis holds at the end."""
    ids = producer.ids + list(soak.probes)
    enqueued_at = dict(producer.enqueued_at, **soak.probes)
    runs = read_ledger(soak.ledger.path)
    execs = Counter(run.job_id for run in runs)
    verdict(soak.direct.client, soak.qname, ids, execs, result)
    records = _records(soak.direct, ids)
    twice = {j for j in ids if execs[j] > 1}
    lapsed = {j for j in twice if records[j].stalls > 0}
    result.run_twice, result.rerun_lapsed = len(twice - lapsed), len(lapsed)
    result.stalls = sum(records[j].stalls for j in ids if j not in lapsed)
    result.attempts_not_1 = sum(1 for j in ids if j not in lapsed
                                and records[j].attempts not in (None, 1))
    result.producer_errors = dict(producer.errors)
    result.untyped_errors = dict(producer.untyped)
    if producer.failure is not None:
        result.worker_error += f"producer: {producer.failure!r}; "
    per_row: Dict[int, List[str]] = defaultdict(list)
    for job_id in ids:
        row = _phase_of(result.rows, enqueued_at.get(job_id, 0.0))
        if row is not None:
            per_row[id(row)].append(job_id)
    for row in result.rows:
        mine = per_row[id(row)]
        row.jobs = len(mine)
        row.lost = sum(1 for j in mine if not records[j].completed)
        row.run_twice = sum(1 for j in mine if j in twice and j not in lapsed)
        row.rerun_lapsed = sum(1 for j in mine if j in lapsed)
        _recovery(row, runs, soak.workers.pids(), records, execs)
