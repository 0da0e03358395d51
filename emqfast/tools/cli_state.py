"""What every ``emqfast`` command shares: the consoles, the Redis URL choice and the
lazily made connection (:class:`State`), the ``--url``/``--verbose`` options a
subcommand accepts too, and :func:`scrub`, which masks any password before text is
printed.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, List, NoReturn, Optional, TypeVar

import click
import redis
from rich.console import Console
from rich.text import Text

from emqfast.core.keys import queue_meta_glob, queue_names_of
from emqfast.core.redaction import redact, scrub as scrub_text
from emqfast.facade.partitioned import open_queue
from emqfast.facade.queue import Queue
from emqfast.server import embedded
from emqfast.server.connection import connect
from emqfast.tools.render import natural_width, styled

_F = TypeVar("_F", bound=Callable[..., Any])  # a click command function, returned as given


def _console(stderr: bool = False, markup: bool = False) -> Console:
    # piped output (scripts, tests) gets room for the tables instead of rich's 80 columns
    probe = Console(stderr=stderr)
    wide = None if probe.is_terminal or os.environ.get("COLUMNS") else 200
    return Console(stderr=stderr, width=wide, markup=markup)


def piped() -> bool:
    """Whether stdout is a pipe or a file with no width asked for (``COLUMNS``): output
    meant for a program, not a person at a terminal."""
    return not console.is_terminal and not os.environ.get("COLUMNS")


# Markup off: a plain str printed or put in a table is text, whatever brackets a stored
# name, id or payload holds; styles come from rich Text (render.plain, Text.assemble).
console = _console()
err_console = _console(stderr=True)
# the demo's own fixed strings carry markup (it prints nothing stored by others)
demo_console = _console(markup=True)

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
        """A :class:`Queue` on the shared client, opened as it was made (a partitioned
        queue as one logical queue)."""
        return open_queue(name, self.conn())

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


def verbose_option(f: _F) -> _F:
    """``-v/--verbose``: full tracebacks with error messages (before or after the command)."""
    return click.option("--verbose", "-v", is_flag=True, callback=_set_verbose,
                        expose_value=False, is_eager=True,
                        help="Show tracebacks with errors.")(f)


def url_option(f: _F) -> _F:
    """``--url`` on a subcommand too (``emqfast stats --url ...``)."""
    return click.option("--url", callback=_set_url, expose_value=False, is_eager=True,
                        metavar="URL", help="Redis URL (overrides EMQ_REDIS_URL).")(f)


def current_state() -> State:
    """The running command's :class:`State` (made on first use)."""
    return click.get_current_context().ensure_object(State)


# --- what the commands print and how they fail ---------------------------------------
def fail(message: Text, code: int = 1) -> NoReturn:
    """One red line on stderr (never wrapped by us: one line in logs), then exit."""
    err_console.print(message, highlight=False, soft_wrap=True)
    sys.exit(code)


def print_unbounded(renderable: Any) -> None:
    """Print ``renderable`` at its natural width even past the terminal's edge (``-o
    wide``: the terminal wraps the long lines; nothing is cut or squeezed)."""
    need = natural_width(renderable)
    if need <= console.width:
        console.print(renderable)
        return
    colours: Any = console.color_system  # the name Console takes back (a Literal there)
    Console(file=console.file, width=need, markup=False, highlight=False,
            force_terminal=console.is_terminal, color_system=colours,
            no_color=console.no_color).print(renderable)


def close_names(name: str, names: List[str], what: str) -> str:
    """``; did you mean mail?`` for names close to ``name``, else a few of ``names``
    (`` (what: a, b)``)."""
    import difflib

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        return f"; did you mean {' or '.join(close)}?"
    if not names:
        return ""
    shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
    return f" ({what}: {shown})"


def existing_queue(name: str) -> Queue:
    """Queue ``name`` if it exists (something was written to it: its meta hash is there,
    as ``stats`` and the dashboard find queues), else one line saying it does not, with
    close names, and exit 1: a mistyped name would read as an empty queue."""
    state = current_state()
    q = state.queue(name)  # validates the name
    if q.redis.exists(q.keys.meta):
        return q
    names = queue_names_of(q.redis.scan_iter(match=queue_meta_glob(), count=1000))
    fail(styled((f"no queue {name}", "red"), f" on {state.where()}: nothing was ever "
                f"enqueued to it" + close_names(name, names, "queues there")))
