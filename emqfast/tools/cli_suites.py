"""``emqfast demo``, ``emqfast bench`` and ``emqfast server``: the Portal LMS scenario, the
benchmark suite, and the embedded Redis's start, status, stop and wipe."""
from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import click
from rich.table import Table

from emqfast.server import embedded
from emqfast.tools.cli_state import (URL_ENV, console, current_state, demo_console, err_console,
                                     url_option)
from emqfast.tools.render import plain, styled


@click.command(short_help="Play the Portal LMS notifications scenario.")
@url_option
@click.option("--quiet", is_flag=True, help="Only the check-list at the end.")
def demo(quiet: bool) -> None:
    """Play the Portal LMS notifications scenario (a few seconds: time is compressed)."""
    from emqfast.tools.demo import run_demo

    state = current_state()
    ok = run_demo(state.conn(), console=demo_console, quiet=quiet, where=state.where())
    sys.exit(0 if ok else 1)


def load_bench() -> Optional[Callable[[List[str]], Any]]:
    """The benchmark suite's ``main(argv)``, or None when it is not installed."""
    for name in ("emqfast.bench.run", "bench.run"):
        if name == "bench.run":  # a source checkout: bench/ sits beside the package
            root = str(Path(__file__).resolve().parents[2])  # emqfast/tools/ -> the checkout
            if not (Path(root) / "bench" / "run.py").exists():
                continue
            if root not in sys.path:
                sys.path.insert(0, root)
        try:
            main: Callable[[List[str]], Any] = importlib.import_module(name).main
            return main
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # the suite itself is absent; a missing dependency is reported
            raise
    return None


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@url_option
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: Tuple[str, ...]) -> None:
    """Run the benchmark suite (extra ARGS are passed to it)."""
    main_fn = load_bench()
    if main_fn is None:
        err_console.print(styled(("The benchmark suite is not installed", "red"),
                                 ": expected emqfast.bench.run:main (bench/run.py in the "
                                 "source tree). Install emqfast from a checkout that has "
                                 "bench/."))
        sys.exit(2)
    state = current_state()
    if state.url:  # the suite connects on its own: hand it the same server
        os.environ[URL_ENV] = state.url
    code = main_fn(list(args))
    sys.exit(code if isinstance(code, int) else 0)


@click.group(short_help="The embedded Redis: start, status, stop, wipe.")
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
        table.add_row(key, plain(info[key]))
    table.add_row("pid", str(embedded.pid() or "-") if info["running"] else "-")
    console.print(table)


@server.command("stop")
def server_stop() -> None:
    """Stop the embedded server (its data stays on disk)."""
    console.print("stopped" if embedded.stop() else "not running")


@server.command("start")
def server_start() -> None:
    """Start the embedded server unless it runs already; print its URL."""
    was_running = embedded.is_running()
    where = embedded.ensure_running()
    console.print(styled(f"{'already running' if was_running else 'started'}: {where}"))


@server.command("wipe", short_help="Stop the embedded server and delete its data.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def server_wipe(yes: bool) -> None:
    """Stop the embedded server and delete its data (asks first unless --yes)."""
    directory = embedded.state_dir()
    if not yes:
        _confirm_wipe(directory)
    embedded.wipe()
    console.print(styled(f"wiped {directory}"))


def _confirm_wipe(directory: Path) -> None:
    """Ask on a terminal; without one, refuse (a script must say --yes)."""
    if not sys.stdin.isatty():
        err_console.print(styled((f"refusing to wipe {directory}", "red"),
                                 ": no terminal to confirm on; pass --yes"), soft_wrap=True)
        sys.exit(1)
    click.confirm(f"Delete every queue and job in {directory}?", abort=True)
