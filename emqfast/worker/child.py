"""A handler process of :class:`emqfast.Worker` ``(processes=N)``: what runs inside each
supervised child, and the messages it trades with the Worker over its pipe.

The Worker (the parent: :mod:`emqfast.worker.processes`) claims, leases, acks and beats;
a child only runs handlers. Messages are frames of a JSON header and raw bytes: a job's
payload goes as the bytes emqfast stores (JSON text, or the raw bytes of a bytes payload)
and a result comes back as the bytes complete.lua writes. Nothing is pickled.

Parent -> child: ``run`` (a job, its payload as the body), ``stop`` (``job.cancelled``
turns True; an async handler's task is cancelled), ``re`` (the answer to an
``extend``/``progress`` request), ``exit``.
Child -> parent: ``ready`` / ``fatal`` (the handler imported, or why not), ``done``
(the result as the body), ``fail`` (type, message, traceback, whether it may retry),
``extend`` / ``progress`` (``job.extend_lease`` / ``job.progress`` from a handler: the
parent performs them with the run's lease token and answers ``re``).

A child dies with its Worker: on Linux the kernel kills it when its parent goes
(``PR_SET_PDEATHSIG``), and everywhere the pipe's end ends its read loop.
"""
from __future__ import annotations

import asyncio
import base64
import ctypes
import importlib
import json
import mmap
import os
import queue as queue_mod
import signal
import struct
import sys
import threading
import time
import traceback
import types
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, List, Optional, Tuple

from emqfast.core import codec, errors
from emqfast.core.errors import PayloadError, Unrecoverable
from emqfast.facade.job import Job
from emqfast.facade.options import Backoff

Frame = Tuple[Dict[str, Any], bytes]


def encode(header: Dict[str, Any], body: bytes = b"") -> bytes:
    """One message: the JSON header, a newline, then ``body`` as it is."""
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + body


def decode(message: bytes) -> Frame:
    """``(header, body)`` of a message :func:`encode` made."""
    cut = message.index(b"\n")
    return json.loads(message[:cut]), message[cut + 1:]


def bundle(frames: List[Frame]) -> bytes:
    """Several messages as one (one write, one wake-up and one JSON parse for the
    reader): a ``many`` header holding their headers and body sizes, then the bodies one
    after another."""
    if len(frames) == 1:
        return encode(*frames[0])
    return encode({"k": "many", "h": [h for h, _ in frames], "n": [len(b) for _, b in frames]},
                  b"".join(b for _, b in frames))


def unbundle(header: Dict[str, Any], body: bytes) -> List[Frame]:
    """The messages of a ``many`` message (see :func:`bundle`), or the one message."""
    if header["k"] != "many":
        return [(header, body)]
    out, at = [], 0
    for part, size in zip(header["h"], header["n"]):
        out.append((part, body[at:at + size]))
        at += size
    return out

def handler_path(handler: Callable[..., Any]) -> str:
    """``module:qualname`` of a handler a child can import again; typed refusal
    (:class:`~emqfast.errors.InputTypeError`) for lambdas, closures and bound objects."""
    module = getattr(handler, "__module__", None)
    qualname = getattr(handler, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        raise errors.InputTypeError(
            f"processes=N runs the handler in child processes, which import it by name: "
            f"{handler!r} has none (a lambda, a closure or a callable object?). Use a "
            "function defined at the top level of a module, or give its import path "
            "('package.module:function')")
    return f"{module}:{qualname}"


def resolve(path: str, main: str = "") -> Callable[..., Any]:
    """The handler at ``module:qualname``. ``__main__`` is the Worker's main module:
    ``main`` names it (a module name, or a script's path, run here as ``__mp_main__``, as
    multiprocessing does: its ``if __name__ == "__main__":`` part does not run)."""
    module_name, _, qualname = path.partition(":")
    if not qualname:
        raise errors.InvalidInput(f"handler path {path!r} is not 'module:function'")
    if module_name != "__main__":
        target: Any = importlib.import_module(module_name)
    elif main.endswith(".py") or os.sep in main:
        import runpy
        target = types.SimpleNamespace(**runpy.run_path(main, run_name="__mp_main__"))
    elif main:
        target = importlib.import_module(main)
    else:
        raise errors.InvalidInput("the handler is defined in an interactive session: "
                                  "define it in a module the handler processes can import")
    for part in qualname.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise errors.InputTypeError(f"{path} is not callable")
    return target  # type: ignore[no-any-return]


# A JSON payload re-encoded for the child: whatever json.loads read from the stored text
# (NaN, an overflowing number, a lone surrogate escape, which another writer may have
# stored and emqfast's strict encoder refuses) is written back as json.loads reads it.
_payload_json = json.JSONEncoder(separators=(",", ":")).encode


def job_frame(job: Job, token: str, place: int, say_begin: bool = False) -> Frame:
    """The ``run`` message of a started job (its payload re-encoded as stored), the
    ``place``-th sent to this child; ``say_begin``: the child sends ``began`` as its
    handler starts."""
    payload = job.payload
    is_bytes = isinstance(payload, (bytes, bytearray))
    body = bytes(payload) if is_bytes else _payload_json(payload).encode()
    backoff = job.backoff
    header = {"k": "run", "id": job.id, "tok": token, "q": job.queue, "a": job.attempts,
              "ma": job.max_attempts, "pr": job.priority,
              "bo": None if backoff is None else [backoff.kind, backoff.base_ms,
                                                  backoff.cap_ms, backoff.band, backoff.full],
              "c": job.created_ms, "r": job.run_at_ms, "s": job.started_ms, "x": job.extra,
              "b": is_bytes, **_wire_results(job._dep_results), "stop": job._stop_reason,
              "sb": say_begin, "p": place}
    return header, body


def _wire_results(results: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A job's dependency results for the JSON header: ``dr`` the JSON ones, ``drb`` the
    bytes ones (a dependency that returned bytes), base64."""
    if not results or not any(isinstance(v, bytes) for v in results.values()):
        return {"dr": results}
    return {"dr": {k: v for k, v in results.items() if not isinstance(v, bytes)},
            "drb": {k: base64.b64encode(v).decode() for k, v in results.items()
                    if isinstance(v, bytes)}}


def _job_of(header: Dict[str, Any], body: bytes) -> Job:
    bo = header["bo"]
    job = Job(id=header["id"], queue=header["q"], state="active",
              payload=body if header["b"] else codec.decode(body, b"j"),
              attempts=header["a"], max_attempts=header["ma"], priority=header["pr"],
              backoff=None if bo is None else Backoff(*bo), created_ms=header["c"],
              run_at_ms=header["r"], started_ms=header["s"], extra=header["x"] or {})
    job._dep_results = header["dr"]
    if "drb" in header:
        job._dep_results = {**header["dr"], **{k: base64.b64decode(v)
                                               for k, v in header["drb"].items()}}
    job._run_token = header["tok"]
    job._stop_reason = header["stop"]  # stopped before it began: its handler never runs
    return job


class _Hooks:
    """``Job._run`` in a child: ``job.extend_lease`` / ``job.progress`` go to the Worker,
    which performs them under the run's lease token and answers."""

    is_async = True  # both twins work: the awaitable ones off the handler's loop

    def __init__(self, child: "Child"):
        self._child = child

    def extend(self, job_id: str, token: Optional[str], ms: int) -> None:
        self._child.ask({"k": "extend", "id": job_id, "tok": token, "ms": ms})

    def progress(self, job_id: str, token: Optional[str], value: Any) -> None:
        self._child.ask({"k": "progress", "id": job_id, "tok": token},
                        codec.encode_result(value))

    def extend_async(self, job_id: str, token: Optional[str], ms: int) -> Any:
        return asyncio.get_running_loop().run_in_executor(
            None, self.extend, job_id, token, ms)

    def progress_async(self, job_id: str, token: Optional[str], value: Any) -> Any:
        return asyncio.get_running_loop().run_in_executor(
            None, self.progress, job_id, token, value)


class Child:
    """The child's loop: its main thread reads the pipe and routes each message; up to
    ``threads`` handler threads run jobs (a coroutine handler in an event loop of its
    thread's own)."""

    def __init__(self, conn: Any, handler: Callable[..., Any], threads: int,
                 begun: Optional[mmap.mmap] = None):
        self._conn, self._handler = conn, handler
        # shared with the Worker: how many jobs were taken (by their place in the order
        # sent), written before each handler is called, so after a crash the Worker knows
        # which jobs may have begun (their attempt counts) and which never did
        self._begun, self._taken = begun, 0
        # what goes to the Worker: one sender thread writes whatever has gathered as
        # one message, so a busy child costs the Worker one read per batch, not per job
        self._outbox: "queue_mod.SimpleQueue[Optional[Frame]]" = queue_mod.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, daemon=True,
                                        name="emq-child-sender")
        self._jobs: "queue_mod.SimpleQueue[Optional[Tuple[Dict[str, Any], bytes]]]" = \
            queue_mod.SimpleQueue()
        self._running: Dict[str, Tuple[Job, Optional[asyncio.AbstractEventLoop],
                                       Optional["asyncio.Task[Any]"]]] = {}
        self._answers: Dict[int, "queue_mod.SimpleQueue[Frame]"] = {}
        # stops that came before their run began: (id, token) -> reason
        self._early: Dict[Tuple[str, str], str] = {}
        self._asked = 0
        self._lock = threading.Lock()
        self._hooks = _Hooks(self)
        self._threads = [threading.Thread(target=self._run_jobs, daemon=True,
                                          name=f"emq-child-{i}") for i in range(threads)]

    def send(self, header: Dict[str, Any], body: bytes = b"") -> None:
        """Queue one message for the Worker (sent in order by the sender thread)."""
        self._outbox.put((header, body))

    def _send_loop(self) -> None:
        get, more = self._outbox.get, self._outbox.get_nowait
        while True:
            first = get()
            if first is None:
                return
            batch = [first]
            try:
                while len(batch) < 256:
                    item = more()
                    if item is None:
                        self._outbox.put(None)
                        break
                    batch.append(item)
            except queue_mod.Empty:
                pass
            try:
                self._conn.send_bytes(bundle(batch))
            except OSError:
                os._exit(0)  # the Worker is gone

    def ask(self, header: Dict[str, Any], body: bytes = b"") -> None:
        """Send a request to the Worker and wait for its answer; its error raised here."""
        answer: "queue_mod.SimpleQueue[Frame]" = queue_mod.SimpleQueue()
        with self._lock:
            self._asked += 1
            header["n"] = n = self._asked
            self._answers[n] = answer
        self.send(header, body)
        reply, _ = answer.get()
        if "t" in reply:
            raise getattr(errors, reply["t"], RuntimeError)(reply["m"])

    def serve(self) -> None:
        """Read and route messages until ``exit`` or the Worker's end of the pipe closes."""
        self._sender.start()
        for thread in self._threads:
            thread.start()
        try:
            while self._route(*decode(self._conn.recv_bytes())):
                pass
        except (EOFError, OSError):
            os._exit(0)  # the Worker is gone: nothing left to report to
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._outbox.put(None)  # after the last outcome
        self._sender.join()

    def _route(self, header: Dict[str, Any], body: bytes) -> bool:
        """Act on one message from the Worker; False: ``exit``."""
        for header, body in unbundle(header, body):
            kind = header["k"]
            if kind == "run":
                self._jobs.put((header, body))
            elif kind == "stop":
                self._stop(header["id"], header["tok"], header["why"])
            elif kind == "re":
                with self._lock:
                    waiting = self._answers.pop(header["n"], None)
                if waiting is not None:
                    waiting.put((header, body))
            elif kind == "exit":
                return False
        return True

    def _stop(self, job_id: str, token: str, reason: str) -> None:
        with self._lock:
            entry = self._running.get(job_id)
            if entry is None or entry[0]._run_token != token:
                if len(self._early) > 1000:  # stops of runs that ended meanwhile
                    self._early.clear()
                self._early[job_id, token] = reason
                return
        job, loop, task = entry
        job._stop_reason = reason
        if loop is not None and task is not None:
            loop.call_soon_threadsafe(task.cancel)

    def _run_jobs(self) -> None:
        loop: Optional[asyncio.AbstractEventLoop] = None
        while True:
            item = self._jobs.get()
            if item is None:
                if loop is not None:
                    loop.close()
                return
            header, body = item
            self._take(header["p"])
            job = _job_of(header, body)
            job._run = self._hooks
            if header["sb"]:
                self.send({"k": "began", "id": job.id})
            with self._lock:
                self._running[job.id] = (job, None, None)
                early = self._early.pop((job.id, job._run_token or ""), None)
                job._stop_reason = job._stop_reason or early
            began = time.perf_counter()
            try:
                job.raise_if_cancelled()  # stopped before it began: never handed to it
                result = self._handler(job)
                if asyncio.iscoroutine(result):
                    loop = loop or asyncio.new_event_loop()
                    result = self._await(loop, job, result)
                body = codec.encode_handler_result(result) if result is not None else b"null"
            except BaseException as exc:  # noqa: BLE001 - a handler's failure is data
                self._report_failure(job, exc, time.perf_counter() - began)
            else:
                self._finish(job.id, {"k": "done", "id": job.id,
                                      "s": time.perf_counter() - began}, body)

    def _take(self, place: int) -> None:
        with self._lock:
            if place >= self._taken:
                self._taken = place + 1
                if self._begun is not None:
                    struct.pack_into("<Q", self._begun, 0, self._taken)

    def _await(self, loop: asyncio.AbstractEventLoop, job: Job, coro: Any) -> Any:
        task = loop.create_task(coro)
        with self._lock:
            self._running[job.id] = (job, loop, task)
        if job._stop_reason is not None:  # stopped while the task was being made
            task.cancel()
        return loop.run_until_complete(task)

    def _report_failure(self, job: Job, exc: BaseException, seconds: float) -> None:
        if isinstance(exc, asyncio.CancelledError) and job._stop_reason is not None:
            exc = errors.JobTimeout("timeout") if job._stop_reason == "timeout" \
                else errors.Cancelled(f"job {job.id} was cancelled")
        header = {"k": "fail", "id": job.id, "t": type(exc).__name__, "m": _text_of(exc),
                  "tb": traceback.format_exc(),
                  "retry": not isinstance(exc, (Unrecoverable, PayloadError)), "s": seconds}
        self._finish(job.id, header)

    def _finish(self, job_id: str, header: Dict[str, Any], body: bytes = b"") -> None:
        with self._lock:
            self._running.pop(job_id, None)
        self.send(header, body)


def _text_of(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of an exception whose ``__str__`` fails (the
    handler thread must report it, not die of it)."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 - any error of the handler's own class
        return f"<str() failed: {type(inner).__name__}>"


def _die_with_parent() -> None:
    """Linux: the kernel SIGKILLs this process when its parent dies (a Worker killed
    with -9 leaves no orphan running handlers)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


_SYS_PATH = "EMQFAST_CHILD_SYS_PATH"


def command(path: str, threads: int, fd: int, begun_fd: int) -> List[str]:
    """The command line starting a child of this process on socket ``fd``, counting the
    jobs it takes in the shared file ``begun_fd``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    main_ref = name if name and name != "__main__" else getattr(main, "__file__", "") or ""
    return [sys.executable, "-c", "from emqfast.worker.child import cli; cli()",
            str(fd), path, str(threads), str(os.getpid()), os.path.abspath(main_ref)
            if main_ref.endswith(".py") else main_ref, str(begun_fd)]


def environment() -> Dict[str, str]:
    """The child's environment: ours, and our import path (a handler importable here is
    importable there)."""
    return dict(os.environ, **{_SYS_PATH: json.dumps(sys.path)})


def cli() -> None:
    """The child's ``python -c`` entry (see :func:`command`)."""
    fd, path, threads, parent, main_ref, begun_fd = sys.argv[1:7]
    sys.path[:] = json.loads(os.environ.pop(_SYS_PATH, "[]")) or sys.path
    begun = mmap.mmap(int(begun_fd), 8)
    os.close(int(begun_fd))
    main(Connection(int(fd)), path, int(threads), int(parent), main_ref, begun)


def main(conn: Any, path: str, threads: int, parent_pid: int, main_ref: str = "",
         begun: Optional[mmap.mmap] = None) -> None:
    """A child's life: import the handler, say ``ready`` (or ``fatal`` with the
    traceback), then serve until told to exit or the Worker (``parent_pid``) is gone."""
    _die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(0)  # the Worker died before the death signal was armed
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the Worker's
    try:
        handler = resolve(path, main_ref)
    except BaseException:  # noqa: BLE001 - reported once, clearly, by the Worker
        conn.send_bytes(encode({"k": "fatal", "tb": traceback.format_exc(limit=8)}))
        return
    conn.send_bytes(encode({"k": "ready", "pid": os.getpid()}))
    Child(conn, handler, threads, begun).serve()


__all__: List[str] = []
