"""``emqfast stats``, ``emqfast schedules [remove]`` and ``emqfast metrics``: what the
queues hold."""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import click
import redis
from rich.console import Group
from rich.live import Live
from rich.table import Table

from emqfast.core.keys import queue_meta_glob, queue_names_of
from emqfast.facade.partitioned import PartitionedQueue, open_queue
from emqfast.facade.queue import Queue
from emqfast.tools.cli_state import (State, close_names, console, current_state, existing_queue,
                                     fail, piped, url_option)
from emqfast.tools.render import (counts_table, fmt_delta, fmt_ms, fmt_relative, plain,
                                  stats_line, styled)


def discover_queues(conn: redis.Redis) -> List[str]:
    """Names of every queue that has been written to (each has a meta hash)."""
    return queue_names_of(conn.scan_iter(match=queue_meta_glob(), count=1000))


def queue_row(q: Queue) -> Dict[str, Any]:
    """The numbers ``stats`` shows for one queue (a partitioned one: its logical queue,
    with ``partitions``, its number of partitions)."""
    row = {"queue": q.name, "counts": q.counts(), "paused": q.is_paused(),
           "next_due_ms": q.next_due_ms(), "schedules": q.schedules.count()}
    if isinstance(q, PartitionedQueue):
        row["partitions"] = q.partitions
    return row


def partition_rows(q: PartitionedQueue) -> List[Dict[str, Any]]:
    """One row per partition of ``q``, named ``<queue> #<i>`` (the breakdown ``stats``
    shows under a partitioned queue named on its own)."""
    rows = []
    for i, part in enumerate(q.partition_queues):
        row = queue_row(part)
        row["queue"] = f"{q.name} #{i}"
        rows.append(row)
    return rows


def _stats_rows(state: State, queue: Optional[str]) -> Tuple[List[Dict[str, Any]], int]:
    """Every shown queue's :func:`queue_row` (a partitioned queue named alone: then each
    partition's), and the server clock (ms)."""
    conn = state.conn()
    names = [queue] if queue else discover_queues(conn)
    queues = [open_queue(n, conn) for n in names]
    rows = [queue_row(q) for q in queues]
    if queue and isinstance(queues[0], PartitionedQueue):
        rows += partition_rows(queues[0])
    return rows, Queue(names[0] if names else "_", conn).server_time_ms()


def _stats_view(state: State, queue: Optional[str]) -> Any:
    rows, now = _stats_rows(state, queue)
    title = f"Queues on {state.where()} — server clock {fmt_ms(now)}"
    parts: List[Any] = [counts_table(rows, now, title=title, width=console.width)]
    if not rows:
        parts.append(styled(("no queues yet", "dim")))
    if queue and rows[0]["schedules"]:
        parts.append(schedules_table(open_queue(queue, state.conn()), now))
    return Group(*parts)


@click.command(short_help="Counts per state, next due job, schedules: per queue.")
@url_option
@click.argument("queue", required=False)
@click.option("--watch", is_flag=True,
              help="Refresh until Ctrl-C (into a file or a pipe: one plain line per queue "
                   "per refresh).")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(0.05),
              help="Seconds between refreshes with --watch.")
@click.option("--count", "refreshes", default=0, type=click.IntRange(0),
              help="With --watch: stop after this many refreshes (0 = until Ctrl-C).")
def stats(queue: Optional[str], watch: bool, interval: float, refreshes: int) -> None:
    """Counts per state, the next due job and schedules, for QUEUE or every queue."""
    state = current_state()
    if queue:
        existing_queue(queue)  # a mistyped name is said, not shown as zeros
    if not watch and piped():  # a pipe or a file: one plain key=value line per queue
        _watch_lines(state, queue, interval, 1)
        return
    if not watch:
        console.print(_stats_view(state, queue))
        return
    try:
        if console.is_terminal:
            _watch_live(state, queue, interval, refreshes)
        else:  # a live view redraws in place: a file or a pipe would get nothing useful
            _watch_lines(state, queue, interval, refreshes)
    except KeyboardInterrupt:
        pass


def _watch_live(state: State, queue: Optional[str], interval: float, refreshes: int) -> None:
    """The table redrawn in place on a terminal."""
    with Live(_stats_view(state, queue), console=console, auto_refresh=False) as live:
        done = 1
        while not refreshes or done < refreshes:
            time.sleep(interval)  # the refresh cadence itself, not a wait for a condition
            live.update(_stats_view(state, queue), refresh=True)
            done += 1


def _watch_lines(state: State, queue: Optional[str], interval: float, refreshes: int) -> None:
    """One plain line per queue per refresh, flushed each time, each ending in a newline."""
    done = 0
    while True:
        rows, now = _stats_rows(state, queue)
        for row in rows:
            click.echo(stats_line(row, now))
        if not rows:
            click.echo(f"{fmt_ms(now)} no queues yet")
        sys.stdout.flush()
        done += 1
        if refreshes and done >= refreshes:
            return
        time.sleep(interval)  # the refresh cadence itself


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
    table = Table(title=plain(f"Schedules of {q.name}"), title_justify="left")
    for name in ("name", "cadence", "time zone", "next run (schedule's zone)", "in"):
        table.add_column(name)
    for row in schedule_rows(q):
        table.add_row(plain(row["name"]), plain(row["cadence"]), plain(row["tz"]),
                      plain(row["next_local"]), fmt_relative(row["next_ms"], now_ms))
    return table


@click.group(invoke_without_command=True, subcommand_metavar="[remove NAME]",
             short_help="List the schedules of QUEUE, or remove one.")
@url_option
@click.argument("queue")
@click.pass_context
def schedules(ctx: click.Context, queue: str) -> None:
    """List the schedules of QUEUE with their next run in the schedule's time zone;
    'schedules QUEUE remove NAME' deletes one."""
    if ctx.invoked_subcommand is not None:
        return  # the subcommand reads QUEUE from this context (its --help is read later)
    q = existing_queue(queue)
    table = schedules_table(q, q.server_time_ms())
    console.print(table)
    if not table.row_count:
        console.print(styled(("no schedules", "dim")))


@schedules.command("remove")
@url_option
@click.argument("name")
@click.pass_context
def schedules_remove(ctx: click.Context, name: str) -> None:
    """Delete schedule NAME (jobs it already made stay)."""
    queue = ctx.parent.params["queue"] if ctx.parent else ""
    q = existing_queue(queue)
    if q.schedules.remove(name):
        console.print(styled(("removed", "green"), f" schedule {name} of {queue}"))
        return
    names = [sched.name for sched in q.schedules.list()]
    fail(styled((f"no schedule {name} in {queue}", "red"),
                ": nothing removed" + close_names(name, names, "its schedules")))


@click.command(short_help="Prometheus text metrics (printed, or served: --serve).")
@url_option
@click.argument("queues", nargs=-1)
@click.option("--serve", "port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
              help="Serve the metrics over HTTP on 127.0.0.1:PORT (/metrics) until Ctrl-C.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="With --serve: also answer this Host name (repeatable; loopback names "
                   "always).")
def metrics(queues: Tuple[str, ...], port: Optional[int], allowed_hosts: Tuple[str, ...]) -> None:
    """Prometheus text metrics of QUEUES (every queue when none is named)."""
    from emqfast.facade import metrics as metrics_mod

    names = list(queues) or None
    if port is None:
        click.echo(metrics_mod.exposition(current_state().conn(), names), nl=False)
        return
    from emqfast.tools.hosts import AllowedHosts
    from emqfast.tools.metrics_serve import serve

    registry = metrics_mod.registry_for(current_state().conn(), names)
    server, _thread = serve(registry, port, AllowedHosts(allowed_hosts))
    click.echo(f"serving metrics on http://127.0.0.1:{server.server_port}/metrics", err=True)
    stop = threading.Event()
    try:
        while not stop.wait(3600):  # scrapes are answered on the server's own thread
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
