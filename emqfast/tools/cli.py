"""The ``emqfast`` command line (click + rich).

    emqfast demo                               the Portal LMS scenario, on the embedded Redis
    emqfast stats [QUEUE] [--watch]            counts per state, next due job, schedules
    emqfast jobs QUEUE [JOB_ID] [--state S]    list or inspect jobs
    emqfast retry QUEUE JOB_ID | cancel QUEUE JOB_ID
    emqfast schedules QUEUE                    schedules with next runs in their time zone
    emqfast worker MODULE:FUNCTION --queue Q   run a worker for an importable handler
    emqfast bench [ARGS...]                    the benchmark suite
    emqfast metrics [QUEUE...] [--serve PORT]  Prometheus text metrics (printed or served)
    emqfast server status|stop|wipe            the embedded Redis

Redis: ``--url`` (before or after the command), else ``EMQ_REDIS_URL``, else the
embedded server. A password in the URL is never printed: URLs are shown through
:func:`emqfast.connection.redact`, and every error message through :func:`scrub`.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import time
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import click
import redis
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from emqfast.server import embedded
from emqfast.server.connection import connect
from emqfast.core.redaction import redact, scrub as scrub_text
from emqfast.facade.job import STATES, Job
from emqfast.core.keys import queue_meta_glob, queue_of_key
from emqfast.facade.queue import Queue
from emqfast.tools.render import (counts_table, fmt_delta, fmt_ms, fmt_relative, job_detail_table,
    job_dict, jobs_table)
from emqfast.core.version import __version__

def _console(stderr: bool = False) -> Console:
    # piped output (scripts, tests) gets room for the tables instead of rich's 80 columns
    probe = Console(stderr=stderr)
    wide = None if probe.is_terminal or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, width=wide)


console = _console()
err_console = _console(stderr=True)

URL_ENV = "EMQ_REDIS_URL"


# --- secrets never leave -----------------------------------------------------------
def scrub(text: str, urls: Optional[List[Optional[str]]] = None) -> str:
    """``text`` with anything that looks like a URL password masked, and any copy (or
    piece) of a password from the URLs we were given too (see :mod:`emqfast.redaction`:
    no URL parsing, so malformed URLs are masked as well)."""
    return scrub_text(text, urls if urls is not None else _known_urls())


def _known_urls() -> List[Optional[str]]:
    urls: List[Optional[str]] = [os.environ.get(URL_ENV)]
    argv = sys.argv[1:]
    for i, arg in enumerate(argv):
        if arg == "--url" and i + 1 < len(argv):
            urls.append(argv[i + 1])
        elif arg.startswith("--url="):
            urls.append(arg[len("--url="):])
    return urls


# --- shared state: the connection, made on first use -------------------------------------
class State:
    """What the commands share: the URL choice and a lazily made client."""

    def __init__(self, url: Optional[str] = None):
        self.url = url
        self.verbose = False
        self._conn: Optional[redis.Redis] = None

    def conn(self) -> redis.Redis:
        """The client (connecting to the embedded server when no URL was given)."""
        if self._conn is None:
            self._conn = connect(self.url)
        return self._conn

    def queue(self, name: str) -> Queue:
        """A :class:`Queue` on the shared client."""
        return Queue(name, self.conn())

    def where(self) -> str:
        """Where we talk to, safe to print."""
        if self.url:
            return redact(self.url)
        if os.environ.get(URL_ENV):
            return redact(os.environ[URL_ENV])
        return f"embedded ({embedded.url()})"


def _set_url(ctx: click.Context, _param: click.Parameter, value: Optional[str]) -> None:
    if value:
        ctx.ensure_object(State).url = value


def _set_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.ensure_object(State).verbose = True


def verbose_option(f: Callable) -> Callable:
    """``-v/--verbose``: full tracebacks with error messages (before or after the command)."""
    return click.option("--verbose", "-v", is_flag=True, callback=_set_verbose,
                        expose_value=False, is_eager=True,
                        help="Show tracebacks with errors.")(f)


def url_option(f: Callable) -> Callable:
    """``--url`` on a subcommand too (``emqfast stats --url ...``)."""
    return click.option("--url", callback=_set_url, expose_value=False, is_eager=True,
                        metavar="URL", help="Redis URL (overrides EMQ_REDIS_URL).")(f)


def _state() -> State:
    return click.get_current_context().ensure_object(State)


def discover_queues(conn: redis.Redis) -> List[str]:
    """Names of every queue that has been written to (each has a meta hash)."""
    names = {queue_of_key(k.decode("utf-8", "replace"))
             for k in conn.scan_iter(match=queue_meta_glob(), count=1000)}
    return sorted(names)


def queue_row(q: Queue) -> Dict[str, Any]:
    """The numbers ``stats`` shows for one queue."""
    return {"queue": q.name, "counts": q.counts(), "paused": q.is_paused(),
            "next_due_ms": q.next_due_ms(), "schedules": q.redis.zcard(q.keys.repeat)}


def load_jobs(q: Queue, ids: List[str]) -> List[Job]:
    """Jobs by id in one pipelined round trip (ids trimmed meanwhile are skipped)."""
    pipe = q.redis.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(q.keys.job(job_id))
        pipe.zscore(q.keys.delayed, job_id)  # a waiting job's state is the set holding it
    got = pipe.execute()
    return [Job.from_hash(q.name, job_id, h, delayed)
            for job_id, h, delayed in zip(ids, got[::2], got[1::2]) if h]


# --- the group -----------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--url", envvar=URL_ENV, metavar="URL",
              help="Redis URL (redis://, rediss://, unix://, redis+cluster://). "
                   "Default: $EMQ_REDIS_URL, else the embedded server.")
@verbose_option
@click.version_option(__version__, message="emqfast %(version)s")
@click.pass_context
def cli(ctx: click.Context, url: Optional[str]) -> None:
    """emqfast: a Redis job queue whose hot path is C."""
    state = ctx.ensure_object(State)
    state.url = state.url or url


@cli.command()
@url_option
@click.option("--quiet", is_flag=True, help="Only the check-list at the end.")
def demo(quiet: bool) -> None:
    """Play the Portal LMS notifications scenario (a few seconds: time is compressed)."""
    from emqfast.tools.demo import run_demo

    state = _state()
    ok = run_demo(state.conn(), console=console, quiet=quiet, where=state.where())
    sys.exit(0 if ok else 1)


def _stats_view(state: State, queue: Optional[str]) -> Any:
    conn = state.conn()
    names = [queue] if queue else discover_queues(conn)
    rows = [queue_row(Queue(n, conn)) for n in names]
    now = Queue(names[0] if names else "_", conn).server_time_ms()
    title = f"Queues on {state.where()} — server clock {fmt_ms(now)}"
    parts: List[Any] = [counts_table(rows, now, title=title)]
    if not names:
        parts.append("[dim]no queues yet[/dim]")
    if queue and rows[0]["schedules"]:
        parts.append(schedules_table(Queue(queue, conn), now))
    return Group(*parts)


@cli.command()
@url_option
@click.argument("queue", required=False)
@click.option("--watch", is_flag=True, help="Refresh until Ctrl-C.")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.05),
              help="Seconds between refreshes with --watch.")
@click.option("--count", "refreshes", default=0, type=click.IntRange(0),
              help="With --watch: stop after this many refreshes (0 = until Ctrl-C).")
def stats(queue: Optional[str], watch: bool, interval: float, refreshes: int) -> None:
    """Counts per state, the next due job and schedules, for QUEUE or every queue."""
    state = _state()
    if queue:
        Queue(queue, state.conn())  # validates the name before anything else
    if not watch:
        console.print(_stats_view(state, queue))
        return
    done = 0
    try:
        with Live(_stats_view(state, queue), console=console, auto_refresh=False) as live:
            done = 1
            while not refreshes or done < refreshes:
                time.sleep(interval)  # the refresh cadence itself, not a wait for a condition
                live.update(_stats_view(state, queue), refresh=True)
                done += 1
    except KeyboardInterrupt:
        pass


@cli.command()
@url_option
@click.argument("queue")
@click.argument("job_id", required=False)
@click.option("--state", "states", multiple=True, type=click.Choice(STATES),
              help="Only jobs in this state (repeatable). Default: every state.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1),
              help="At most this many jobs per state.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def jobs(queue: str, job_id: Optional[str], states: tuple, limit: int, as_json: bool) -> None:
    """List the jobs of QUEUE, or inspect JOB_ID in detail."""
    import json

    q = _state().queue(queue)
    now = q.server_time_ms()
    if job_id:
        job = q.get(job_id)
        if job is None:
            err_console.print(f"[red]no job {job_id} in {queue}[/red]")
            sys.exit(1)
        if as_json:
            click.echo(json.dumps(job_dict(job), ensure_ascii=False))
        else:
            console.print(job_detail_table(job, now))
        return
    found: List[Job] = []
    for st in states or STATES:
        found += load_jobs(q, q.job_ids(st, 0, limit - 1))
    if as_json:
        click.echo(json.dumps([job_dict(j) for j in found], ensure_ascii=False))
        return
    which = ", ".join(states) if states else "all states"
    console.print(jobs_table(found, now, title=f"{queue}: {which} (server clock {fmt_ms(now)})"))
    if not found:
        console.print("[dim]no jobs[/dim]")


@cli.command()
@url_option
@click.argument("queue")
@click.argument("job_id")
def retry(queue: str, job_id: str) -> None:
    """Send failed JOB_ID back to pending with a fresh set of attempts."""
    _state().queue(queue).retry(job_id)
    console.print(f"[green]retrying[/green] {job_id} (pending again in {queue})")


@cli.command()
@url_option
@click.argument("queue")
@click.argument("job_id")
def cancel(queue: str, job_id: str) -> None:
    """Remove JOB_ID if it has not started (scheduled or pending)."""
    if _state().queue(queue).cancel(job_id):
        console.print(f"[green]cancelled[/green] {job_id}")
        return
    err_console.print(f"[red]cannot cancel {job_id}[/red]: unknown, running or already finished")
    sys.exit(1)


def schedule_rows(q: Queue) -> List[Dict[str, Any]]:
    """One dict per schedule: name, cadence, tz, next run (epoch ms and in its zone)."""
    return [_schedule_row(sched) for sched in q.schedules.list()]


def _schedule_row(sched: Any) -> Dict[str, Any]:
    from zoneinfo import ZoneInfo

    tz_name = sched.tz or "UTC"
    cadence = f"cron {sched.cron}" if sched.cron else f"every {fmt_delta(sched.every_ms)}"
    next_ms = sched.next_run_ms
    return {"name": sched.name, "cadence": cadence, "tz": tz_name, "next_ms": next_ms,
            "next_local": fmt_ms(next_ms, ZoneInfo(tz_name)) if next_ms is not None else "-"}


def schedules_table(q: Queue, now_ms: int) -> Table:
    """The registry of repeatable schedules of ``q``, next runs in each schedule's zone."""
    table = Table(title=f"Schedules of {q.name}", title_justify="left")
    for name in ("name", "cadence", "time zone", "next run (schedule's zone)", "in"):
        table.add_column(name)
    for row in schedule_rows(q):
        table.add_row(row["name"], row["cadence"], row["tz"], row["next_local"],
                      fmt_relative(row["next_ms"], now_ms))
    return table


@cli.command()
@url_option
@click.argument("queue")
def schedules(queue: str) -> None:
    """List the schedules of QUEUE with their next run in the schedule's time zone."""
    q = _state().queue(queue)
    table = schedules_table(q, q.server_time_ms())
    console.print(table)
    if not table.row_count:
        console.print("[dim]no schedules[/dim]")


def import_handler(spec: str, verbose: bool = False) -> Callable:
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
    return obj


def _import_module(module_name: str, verbose: bool) -> Any:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - SyntaxError, or whatever the module raised
        if verbose:
            err_console.print(scrub(traceback.format_exc()), markup=False, highlight=False)
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


@cli.command()
@url_option
@click.argument("handler", metavar="MODULE:FUNCTION")
@click.option("--queue", "-q", "queue_name", required=True, help="Queue to work on.")
@click.option("--concurrency", "-c", default=8, show_default=True, type=click.IntRange(1, 10_000),
              help="Handlers running at once.")
@click.option("--lease-ms", default=30_000, show_default=True, type=click.IntRange(50),
              help="Lease per claimed job (extended while the handler runs).")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait on SIGTERM/SIGINT for running handlers before saying "
                   "which still run; a running job is never handed back while its handler "
                   "may still finish (its outcome is written when it does).")
@click.option("--allow-eviction", is_flag=True,
              help="Run even on a server whose maxmemory-policy may evict keys (jobs "
                   "would vanish; they are counted 'orphaned' when met).")
@click.option("--burst", is_flag=True, help="Exit once the queue is idle (nothing due).")
@verbose_option
def worker(handler: str, queue_name: str, concurrency: int, lease_ms: int,
           shutdown_timeout: float, allow_eviction: bool, burst: bool) -> None:
    """Run a worker for HANDLER (MODULE:FUNCTION) on --queue until SIGTERM/SIGINT."""
    from emqfast.backends import select as live_backend  # callable: the live backend name
    from emqfast.worker.threaded import Worker

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state = _state()
    fn = import_handler(handler, verbose=state.verbose)
    q = state.queue(queue_name)
    _preflight(q)
    w = Worker(q, fn, concurrency=concurrency, lease_ms=lease_ms,
               shutdown_timeout_s=shutdown_timeout, allow_eviction=allow_eviction)
    err_console.print(f"emqfast worker [bold]{w.name}[/bold] on [bold]{queue_name}[/bold] "
                      f"({state.where()}), handler {handler}, concurrency {concurrency}, "
                      f"backend {live_backend()}; SIGTERM/Ctrl-C stops it gracefully")
    stats_ = w.run_until_idle(timeout_s=None) if burst else w.run()
    err_console.print(f"worker stopped: claimed {stats_.claimed}, completed {stats_.completed}, "
                      f"retried {stats_.retried}, failed {stats_.failed}, "
                      f"released {stats_.released}")


def _preflight(q: Queue) -> None:
    """Reach the server and read the queue once before starting: a wrong or missing
    password, or an ACL user without rights to the queue's keys, fails here in one
    line (main() explains it) instead of in the worker's reconnect loop."""
    q.redis.ping()
    q.counts()


def load_bench() -> Optional[Callable[[List[str]], Any]]:
    """The benchmark suite's ``main(argv)``, or None when it is not installed."""
    for name in ("emqfast.bench.run", "bench.run"):
        if name == "bench.run":  # a source checkout: bench/ sits beside the package
            root = str(Path(__file__).resolve().parent.parent)
            if not (Path(root) / "bench" / "run.py").exists():
                continue
            if root not in sys.path:
                sys.path.insert(0, root)
        try:
            return importlib.import_module(name).main
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # the suite itself is absent; a missing dependency is reported
            raise
    return None


@cli.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@url_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple) -> None:
    """Run the benchmark suite (extra ARGS are passed to it)."""
    main_fn = load_bench()
    if main_fn is None:
        err_console.print("[red]The benchmark suite is not installed[/red]: "
                          "expected emqfast.bench.run:main (bench/run.py in the source tree). "
                          "Install emqfast from a checkout that has bench/.")
        sys.exit(2)
    state = _state()
    if state.url:  # the suite connects on its own: hand it the same server
        os.environ[URL_ENV] = state.url
    code = main_fn(list(args))
    sys.exit(code if isinstance(code, int) else 0)


@cli.command()
@url_option
@click.argument("queues", nargs=-1)
@click.option("--serve", "port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve the metrics over HTTP on 127.0.0.1:PORT (/metrics) until Ctrl-C.")
def metrics(queues: tuple, port: Optional[int]) -> None:
    """Prometheus text metrics of QUEUES (every queue when none is named)."""
    from emqfast.facade import metrics as metrics_mod

    names = list(queues) or None
    if port is None:
        click.echo(metrics_mod.exposition(_state().conn(), names), nl=False)
        return
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr="127.0.0.1",
                                        registry=metrics_mod.registry_for(_state().conn(), names))
    click.echo(f"serving metrics on http://127.0.0.1:{server.server_port}/metrics", err=True)
    stop = threading.Event()
    try:
        while not stop.wait(3600):  # scrapes are answered on the server's own thread
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


@cli.group()
def server() -> None:
    """The embedded Redis (a redis-server on a unix socket in $EMQ_STATE_DIR)."""


@server.command("status")
def server_status() -> None:
    """Where the embedded server lives and whether it runs."""
    info = embedded.info()
    table = Table(title="embedded redis-server", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    for key in ("running", "state_dir", "socket", "url"):
        table.add_row(key, str(info[key]))
    table.add_row("pid", str(embedded.pid() or "-") if info["running"] else "-")
    console.print(table)


@server.command("stop")
def server_stop() -> None:
    """Stop the embedded server (its data stays on disk)."""
    console.print("stopped" if embedded.stop() else "not running")


@server.command("wipe")
def server_wipe() -> None:
    """Stop the embedded server and delete its data."""
    directory = embedded.state_dir()
    embedded.wipe()
    console.print(f"wiped {directory}")


def _wants_verbose(args: List[str]) -> bool:
    return bool(os.environ.get("EMQ_DEBUG")) or any(a in ("-v", "--verbose") for a in args)


def error_line(exc: BaseException) -> str:
    """The one line ``main`` prints for ``exc``, scrubbed: a plain-words explanation for
    credential and permission failures, else the error as it is."""
    from emqfast.core.diagnose import explain

    return explain(exc, clean=scrub) or scrub(f"{type(exc).__name__}: {exc}")


def main(argv: Optional[List[str]] = None) -> None:
    """Console-script entry point: run the CLI; an error becomes one scrubbed line and a
    non-zero exit (1), with the traceback only under ``--verbose``/``-v`` or EMQ_DEBUG."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=args, prog_name="emqfast", standalone_mode=True)
    except Exception as exc:  # noqa: BLE001 - the CLI's last word on anything
        message = escape(error_line(exc))
        if _wants_verbose(args):
            err_console.print(scrub(traceback.format_exc()), markup=False, highlight=False)
        err_console.print(f"[red]error[/red]: {message}", highlight=False)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
