"""``emqfast dashboard``: serve the web dashboard (:mod:`emqfast.web`) with uvicorn.

    EMQ_DASHBOARD_TOKEN=... emqfast dashboard [--host 127.0.0.1] [--port 8270] [--url URL]
                      [--read-only] [--auth-token-file PATH] [--allowed-host NAME ...]

On the embedded Redis by default, like every command. It binds loopback unless told
otherwise, and refuses a host other people can reach without an auth token: the
dashboard can retry, cancel and delete jobs. The token comes from ``$EMQ_DASHBOARD_TOKEN``
or a file (``--auth-token`` works too, but every local user sees it in the process
list). It answers only the Host names it is bound to (loopback names, ``--host``) and
those given with ``--allowed-host``."""
from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Optional, Tuple

import click

from emqfast.core.errors import InvalidInput
from emqfast.tools.cli_state import current_state, scrub, url_option
from emqfast.tools.hosts import bound_names, is_loopback

TOKEN_ENV = "EMQ_DASHBOARD_TOKEN"


class ExposedWithoutAuth(InvalidInput):
    """The dashboard would listen where others can reach it, without an auth token."""


def check_exposure(host: str, token: Optional[str]) -> None:
    """Refuse a non-loopback ``host`` without an auth token (typed error saying why)."""
    if not is_loopback(host) and not token:
        raise ExposedWithoutAuth(
            f"refusing to serve the dashboard on {host}: other machines could reach it, and "
            f"it can retry, cancel and delete jobs. Set {TOKEN_ENV} (or pass "
            "--auth-token-file PATH, or --auth-token TOKEN), or keep the default --host "
            "127.0.0.1")


def _log_to_stderr(verbose: bool) -> None:
    """The dashboard's log lines (one per failed request) to stderr; their tracebacks
    too with ``-v``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    web = logging.getLogger("emqfast.web")
    web.addHandler(handler)
    web.setLevel(logging.DEBUG if verbose else logging.INFO)
    web.propagate = False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(128)
    return sock


def address(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{shown}:{port}/"


def read_token_file(path: str) -> str:
    """The token in the file at ``path`` (surrounding whitespace dropped)."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"cannot read the auth token file {path}: "
                           f"{getattr(exc, 'strerror', None) or exc}") from None
    if not token:
        raise InvalidInput(f"the auth token file {path} is empty")
    return token


def pick_token(token: Optional[str], token_file: Optional[str]) -> Optional[str]:
    """The auth token from ``--auth-token-file``, else ``--auth-token`` / the env var."""
    if token_file and token:
        raise InvalidInput(f"give the auth token one way: --auth-token-file, or {TOKEN_ENV} "
                           "/ --auth-token, not both")
    return read_token_file(token_file) if token_file else token


@click.command(short_help="Serve the web dashboard (queues, jobs, schedules, workers).")
@url_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on (anything but loopback needs an auth token).")
@click.option("--port", type=click.IntRange(0, 65535), default=8270, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--read-only", is_flag=True, help="Hide every action and refuse them (403).")
@click.option("--auth-token", envvar=TOKEN_ENV, default=None, metavar="TOKEN",
              help=f"Require this token (header or login form). Prefer ${TOKEN_ENV} or "
                   "--auth-token-file: an argument shows in the process list.")
@click.option("--auth-token-file", default=None, metavar="PATH",
              help="Read the token from this file (at least 16 characters).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="Also answer requests for this Host name (repeatable), e.g. the name a "
                   "proxy or other machines reach it by; '*' answers any.")
def dashboard(host: str, port: int, read_only: bool, auth_token: Optional[str],
              auth_token_file: Optional[str], allowed_hosts: Tuple[str, ...]) -> None:
    """Serve the web dashboard: every queue, its jobs, schedules, leaderboards, workers."""
    auth_token = pick_token(auth_token, auth_token_file)
    check_exposure(host, auth_token)
    try:
        import uvicorn

        from emqfast.web import create_app
        from emqfast.web.app import check_server
    except ImportError as exc:
        raise click.ClickException(
            "the dashboard needs the web extra: pip install -e '.[web]' in a checkout, or "
            f"a built wheel with [web] ({exc})") from None
    state = current_state()
    _log_to_stderr(state.verbose)
    names = sorted(bound_names(host) | set(allowed_hosts))
    app = create_app(state.conn(), read_only=read_only, auth=auth_token, allowed_hosts=names)
    sock = bind(host, port)
    click.echo(f"emqfast dashboard on {address(host, sock.getsockname()[1])} "
               f"(Redis: {state.where()}{', read-only' if read_only else ''}); Ctrl-C stops it",
               err=False)
    problem = check_server(app.state.dashboard.client)
    if problem:  # serve anyway: the server may come up (or the password be fixed) later
        click.echo(scrub(f"warning: {problem.rstrip('.')}. Serving anyway: every page "
                         "answers 502 until the server answers."), err=True)
    if not is_loopback(host):  # reached by other names: say which it answers
        click.echo(f"answering Host names: loopback, {', '.join(names)} (more: --allowed-host "
                   "NAME)", err=True)
    # proxy_headers off: X-Forwarded-For from a local client must not pick the address
    # the login throttle counts against
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           proxy_headers=False))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn stopped, then raised the Ctrl-C again: a clean stop
        pass
    finally:
        sock.close()
