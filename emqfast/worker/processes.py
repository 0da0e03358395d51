"""The process executor of :class:`emqfast.Worker` ``(processes=N)``: handlers run in N
supervised child processes, so a handler can be stopped for real and a crash takes only
its own attempt.

The Worker keeps everything else (claiming, leases, acks, the beat, cancels and
timeouts); a :class:`ProcessPool` only runs the jobs it is handed (``Worker._ready``) in
its children (:mod:`emqfast.worker.child`), one reader thread per child taking outcomes
back to the Worker as they come. The rules, on top of the Worker's:

- **kill after the grace**: a run asked to stop (its timeout, ``q.cancel``) that has not
  ended ``cancel_grace_ms`` later is ended by killing its child (SIGKILL). Its outcome
  is its stop's (a timeout failure, retried per its attempts; or cancelled), written
  once: the child is gone before it is written, so no late result can follow. Jobs the
  same child was running beside it (``threads`` > 1) go back to the queue, their
  attempt not counted;
- **a crash fails only its own attempt**: a child that dies by itself (a signal,
  ``os._exit``, the OOM killer) fails the jobs it ran with
  :class:`~emqfast.errors.WorkerCrashed`, retried per their attempts;
- **a replacement before the slot is given back**: a dead or recycled child
  (``max_jobs_per_child``, ``max_memory_per_child_mb``, checked between jobs) is
  replaced, and only then takes jobs again; children that die young are restarted with
  backoff, and one that cannot import the handler stops the Worker
  (:class:`~emqfast.errors.HandlerNotImportable`) instead of spinning;
- **shutdown keeps its word**: after ``shutdown_timeout_s`` the children still running
  handlers are killed and their jobs go back to the queue (no attempt counted), never
  while a child that could still finish is alive.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import queue as queue_mod
import struct
import tempfile
import socket
import subprocess
import threading
import time
from multiprocessing.connection import Connection
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

from emqfast.core import errors
from emqfast.core.validation import check_int
from emqfast.facade.job import Job
from emqfast.worker import child as child_mod
from emqfast.worker.cancels import timeout_ms_of
from emqfast.worker.outcomes import Done, Failed, Outcome, failure, job_group
from emqfast.worker.resend import Backoff

log = logging.getLogger("emqfast.worker")

READY_TIMEOUT_S = 60.0  # a child that has not imported its handler by then is a failure
YOUNG_S = 2.0  # a child dying sooner than this after its start: restarts back off
START_TRIES = 5  # a replacement dying as it starts this often in a row stops the Worker
EXIT_WAIT_S = 5.0  # a retired child's time to leave after "exit", then it is killed
RELEASED = ("shutdown", "beside")  # why a killed child's job goes back unrun
# Jobs a child may hold queued beyond its busy threads: the next one is there as one ends
# (no round trip between jobs, and no wait for this process's GIL). A timed job queued
# there is reported as it begins: its timeout counts from then.
QUEUED = 32
QUEUE_BUDGET_S = 0.002


def check_processes(processes: Optional[int], concurrency: Optional[int],
                    max_jobs_per_child: Optional[int], max_memory_per_child_mb: Optional[int]
                    ) -> Optional[Dict[str, Any]]:
    """The process executor's options, checked (typed errors), as :class:`ProcessPool`
    takes them; None when handlers run in threads (``processes`` None)."""
    if processes is None:
        if (max_jobs_per_child, max_memory_per_child_mb) != (None, None):
            raise errors.InvalidInput("max_jobs_per_child and max_memory_per_child_mb need "
                                      "processes=N")
        return None
    check_int(processes, "processes", 1, 1024)
    threads = 1 if concurrency is None else check_int(concurrency, "concurrency", 1, 10_000)
    if max_jobs_per_child is not None:
        check_int(max_jobs_per_child, "max_jobs_per_child", 1, 1 << 40)
    if max_memory_per_child_mb is not None:
        check_int(max_memory_per_child_mb, "max_memory_per_child_mb", 1, 1 << 30)
    return dict(processes=processes, threads=threads, max_jobs_per_child=max_jobs_per_child,
                max_memory_per_child_mb=max_memory_per_child_mb)


def exit_text(code: Optional[int]) -> str:
    """A child's exit status in words: ``signal 9 (SIGKILL)``, ``code 1``."""
    if code is None:
        return "an unknown status"
    if code < 0:
        import signal
        try:
            return f"signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


class _Child:
    """One supervised child: its process, pipe, and the runs it holds (job id ->
    ``(job, token, began)``)."""

    def __init__(self, index: int, process: Any, conn: Any, begun: "mmap.mmap"):
        self.index, self.process, self.conn = index, process, conn
        self.pid: int = process.pid
        # what goes to the child: its sender thread writes it, so no caller (the claim
        # loop, a reader, the timer thread) ever waits on a child that reads no more (a
        # handler holding its GIL): the pipe fills, and only that thread waits
        self._outbox: "queue_mod.SimpleQueue[Optional[bytes]]" = queue_mod.SimpleQueue()
        self.gone = False  # its pipe broke: nothing more is sent
        # job id -> (job, token, its place in the order sent): jobs begin in that order
        self.inflight: Dict[str, Tuple[Job, str, int]] = {}
        self.sent = 0
        self.begun = begun  # shared with the child: how many jobs it took (may have begun)
        self.kills: Dict[str, str] = {}  # token -> why its child was killed
        self.jobs_run = 0
        self.started_at = time.monotonic()
        self.retiring = False  # recycled: takes no more jobs, leaves when it is empty
        self.replaced = False  # its successor started: its death needs no replacement
        self.reader: Optional[threading.Thread] = None

    def taken(self) -> int:
        """How many jobs the child took to run, as it wrote before calling each handler
        (read after it died: exact, whatever it managed to send)."""
        try:
            return int(struct.unpack_from("<Q", self.begun, 0)[0])
        except ValueError:  # closed: the child is gone and its runs settled
            return 0

    def send(self, message: bytes) -> bool:
        """Queue one message for the child (sent in order, never waited for); False when
        the child is gone (its reader settles its runs)."""
        if self.gone:
            return False
        self._outbox.put(message)
        return True

    def start_sending(self) -> None:
        threading.Thread(target=self._send_loop, daemon=True,
                         name=f"emq-handler-{self.index}-sender").start()

    def stop_sending(self) -> None:
        """The child is gone (its reader ended): its sender ends too."""
        self.gone = True
        self._outbox.put(None)

    def _send_loop(self) -> None:
        while True:
            message = self._outbox.get()
            if message is None:
                return
            try:
                self.conn.send_bytes(message)
            except (OSError, ValueError):  # killed or exited: its reader settles its runs
                self.gone = True
                return


class ProcessPool:
    """The children of one Worker and what they run. ``worker`` is the thread Worker
    (its ``_ready`` jobs, its ``_process_run_ended`` / ``_release_runs`` /
    ``_extend_run`` / ``_progress_run``)."""

    def __init__(self, worker: Any, handler: Callable[..., Any], processes: int,
                 threads: int, *, max_jobs_per_child: Optional[int],
                 max_memory_per_child_mb: Optional[int]):
        self._worker = worker
        self.path = child_mod.handler_path(handler)
        self.processes, self.threads = processes, threads
        self.max_jobs = max_jobs_per_child
        self.max_rss_kb = None if max_memory_per_child_mb is None \
            else max_memory_per_child_mb * 1024
        self._children: List[Optional[_Child]] = [None] * processes
        self._where: Dict[str, _Child] = {}  # running job id -> its child
        self._readers: "set[threading.Thread]" = set()  # (a dead child's may be replacing it)
        self._lock = threading.Lock()
        self._closing = False
        self._closed = threading.Event()  # set with _closing by close(): backoffs end
        self.killing = False  # the shutdown's kill was done (once per run)
        self._backoff = Backoff(0.1, 5.0)
        self._spawner = _Spawner()
        # restarts, crashes, recycled, and kills by reason ("kill:timeout", ...)
        self.counts: "Counter[str]" = Counter()

    # --- starting and stopping children ------------------------------------------------
    def start(self) -> None:
        """Start every child and wait until each has imported the handler; raise
        :class:`~emqfast.errors.HandlerNotImportable` (children stopped) if one cannot."""
        self._closing = self.killing = False
        self._closed.clear()
        self._spawner.open()
        pending = [self._spawn() for _ in range(self.processes)]
        try:
            for index, started in enumerate(pending):
                self._install(self._await_ready(index, *started))
        except BaseException:
            self._closing = True
            for process, conn, _ in pending:
                _kill(process)
                conn.close()
            self._spawner.close()
            raise

    def _spawn(self) -> Tuple[Any, Any, "mmap.mmap"]:
        """Start a child from the spawner thread (see :class:`_Spawner`)."""
        started: Tuple[Any, Any, "mmap.mmap"] = self._spawner.call(self._start_process)
        return started

    def _start_process(self) -> Tuple[Any, Any, "mmap.mmap"]:
        """A fresh interpreter running :func:`emqfast.worker.child.main` (no lock or thread
        of the Worker inherited, no main script re-run unless the handler lives there),
        our end of its socket, and the 8 bytes of memory it shares with us (the count of
        jobs it took: :meth:`_Child.taken`)."""
        ours, theirs = socket.socketpair()
        with theirs, tempfile.TemporaryFile() as shared:
            shared.truncate(8)
            begun = mmap.mmap(shared.fileno(), 8)
            process = subprocess.Popen(
                child_mod.command(self.path, self.threads, theirs.fileno(), shared.fileno()),
                pass_fds=(theirs.fileno(), shared.fileno()), stdin=subprocess.DEVNULL,
                env=child_mod.environment())
        return process, Connection(ours.detach()), begun

    def _await_ready(self, index: int, process: Any, conn: Any,
                     begun: "mmap.mmap") -> _Child:
        """The started child, once it said ``ready``; HandlerNotImportable otherwise."""
        why = f"did not start within {READY_TIMEOUT_S:.0f} s"
        try:
            if conn.poll(READY_TIMEOUT_S):
                header, _ = child_mod.decode(conn.recv_bytes())
                if header["k"] == "ready":
                    return _Child(index, process, conn, begun)
                why = "could not import it:\n" + header.get("tb", "")
        except (EOFError, OSError):
            why = f"exited with {exit_text(_wait(process))} as it started"
            _discard(process, conn, begun)
            raise _DiedStarting(f"handler process for {self.path} {why}") from None
        _discard(process, conn, begun)
        raise errors.HandlerNotImportable(f"handler process for {self.path} {why}")

    def _install(self, child: _Child) -> None:
        self._children[child.index] = child
        child.reader = threading.Thread(target=self._read, args=(child,), daemon=True,
                                        name=f"emq-handler-{child.index}-reader")
        self._readers.add(child.reader)
        child.start_sending()
        child.reader.start()

    def close(self) -> None:
        """Ask every child to exit (their jobs ended), kill those that do not, and wait for
        their readers (a dead child's too: it may be starting a replacement, which it
        kills instead of installing once it sees the pool closing)."""
        with self._lock:  # (a replacement is installed under it, unless closing)
            self._closing = True
            children = [c for c in self._children if c is not None]
        self._closed.set()
        exit_message = child_mod.encode({"k": "exit"})
        for child in children:
            child.send(exit_message)
        deadline = time.monotonic() + EXIT_WAIT_S
        for child in children:
            _wait(child.process, deadline - time.monotonic())
            _kill(child.process)
        self._spawner.close()  # (a child still starting dies with its thread)
        for reader in list(self._readers):
            if reader is not threading.current_thread():
                reader.join(max(deadline - time.monotonic(), 0.5))

    def kill_running(self, why: str = "shutdown") -> int:
        """Kill every child running a handler (the shutdown bound passed, or a second
        signal): their jobs go back to the queue, no attempt counted. How many."""
        self._closing = True
        killed = 0
        for child in list(self._children):
            if child is not None and child.inflight:
                for _, token, _ in list(child.inflight.values()):
                    child.kills.setdefault(token, why)
                self.counts[f"kill:{why}"] += 1
                _kill(child.process, wait=False)
                killed += 1
        return killed

    # --- handing out jobs ----------------------------------------------------------------
    def dispatch(self) -> None:
        """Send the Worker's ready jobs to children, in order: first to free handler
        threads, then queued in the children as deep as their handlers' speed makes worth
        it (a queued job should start within ~2 ms; slow handlers queue nothing)."""
        ready = self._worker._ready
        if not ready:
            return
        undecodable: List[Tuple[Job, str]] = []
        with self._lock:
            live = [c for c in self._children if c is not None and not c.retiring]
            out: Dict[_Child, List[Tuple[Job, str, bool]]] = {c: [] for c in live}
            for depth in (self.threads, self.threads + self._queue_depth()):
                for child in live:  # round robin: one job per child per pass
                    while ready and self._room(child, len(out[child])) and \
                            len(child.inflight) + len(out[child]) < depth:
                        job, token = ready.popleft()
                        if job._undecodable is not None:  # (its payload: the raw bytes)
                            undecodable.append((job, token))
                            continue
                        out[child].append((job, token, depth > self.threads))
            for child, jobs in out.items():
                if jobs:
                    self._send_jobs(child, jobs)
        for job, token in undecodable:  # fails for good, its handler never runs (as in
            error = job._undecodable    # a handler thread)
            assert error is not None
            self._worker._process_run_ended(0, failure(job, token, error, ""), 0.0)

    def _queue_depth(self) -> int:
        avg = self._worker._holding.handler_s
        return 0 if avg is None else min(QUEUED, int(QUEUE_BUDGET_S / max(avg, 1e-7)))

    def _room(self, child: _Child, adding: int) -> bool:
        """``child`` may take one more job (it is not due for recycling by job count)."""
        return self.max_jobs is None or child.sent + adding < self.max_jobs

    def _send_jobs(self, child: _Child, jobs: List[Tuple[Job, str, bool]]) -> None:
        """Send ``jobs`` to ``child`` in one message (under the pool's lock). A timed job
        sent to a free thread starts its clock now; one queued there, when the child says
        it began."""
        timeout_of, default = timeout_ms_of, self._worker.job_timeout_ms
        frames, timed_now = [], []
        for job, token, queued in jobs:
            timed = timeout_of(job, default) is not None
            child.inflight[job.id] = (job, token, child.sent)
            child.sent += 1
            self._where[job.id] = child
            frames.append(child_mod.job_frame(job, token, child.sent - 1, timed and queued))
            if timed and not queued:
                timed_now.append((job, token))
        if not child.send(child_mod.bundle(frames)):
            return  # dead: its reader settles what it held (none of these began)
        now = time.monotonic()
        for job, token in timed_now:
            self._worker._arm_timeout(job, token, now)

    def ask_stop(self, job_id: str, token: str, reason: str) -> None:
        """Tell the child running ``job_id`` that it was asked to stop (``job.cancelled``)."""
        child = self._where.get(job_id)
        if child is not None:
            child.send(child_mod.encode({"k": "stop", "id": job_id, "tok": token,
                                         "why": reason}))

    def kill_for(self, job_id: str, token: str, reason: str) -> Optional[bool]:
        """The grace after a stop passed and ``job_id`` still runs: kill its child. Jobs
        beside it in that child go back to the queue. False when it ended meanwhile;
        None when it waits in its child, not begun (the child stops it as it begins:
        killing would end the handlers it runs now for nothing)."""
        child = self._where.get(job_id)
        if child is None:
            return False
        with self._lock:
            run = child.inflight.get(job_id)
            if run is None or run[1] != token:
                return False
            if run[2] >= child.taken():
                return None
            child.kills[token] = reason
            for _, other, _ in child.inflight.values():
                child.kills.setdefault(other, "beside")
        self.counts[f"kill:{reason}"] += 1
        log.warning("%s: job %r did not stop within cancel_grace_ms of its %s: killing its "
                    "handler process (pid %d)", self._worker._who, job_id, reason, child.pid)
        _kill(child.process, wait=False)
        return True

    # --- a child's reader thread ---------------------------------------------------------
    def _read(self, child: _Child) -> None:
        """Take the child's messages until it is gone, then settle what it held and
        replace it."""
        try:
            while True:
                try:
                    message = child_mod.decode(child.conn.recv_bytes())
                except (EOFError, OSError):
                    break
                for header, body in child_mod.unbundle(*message):
                    self._take(child, header, body)
                self.dispatch()
        finally:
            try:
                self._died(child)
            finally:
                self._readers.discard(threading.current_thread())

    def _take(self, child: _Child, header: Dict[str, Any], body: bytes) -> None:
        """One message from ``child``."""
        kind = header["k"]
        if kind in ("done", "fail"):
            self._ended(child, header, body)
        elif kind == "began":  # a timed job that waited in the child: its clock starts
            run = child.inflight.get(header["id"])
            if run is not None:
                self._worker._arm_timeout(run[0], run[1], time.monotonic())
        elif kind in ("extend", "progress"):
            self._answer(child, header, body)

    def _ended(self, child: _Child, header: Dict[str, Any], body: bytes) -> None:
        with self._lock:
            run = child.inflight.pop(header["id"], None)
            if run is not None and self._where.get(header["id"]) is child:
                del self._where[header["id"]]
        if run is None:
            return
        job, token, _ = run
        child.kills.pop(token, None)
        outcome: Outcome = Done(job, token, body) if header["k"] == "done" else \
            Failed(job, token, _remote(header["t"], header["m"]), header["tb"],
                   header["retry"])
        child.jobs_run += 1
        worn = child.retiring or self._worn_out(child)
        if worn:  # before its slot is free: a job handed out then must not go to it
            with self._lock:
                child.retiring = True
        # the handler's own time (not its wait in the child's queue): the Worker sizes
        # how many jobs it starts ahead from it
        self._worker._process_run_ended(child.index, outcome, header["s"])
        if worn:
            self._retire(child)

    def _answer(self, child: _Child, header: Dict[str, Any], body: bytes) -> None:
        """A handler's ``job.extend_lease`` / ``job.progress``: performed under its run's
        token, answered with the error it raised, if any."""
        reply: Dict[str, Any] = {"k": "re", "n": header["n"]}
        try:
            if header["k"] == "extend":
                self._worker._extend_run(header["id"], header["tok"], header["ms"])
            else:
                self._worker._progress_run(header["id"], header["tok"],
                                           json.loads(body))
        except Exception as exc:  # noqa: BLE001 - raised in the handler instead
            reply.update(t=type(exc).__name__, m=str(exc))
        child.send(child_mod.encode(reply))

    def _died(self, child: _Child) -> None:
        """The child is gone: settle each run it held by why it died, then replace it."""
        code = _wait(child.process)
        child.stop_sending()
        with self._lock:
            held, child.inflight = child.inflight, {}
            for job_id in held:
                if self._where.get(job_id) is child:
                    del self._where[job_id]
            if self._children[child.index] is child:
                self._children[child.index] = None
        taken = child.taken()
        child.begun.close()
        back: List[Tuple[str, str, Optional[str]]] = []
        stops = self._worker._stops
        for job, token, place in held.values():
            why = child.kills.get(token)
            # a run asked to stop ends by its stop (its outcome below is replaced by the
            # stop's); others killed beside one, or never begun, go back unrun
            if token not in stops and (why in RELEASED or place >= taken):
                back.append((job.id, token, job_group(job)))
                continue
            if why is None:
                log.error("%s: handler process (pid %d) exited with %s while running job "
                          "%r", self._worker._who, child.pid, exit_text(code), job.id)
            crash = errors.WorkerCrashed(f"child exited with {exit_text(code)} while "
                                         f"running {job.id}")
            self._worker._process_run_ended(child.index, Failed(job, token, crash, "", True),
                                            0.0, free=False)
        if any(p < taken and t not in child.kills for _, t, p in held.values()):
            self.counts["crash"] += 1  # a death of its own (once, whatever it held)
        if back:
            self._worker._release_runs(child.index, back)
        if not self._closing and not child.replaced:
            by_itself = not held or any(t not in child.kills for _, t, p in held.values()
                                        if p < taken)
            self._replace(child, by_itself)
        # the slots come back once the replacement runs (or the pool is closing)
        self._worker._slots_free(child.index, len(held) - len(back))

    # --- replacing children ------------------------------------------------------------
    def _worn_out(self, child: _Child) -> bool:
        """Recycle after ``max_jobs_per_child`` jobs, or once its RSS passed the limit."""
        if self.max_jobs is not None and child.jobs_run >= self.max_jobs:
            self.counts["recycled:jobs"] += 1
            return True
        if self.max_rss_kb is not None and (rss_kb(child.pid) or 0) > self.max_rss_kb:
            self.counts["recycled:memory"] += 1
            return True
        return False

    def _retire(self, child: _Child) -> None:
        """Recycle ``child``: it takes no more jobs; once the ones it runs ended, a
        replacement starts, then it leaves."""
        with self._lock:
            child.retiring = True
            if child.inflight:
                return  # (checked again as each of its jobs ends)
        child.replaced = True
        self._replace(child)
        if child.send(child_mod.encode({"k": "exit"})):
            threading.Thread(target=_reap, args=(child.process,), daemon=True).start()

    def _replace(self, old: _Child, died_by_itself: bool = False) -> None:
        """Start the child that takes ``old``'s place (backing off while children die
        young by themselves); an import failure stops the Worker."""
        if died_by_itself and time.monotonic() - old.started_at < YOUNG_S:
            self._closed.wait(self._backoff())
        else:
            self._backoff.reset()
        died = 0
        while not self._closing:
            try:
                new = self._await_ready(old.index, *self._spawn())
            except (errors.HandlerNotImportable, OSError) as exc:
                if self._closing:  # the pool closed while it started (its spawner gone)
                    return
                died += isinstance(exc, _DiedStarting)
                if isinstance(exc, _DiedStarting) and died < START_TRIES:
                    # killed as it started (the OOM killer, a signal), not an import
                    # error (which says so): started again, with backoff
                    log.error("%s: %s; starting another", self._worker._who, exc)
                    self._closed.wait(self._backoff())
                    continue
                if isinstance(exc, errors.HandlerNotImportable):
                    log.error("%s: %s; stopping", self._worker._who, exc)
                    self._worker._fail_fatally(exc)
                    return
                # out of processes or memory: try again later
                log.error("%s: cannot start a handler process (%s)", self._worker._who, exc)
                self._closed.wait(self._backoff())
                continue
            with self._lock:  # close() took the children under it: installed, or killed
                closing = self._closing
                if not closing:
                    self.counts["restarts"] += 1
                    self._install(new)
            if closing:
                _kill(new.process)
                new.conn.close()
                new.begun.close()
                return
            self.dispatch()
            return

    # --- what the Worker reports ----------------------------------------------------------
    def report(self) -> Dict[str, Any]:
        """The children now (pid, jobs run, RSS in KiB, the jobs they run) and the
        counters: for the Worker's heartbeat record."""
        with self._lock:  # (readers change what the children hold)
            held = [(c, list(c.inflight.values())) for c in self._children if c is not None]
        children = []
        for c, runs in held:
            taken = c.taken()  # the jobs it began (its handlers run them); the rest queue
            children.append({"pid": c.pid, "jobs": c.jobs_run, "rss_kb": rss_kb(c.pid),
                             "running": [job.id for job, _, place in runs if place < taken],
                             "held": len(runs)})
        return {"children": children, "child_events": dict(self.counts)}


class _Spawner:
    """The one thread that starts children. On Linux a child is killed when the *thread*
    that started it ends (``PR_SET_PDEATHSIG``): children started from a reader thread,
    which ends with its child, would die at once. This thread lives as long as the pool."""

    def __init__(self) -> None:
        self._requests: "queue_mod.SimpleQueue[Any]" = queue_mod.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()  # no request queued behind close()'s sentinel

    def open(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="emq-handler-spawner")
                self._thread.start()

    def close(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._requests.put(None)
        if thread is not None:
            thread.join(EXIT_WAIT_S)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()`` run on the spawner thread; its error raised here (OSError once the
        spawner is closed: nothing would ever answer)."""
        answer: "queue_mod.SimpleQueue[Tuple[bool, Any]]" = queue_mod.SimpleQueue()
        with self._lock:
            if self._thread is None:
                raise OSError("the handler processes are closing")
            self._requests.put((fn, answer))
        ok, value = answer.get()
        if not ok:
            raise value
        return value

    def _serve(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                return
            fn, answer = request
            try:
                answer.put((True, fn()))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                answer.put((False, exc))


class _DiedStarting(errors.HandlerNotImportable):
    """A child that exited before it said whether it imported the handler."""


def rss_kb(pid: int) -> Optional[int]:
    """The resident memory of process ``pid`` in KiB (Linux's /proc), else None."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except (OSError, ValueError, IndexError):
        return None


_REMOTE: Dict[str, type] = {}


def _remote(name: str, message: str) -> BaseException:
    """An exception raised in a child, rebuilt for the outcome's record: the same type
    name and message (``"ValueError: bad input"``), never the unpickled object."""
    known = getattr(errors, name, None)
    if isinstance(known, type) and issubclass(known, BaseException):
        return known(message)
    cls = _REMOTE.get(name)
    if cls is None:
        cls = _REMOTE[name] = type(name, (Exception,), {"__module__": "emqfast.remote"})
    error: BaseException = cls(message)
    return error


def _discard(process: "subprocess.Popen[bytes]", conn: Any, begun: "mmap.mmap") -> None:
    """A child that failed to start: killed, reaped, its pipe and memory closed."""
    _kill(process)
    conn.close()
    begun.close()


def _wait(process: "subprocess.Popen[bytes]", seconds: float = EXIT_WAIT_S) -> Optional[int]:
    """The child's exit status once it exited (negative: the signal), waiting up to
    ``seconds``; None while it runs."""
    try:
        return process.wait(max(seconds, 0.0))
    except subprocess.TimeoutExpired:
        return None


def _kill(process: "subprocess.Popen[bytes]", wait: bool = True) -> None:
    if process.poll() is None:
        try:
            process.kill()
        except OSError:  # exited meanwhile
            pass
    if wait:
        _wait(process)


def _reap(process: "subprocess.Popen[bytes]") -> None:
    """A retired child: give it its time to leave, then kill it."""
    _wait(process)
    _kill(process)
