"""``emqfast worker MODULE:FUNCTION``: run a Worker for an importable handler."""
from __future__ import annotations

import importlib
import logging
import os
import shutil
import sys
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

import click

from emqfast.facade.partitioned import PartitionedQueue
from emqfast.facade.queue import Queue
from emqfast.tools.cli_state import current_state, err_console, scrub, url_option, verbose_option
from emqfast.tools.render import styled, visible


def import_handler(spec: str, verbose: bool = False) -> Callable[..., Any]:
    """``package.module:function`` (or ``module:Class.method`` for a static or class
    method) → the callable.

    The current directory is put on ``sys.path`` first, as ``python -m`` would. Any
    failure is one line naming the module and the error (a ``SyntaxError`` or an
    exception raised at import included); ``verbose`` prints the traceback first.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise click.BadParameter("expected MODULE:FUNCTION", param_hint="HANDLER")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    obj: Any = _import_module(module_name, verbose)
    owner: Any = None
    for part in attr.split("."):
        try:
            owner, obj = obj, getattr(obj, part)
        except AttributeError:
            raise click.BadParameter(f"{module_name!r} has no attribute {attr!r}",
                                     param_hint="HANDLER") from None
    if not callable(obj):
        raise click.BadParameter(f"{spec} is not callable", param_hint="HANDLER")
    _refuse_unbound_method(spec, owner, attr.split(".")[-1])
    handler: Callable[..., Any] = obj
    return handler


def _import_module(module_name: str, verbose: bool) -> Any:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, or whatever the module raised
        if verbose:
            err_console.print(visible(scrub(traceback.format_exc()), lines=True), markup=False,
                              highlight=False)
        where = ""
        if isinstance(exc, SyntaxError) and exc.filename:
            where = f" ({exc.filename}, line {exc.lineno})"
            exc = SyntaxError(exc.msg)
        detail = f"{type(exc).__name__}: {exc}{where}".strip()
        hint = "" if verbose or isinstance(exc, ModuleNotFoundError) else \
            " (run with --verbose for the traceback)"
        raise click.BadParameter(f"cannot import {module_name!r}: {detail}{hint}",
                                 param_hint="HANDLER") from None


def _refuse_unbound_method(spec: str, owner: Any, name: str) -> None:
    """``module:Class.method`` naming a plain (instance) method would fail every job with
    "missing 1 required positional argument": refuse it now, saying what to do."""
    if not isinstance(owner, type):
        return
    import inspect

    raw = inspect.getattr_static(owner, name, None)
    if inspect.isfunction(raw):  # not a staticmethod/classmethod: it needs an instance
        raise click.BadParameter(
            f"{spec} is an instance method: called with a job it has no instance "
            f"('self') to run on. Make it a @staticmethod or @classmethod, or name a "
            f"module-level function or instance (e.g. handler = {owner.__name__}().{name})",
            param_hint="HANDLER")


@click.command(short_help="Run a worker for MODULE:FUNCTION on --queue.")
@url_option
@click.argument("handler", metavar="MODULE:FUNCTION")
@click.option("--queue", "-q", "queue_names", required=True, multiple=True,
              help="Queue to work on; repeat it to serve several (-q high -q default -q low: "
                   "the first listed first, see --order).")
@click.option("--order", type=click.Choice(["strict", "weighted"]), default="strict",
              show_default=True,
              help="With several queues: strict serves a queue only while those listed "
                   "before it have nothing ready; weighted draws each claim round among "
                   "queues with work, in proportion to --weights.")
@click.option("--weights", default=None, metavar="W1,W2,...",
              help="With --order weighted: one positive integer per queue (default all 1).")
@click.option("--partitions", "partition_list", default=None, metavar="I,J,...",
              help="With one partitioned queue: serve only these partitions (numbers from "
                   "0; default all, in rotation).")
@click.option("--concurrency", "-c", default=None, type=click.IntRange(1, 10_000),
              help="Handlers running at once (default 8); with --processes, per process "
                   "(default 1).")
@click.option("--processes", "-p", default=None, type=click.IntRange(1, 1024),
              help="Run handlers in N supervised child processes, which a timeout, a "
                   "cancel or the shutdown timeout can kill, and whose crash fails only "
                   "its own job (the handler must be importable by name).")
@click.option("--max-jobs-per-child", default=None, type=click.IntRange(1), metavar="N",
              help="With --processes: replace a child after it ran N jobs.")
@click.option("--max-memory-per-child", "max_memory_mb", default=None, type=click.IntRange(1),
              metavar="MB", help="With --processes: replace a child whose resident memory "
                                 "passed MB (checked between jobs).")
@click.option("--lease-ms", default=30_000, show_default=True, type=click.IntRange(50),
              help="Lease per claimed job (extended while the handler runs).")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(0),
              help="Seconds running handlers get on SIGTERM/SIGINT. In threads (no "
                   "--processes) a handler cannot be killed: one still running is waited "
                   "for, its job never handed back while it may finish. With --processes "
                   "it is a bound: handlers still running are killed and their jobs go "
                   "back to the queue, no attempt counted.")
@click.option("--job-timeout-ms", default=None, type=click.IntRange(1),
              help="Stop a run that takes longer (jobs enqueued with their own timeout_ms "
                   "keep it): an async handler is cancelled, a sync one sees job.cancelled "
                   "(with --processes, its child is killed after --cancel-grace-ms); the "
                   "job fails with 'timeout' and retries per its attempts.")
@click.option("--cancel-grace-ms", default=None, type=click.IntRange(0),
              help="How long a stopped (cancelled or timed-out) handler may keep running "
                   "before its run is abandoned (with --processes: its child killed) and "
                   "its outcome written [default: 5000].")
@click.option("--allow-eviction", is_flag=True,
              help="Run even on a server whose maxmemory-policy may evict keys (jobs "
                   "would vanish; they are counted 'orphaned' when met).")
@click.option("--burst", is_flag=True, help="Exit once the queue is idle (nothing due); "
              "says how many jobs it leaves active under other workers' leases.")
@click.option("--wait-active", is_flag=True,
              help="With --burst: also wait for jobs active under other workers' leases, "
                   "running those of a dead worker once their lease lapses.")
@verbose_option
def worker(handler: str, queue_names: Tuple[str, ...], order: str, weights: Optional[str],
           partition_list: Optional[str],
           concurrency: Optional[int], processes: Optional[int],
           max_jobs_per_child: Optional[int], max_memory_mb: Optional[int], lease_ms: int,
           shutdown_timeout: float, job_timeout_ms: Optional[int],
           cancel_grace_ms: Optional[int], allow_eviction: bool, burst: bool,
           wait_active: bool) -> None:
    """Run a worker for HANDLER (MODULE:FUNCTION) on --queue until SIGTERM/SIGINT."""
    from emqfast.backends import select as live_backend  # callable: the live backend name
    from emqfast.worker.threads import Worker

    _check_process_options(processes, max_jobs_per_child, max_memory_mb, queue_names)
    _log_to_stderr()
    outlived = _OutlivedTimeout()
    logging.getLogger("emqfast.worker").addFilter(outlived)
    state = current_state()
    fn = import_handler(handler, verbose=state.verbose)
    queues = [state.queue(name) for name in queue_names]
    for q in queues:
        _preflight(q)
    stops: Dict[str, Any] = {"job_timeout_ms": job_timeout_ms}
    if cancel_grace_ms is not None:
        stops["cancel_grace_ms"] = cancel_grace_ms
    if processes is not None:
        stops.update(processes=processes, max_jobs_per_child=max_jobs_per_child,
                     max_memory_per_child_mb=max_memory_mb)
    if partition_list is not None:
        stops["partitions"] = _partitions(partition_list, queues)
    w = _make_worker(Worker, queues, fn, order, weights, concurrency=concurrency,
                     lease_ms=lease_ms, shutdown_timeout_s=shutdown_timeout,
                     allow_eviction=allow_eviction, **stops)
    queue_name = ", ".join(queue_names)
    # the module is callable at run time (select._CallableModule), which checkers cannot see
    backend_name = cast(Callable[[], str], live_backend)
    # soft_wrap: one line in a log file or a narrow terminal, never wrapped by rich
    err_console.print(styled("emqfast worker ", (w.name, "bold"), " on ", (queue_name, "bold"),
                             f" ({state.where()}), handler {handler}, "
                             f"{_slots_text(processes, concurrency, w.concurrency)}, backend "
                             f"{backend_name()}; SIGTERM/Ctrl-C stops it gracefully, a "
                             "second one force-quits"),
                      soft_wrap=True, highlight=False)
    try:
        stats_ = w.run_until_idle(timeout_s=None, wait_active=wait_active) if burst else w.run()
    except KeyboardInterrupt:  # run(): a second signal; the jobs it held are back on pending
        if burst:
            raise
        _force_quit(w)
    # (a many-queue Worker runs no handler process: only ask a process Worker)
    children = w._children_report() if processes is not None else None
    err_console.print(exit_line(stats_, children), soft_wrap=True, highlight=False)
    if outlived.seen:
        err_console.print(OUTLIVED_HINT, soft_wrap=True, highlight=False)


OUTLIVED_HINT = ("hint: a handler outlived --shutdown-timeout and was waited for (a thread "
                 "cannot be killed); with --processes N handlers run in child processes, "
                 "killed at the timeout, their jobs handed back")


class _OutlivedTimeout(logging.Filter):
    """Notes the thread Worker's warning that handlers still run after its shutdown
    timeout (the CLI then suggests ``--processes``); lets every record through."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "still running after shutdown_timeout_s" in str(record.msg):
            self.seen = True
        return True


def _check_process_options(processes: Optional[int], max_jobs: Optional[int],
                           max_memory_mb: Optional[int], queue_names: Tuple[str, ...]) -> None:
    """The child limits need --processes, and one process Worker serves one queue: said
    before anything starts."""
    if processes is None:
        for value, name in ((max_jobs, "--max-jobs-per-child"),
                            (max_memory_mb, "--max-memory-per-child")):
            if value is not None:
                raise click.BadParameter("needs --processes N", param_hint=name)
    elif len(queue_names) > 1:
        raise click.BadParameter("a process worker serves one queue: run one per queue",
                                 param_hint="--processes")


def _slots_text(processes: Optional[int], concurrency: Optional[int], total: int) -> str:
    """``concurrency 8``, or ``2 processes × concurrency 1`` for a process Worker."""
    if processes is None:
        return f"concurrency {total}"
    return f"{processes} process{'es' if processes > 1 else ''} × concurrency {concurrency or 1}"


def exit_line(stats: Any, children: Optional[Dict[str, Any]]) -> str:
    """What the worker did: jobs finished and released; for a process Worker also its
    handler processes killed (by reason), crashed, recycled and restarted, from its
    heartbeat report (``child_events``)."""
    line = (f"worker stopped: claimed {stats.claimed}, completed {stats.completed}, "
            f"retried {stats.retried}, failed {stats.failed}, cancelled {stats.cancelled}, "
            f"released {stats.released}")
    if children is None:
        return line
    events: Dict[str, int] = children.get("child_events", {})
    kills = {k.partition(":")[2]: n for k, n in sorted(events.items())
             if k.startswith("kill:") and n}
    recycled = sum(n for k, n in events.items() if k.startswith("recycled:"))
    why = f" ({', '.join(f'{k} {n}' for k, n in kills.items())})" if kills else ""
    return (f"{line}; handler processes: killed {sum(kills.values())}{why}, crashed "
            f"{events.get('crash', 0)}, recycled {recycled}, restarted "
            f"{events.get('restarts', 0)}")


def _partitions(text: str, queues: List[Queue]) -> List[int]:
    """``--partitions 0,3``: the partition numbers of the one partitioned queue served."""
    if len(queues) != 1 or not isinstance(queues[0], PartitionedQueue):
        raise click.BadParameter("picks partitions of one partitioned queue (-q NAME made "
                                 "with partitions=P)", param_hint="--partitions")
    try:
        picks = [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"comma-separated partition numbers, not {text!r}",
                                 param_hint="--partitions") from None
    top = queues[0].partitions - 1
    if any(not 0 <= i <= top for i in picks) or len(set(picks)) != len(picks):
        raise click.BadParameter(f"distinct numbers from 0 to {top}, not {text!r}",
                                 param_hint="--partitions")
    return picks


def _make_worker(make: Callable[..., Any], queues: List[Queue], fn: Callable[..., Any],
                 order: str, weights: Optional[str], **options: Any) -> Any:
    """One queue: the plain Worker, as ever; several: the many-queue worker
    (:mod:`emqfast.worker.crew`) in ``order``."""
    if len(queues) == 1:  # a partitioned queue: its partitions in rotation
        if weights is not None:
            raise click.BadParameter("--weights needs several queues", param_hint="--weights")
        return make(queues[0], fn, **options)
    return make(queues, fn, order=order, weights=_weights(weights, order), **options)


def _weights(text: Optional[str], order: str) -> Optional[List[int]]:
    """``--weights 3,2,1`` as a list of ints (checked by the Worker: one per queue, >= 1)."""
    if text is None:
        return None
    if order != "weighted":
        raise click.BadParameter("weights apply to --order weighted", param_hint="--weights")
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected integers like 3,2,1, got {text!r}",
                                 param_hint="--weights") from None


def _force_quit(w: Any) -> None:
    """End the process now: handler threads cannot be interrupted, and the interpreter
    would wait for them at exit. Their jobs were handed back (``released``)."""
    err_console.print(f"worker force-quit: released {w.stats.released} jobs (back on "
                      "pending; abandoned handlers' outcomes are refused)",
                      soft_wrap=True, highlight=False)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(130)


class FailureLines(logging.Formatter):
    """Log lines for a terminal: a job's failure (records carrying ``error``) is one short
    line, ``12:03:04 retry JOB… attempt 1/3: KeyError: 'to'`` (``FAILED`` when no attempt
    is left), cut to the terminal's width when stderr is one; other records keep
    the time, level, logger and message. Control characters in either (a job id, an
    error message) are shown as escapes (:func:`~emqfast.tools.render.visible`)."""

    def __init__(self, width: Optional[int] = None) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        self.width = width

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's
        """The message on one line, its control characters (a newline too) as escapes."""
        record.message = visible(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        """A traceback keeps its lines; other control characters show as escapes."""
        return visible(super().formatException(ei), lines=True)

    def format(self, record: logging.LogRecord) -> str:
        error = getattr(record, "error", None)
        if error is None:
            return super().format(record)
        line = (f"{self.formatTime(record, self.datefmt)} "
                f"{'FAILED' if getattr(record, 'final', False) else 'retry '} "
                f"{getattr(record, 'job_id', '?')} attempt {getattr(record, 'attempt', '?')}/"
                f"{getattr(record, 'max_attempts', '?')}: {error}")
        line = visible(" ".join(str(line).splitlines()))  # a multi-line message: one line
        if self.width and len(line) > self.width:
            line = line[:self.width - 1] + "…"
        return line


def _log_to_stderr() -> None:
    """INFO and up to stderr, a failed job as one line (cut to fit a terminal)."""
    width = shutil.get_terminal_size((80, 24)).columns if sys.stderr.isatty() else None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(FailureLines(width))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def _preflight(q: Queue) -> None:
    """Reach the server and read the queue once before starting: a wrong or missing
    password, or an ACL user without rights to the queue's keys, fails here in one
    line (main() explains it) instead of in the worker's reconnect loop."""
    q.redis.ping()
    q.counts()
