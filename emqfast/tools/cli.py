"""The ``emqfast`` command line (click + rich).

    emqfast demo                               the Portal LMS scenario, on the embedded Redis
    emqfast stats [QUEUE] [--watch]            counts per state, next due job, schedules
    emqfast jobs QUEUE [JOB_ID] [--state S]    list or inspect jobs
    emqfast enqueue QUEUE JSON [--delay-ms N]  add one job, print its id
    emqfast retry QUEUE JOB_ID|--all | cancel QUEUE JOB_ID
    emqfast schedules QUEUE [remove NAME]      schedules with next runs in their time zone
    emqfast worker MODULE:FUNCTION --queue Q   run a worker for an importable handler
                                               (-q high -q low: one worker, many queues)
    emqfast bench [ARGS...]                    the benchmark suite
    emqfast metrics [QUEUE...] [--serve PORT]  Prometheus text metrics (printed or served)
    emqfast server start|status|stop|wipe      the embedded Redis (wipe asks: --yes)

Redis: ``--url`` (before or after the command), else ``EMQ_REDIS_URL``, else the
embedded server. A password in the URL is never printed: URLs are shown through
:func:`emqfast.core.redaction.redact`, and every error message through :func:`scrub`.

This module is the click group and the console-script entry :func:`main`; the commands
live beside it by concern: ``cli_queues`` (stats, schedules, metrics), ``cli_jobs``
(jobs, enqueue, retry, cancel), ``cli_worker`` (worker), ``cli_suites`` (demo, bench, server),
and what they share (consoles, URL, connection, ``scrub``) in ``cli_state``.
"""
from __future__ import annotations

import os
import sys
import traceback
from typing import List, Optional

import click

from emqfast.core.version import __version__
from emqfast.tools.cli_dashboard import dashboard
from emqfast.tools.cli_jobs import (cancel, enqueue, jobs, load_jobs, retry,  # noqa: F401
                                    retry_every)
from emqfast.tools.cli_queues import (discover_queues, metrics, queue_row,  # noqa: F401
                                      schedule_rows, schedules, schedules_remove,
                                      schedules_table, stats)
from emqfast.tools.cli_state import (URL_ENV, State, console, err_console,  # noqa: F401
                                     scrub, url_option, verbose_option)
from emqfast.tools.cli_suites import (bench, demo, load_bench, server, server_start,  # noqa: F401
                                      server_status, server_stop, server_wipe)
from emqfast.tools.cli_worker import import_handler, worker  # noqa: F401
from emqfast.tools.cli_workers import workers  # noqa: F401
from emqfast.tools.render import styled, visible

__all__ = ["State", "URL_ENV", "bench", "cancel", "cli", "console", "demo",
           "discover_queues", "enqueue", "err_console", "error_line", "import_handler",
           "jobs", "load_bench", "load_jobs", "main", "metrics", "queue_row", "retry",
           "retry_every", "schedule_rows", "schedules", "schedules_remove",
           "schedules_table", "scrub", "server", "server_start", "server_status",
           "server_stop", "server_wipe", "stats", "url_option", "verbose_option", "worker",
           "workers"]


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


for _command in (demo, stats, jobs, enqueue, retry, cancel, schedules, worker, workers, bench,
                 metrics, server):
    cli.add_command(_command)  # the commands live beside this module, by concern
cli.add_command(dashboard)  # the web dashboard


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
        if _wants_verbose(args):
            err_console.print(visible(scrub(traceback.format_exc()), lines=True),
                              markup=False, highlight=False)
        err_console.print(styled(("error", "red"), ": " + error_line(exc)), highlight=False)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
