"""``emqfast dashboard``: serve the web dashboard (:mod:`emqfast.web`) with uvicorn.

    emqfast dashboard [--host 127.0.0.1] [--port 8270] [--url URL] [--read-only]
                      [--auth-token TOKEN]

On the embedded Redis by default, like every command. It binds loopback unless told
otherwise, and refuses a host other people can reach without ``--auth-token``: the
dashboard can retry, cancel and delete jobs."""
from __future__ import annotations

import ipaddress
import socket
from typing import Optional

import click

from emqfast.core.errors import InvalidInput
from emqfast.tools.cli_state import current_state, url_option

TOKEN_ENV = "EMQ_DASHBOARD_TOKEN"


class ExposedWithoutAuth(InvalidInput):
    """The dashboard would listen where others can reach it, without an auth token."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name that may resolve anywhere


def check_exposure(host: str, token: Optional[str]) -> None:
    """Refuse a non-loopback ``host`` without an auth token (typed error saying why)."""
    if not is_loopback(host) and not token:
        raise ExposedWithoutAuth(
            f"refusing to serve the dashboard on {host}: other machines could reach it, and "
            "it can retry, cancel and delete jobs. Pass --auth-token TOKEN (or set "
            f"{TOKEN_ENV}), or keep the default --host 127.0.0.1")


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


@click.command()
@url_option
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface to listen on (anything but loopback needs --auth-token).")
@click.option("--port", type=click.IntRange(0, 65535), default=8270, show_default=True,
              help="TCP port (0: any free port).")
@click.option("--read-only", is_flag=True, help="Hide every action and refuse them (403).")
@click.option("--auth-token", envvar=TOKEN_ENV, default=None, metavar="TOKEN",
              help=f"Require this token (header or login form). Also ${TOKEN_ENV}.")
def dashboard(host: str, port: int, read_only: bool, auth_token: Optional[str]) -> None:
    """Serve the web dashboard: every queue, its jobs, schedules, leaderboards, workers."""
    check_exposure(host, auth_token)
    try:
        import uvicorn

        from emqfast.web import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the web extra: pip install 'emqfast[web]' ({exc})") from None
    state = current_state()
    app = create_app(state.conn(), read_only=read_only, auth=auth_token)
    sock = bind(host, port)
    click.echo(f"emqfast dashboard on {address(host, sock.getsockname()[1])} "
               f"(Redis: {state.where()}{', read-only' if read_only else ''}); Ctrl-C stops it",
               err=False)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
