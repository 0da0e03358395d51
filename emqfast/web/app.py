"""The dashboard's ASGI app: :func:`~emqfast.web.create_app` and what every request goes through
(auth, the login throttle, CSRF cookie and cross-site checks, error pages, security
headers, flash messages, links that work under any mount prefix)."""
from __future__ import annotations

import base64
import functools
import json
import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Dict, Optional, Sequence, Tuple
from urllib.parse import urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import (FileResponse, HTMLResponse, JSONResponse, RedirectResponse,
                                 Response)

from emqfast.core.diagnose import explain
from emqfast.core.errors import EmqError, InvalidInput
from emqfast.core.redaction import redact
from emqfast.server.connection import resolve
from emqfast.web import format as fmt
from emqfast.web.reads import (BOARD_GLOB, BOARD_TTL_S, Discovery, Queues, board_names, log,
                               one_line)
from emqfast.web.security import CSRF_COOKIE, Guard, cross_site
from emqfast.web.shield import APP_ROOT
from emqfast.web.throughput import Throughput

HERE = Path(__file__).resolve().parent
FLASH_COOKIE = "emq_flash"


class Problem(Exception):
    """An HTTP error page: ``status`` and a message for people."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Dashboard:
    """One app's state: the Redis client, queue discovery, samples, auth and templates."""

    def __init__(self, conn: Any, queues: Optional[Sequence[str]], read_only: bool,
                 auth: Optional[str]):
        self.client = resolve(conn)
        self.discovery = Discovery(self.client, queues)
        # the leaderboards page: one SCAN per TTL however many clients poll it
        self.boards = Discovery(self.client, None, match=BOARD_GLOB, parse=board_names,
                                ttl_s=BOARD_TTL_S)
        self.queues = Queues(self.client)
        self.throughput = Throughput()
        self.guard = Guard(auth)
        self.read_only = bool(read_only)
        self.env = Environment(loader=FileSystemLoader(str(HERE / "templates")),
                               autoescape=select_autoescape(default=True, default_for_string=True),
                               trim_blocks=True, lstrip_blocks=True)
        self.env.globals.update(when=fmt.when, duration=fmt.duration,
                                count_cells=fmt.count_cells, memory_kb=fmt.memory_kb,
                                child_event=fmt.child_event)
        self.where = describe(self.client)  # shown to authenticated users only

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        """A page from ``template``; every value is escaped by Jinja2's autoescape."""
        known = self.guard.allows(request.headers, request.cookies)
        context.update(request=request, read_only=self.read_only,
                       where=self.where if known else "", csrf=csrf_of(request),
                       auth=self.guard.enabled, signed_in=known,
                       link=functools.partial(link, request), flash=take_flash(request),
                       asset=functools.partial(asset, request))
        html = self.env.get_template(template).render(**context)
        response = HTMLResponse(html, status_code=status)
        if context["flash"]:
            response.delete_cookie(FLASH_COOKIE, path=cookie_path(request))
        return response

    def error_page(self, request: Request, status: int, message: str) -> Response:
        if wants_json(request):
            return JSONResponse({"error": message}, status_code=status)
        return self.render(request, "error.html", status=status, status_code=status,
                           message=message)


def check_server(client: Any, timeout_s: float = 5.0) -> Optional[str]:
    """None when the Redis server answers a PING within ``timeout_s``; else one line
    saying what is wrong (unreachable, silent, a password missing or wrong), passwords
    masked. The PING runs in a daemon thread: a host that drops packets cannot hold up
    the start for the OS's connect timeout."""
    outcome: "queue.Queue[Optional[BaseException]]" = queue.Queue()

    def ping() -> None:
        try:
            client.ping()
            outcome.put(None)
        except Exception as exc:  # noqa: BLE001 - any failure is the answer
            outcome.put(exc)
    threading.Thread(target=ping, name="emqfast-web-ping", daemon=True).start()
    try:
        exc = outcome.get(timeout=timeout_s)
    except queue.Empty:
        return f"the Redis server at {describe(client)} did not answer within {timeout_s:g} s"
    if exc is None:
        return None
    return explain(exc, clean=redact) or \
        f"cannot reach the Redis server at {describe(client)}: {one_line(exc)}"


def describe(client: Any) -> str:
    """Where the dashboard reads, without any password: ``host:port/db`` or a socket."""
    kwargs: Dict[str, Any] = getattr(getattr(client, "connection_pool", None),
                                     "connection_kwargs", {}) or {}
    if kwargs.get("path"):
        where = f"unix:{kwargs['path']}"
    elif kwargs.get("host"):
        where = f"{kwargs['host']}:{kwargs.get('port', 6379)}"
    else:
        where = type(client).__name__
    db = kwargs.get("db")
    return redact(where + (f"/{db}" if db else ""))


def app_root(request: Request) -> str:
    """The path the dashboard is mounted at ("" at the root): noted by the Shield as the
    request comes in, since a mount inside the app (``/static``) moves ``root_path``."""
    root: str = request.scope.get(APP_ROOT, request.scope.get("root_path", ""))
    return root


def cookie_path(request: Request) -> str:
    return app_root(request) or "/"


def link(request: Request, name: str, **params: Any) -> str:
    """A root-relative URL of route ``name`` (works under any mount prefix)."""
    path = app_root(request) + str(request.app.url_path_for(name))
    query = {k: v for k, v in params.items() if v is not None and v != ""}
    return path + ("?" + urlencode(query) if query else "")


def asset(request: Request, name: str) -> str:
    """The root-relative URL of a static file of the dashboard."""
    return app_root(request) + str(request.app.url_path_for("static", path="/" + name))


def csrf_of(request: Request) -> str:
    """The CSRF token of the page: the cookie's when this app signed it, else a new one
    (set as the cookie by the response; a planted or stale cookie is replaced)."""
    token = request.cookies.get(CSRF_COOKIE)
    guard: Guard = request.app.state.dashboard.guard
    if token is not None and guard.csrf_valid(token):
        return token
    fresh: str = getattr(request.state, "new_csrf", None) or guard.new_csrf()
    request.state.new_csrf = fresh
    return fresh


def wants_json(request: Request) -> bool:
    return request.url.path.rstrip("/").split("/")[-2:-1] == ["api"]


def flash(response: Response, request: Request, kind: str, text: str) -> Response:
    """Show ``text`` (``ok`` or ``error``) on the next page rendered."""
    raw = json.dumps({"kind": kind, "text": text[:600]}).encode()
    response.set_cookie(FLASH_COOKIE, base64.urlsafe_b64encode(raw).decode(),
                        path=cookie_path(request), httponly=True, samesite="strict")
    return response


def take_flash(request: Request) -> Optional[Dict[str, str]]:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        got = json.loads(base64.urlsafe_b64decode(raw.encode()))
        return {"kind": "error" if got.get("kind") == "error" else "ok",
                "text": str(got.get("text", ""))[:600]}
    except (ValueError, TypeError, AttributeError):
        return None


def _finish(request: Request, response: Response) -> Response:
    fresh = getattr(request.state, "new_csrf", None)
    if fresh and request.cookies.get(CSRF_COOKIE) != fresh:
        response.set_cookie(CSRF_COOKIE, fresh, path=cookie_path(request), httponly=True,
                            samesite="strict")
    return response


Handler = Callable[..., Response]


def client_of(request: Request) -> str:
    """Who the request comes from, for the login throttle (its peer address)."""
    return request.client.host if request.client else "?"


def _admit(dash: Dashboard, request: Request, post: bool, public: bool) -> Optional[Response]:
    """None when the request may go on; else the answer (login redirect, 401, 429)."""
    guard, who = dash.guard, client_of(request)
    offered = guard.offered_by_header(request.headers) if guard.enabled else None
    if offered is not None or (public and post):  # an auth attempt: throttled per client
        wait = guard.throttle.blocked(who)
        if wait:
            response = dash.error_page(request, 429, "too many failed attempts: try again "
                                                     f"in {math.ceil(wait)} s")
            response.headers["Retry-After"] = str(math.ceil(wait))
            return response
        if offered is not None and not guard.check_token(offered):
            guard.throttle.failed(who)
    if public or guard.allows(request.headers, request.cookies):
        return None
    if wants_json(request) or post:
        raise Problem(401, "log in first (auth token needed)")
    asked = asked_for(request)
    return RedirectResponse(link(request, "login", next=None if asked == "/" else asked), 303)


def asked_for(request: Request) -> str:
    """The page asked for, relative to the dashboard's mount path (login goes back to it)."""
    path, root = request.url.path, app_root(request)
    if root and path.startswith(root):
        path = path[len(root):]
    query = request.url.query
    return (path or "/") + ("?" + query if query else "")


def safe_next(raw: Any) -> Optional[str]:
    """``raw`` when it is a path of this dashboard (``/queue?q=...``), else None: never
    another site (``//evil.example``, ``/\\evil.example``, ``https://...``), never a
    control character or space a browser might strip to make one."""
    if not isinstance(raw, str) or not 1 <= len(raw) <= 2000 or raw[0] != "/" \
            or raw[1:2] in ("/", "\\") or "\\" in raw:
        return None
    if any(ord(c) <= 0x20 or 0x7F <= ord(c) <= 0x9F for c in raw):
        return None
    parts = urlsplit(raw)
    return raw if not parts.scheme and not parts.netloc else None


def endpoint(fn: Handler, post: bool = False, public: bool = False
             ) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a sync page handler ``fn(dash, request[, form])``: auth, CSRF on POST, the
    typed errors as error pages, headers. Redis is read in a worker thread."""
    async def handle(request: Request) -> Response:
        started = time.perf_counter()
        dash: Dashboard = request.app.state.dashboard
        try:
            refused = _admit(dash, request, post, public)
            if refused is not None:
                return _finish(request, refused)
            args: Tuple[Any, ...] = ()
            if post:
                args = (await _checked_form(dash, request),)
            response = await run_in_threadpool(fn, dash, request, *args)
        except Problem as p:
            response = dash.error_page(request, p.status, p.message)
        except InvalidInput as exc:
            response = dash.error_page(request, 400, f"{type(exc).__name__}: {redact(str(exc))}")
        except EmqError as exc:  # Redis down, a wrong password...: one log line, no traceback
            text = one_line(exc)  # %r: a hostile error cannot forge a log line
            log.warning("emqfast dashboard: %s %r answered 502: %r", request.method,
                        request.url.path, text, extra={"error": text},
                        exc_info=log.isEnabledFor(logging.DEBUG))
            response = dash.error_page(request, 502, explain(exc, clean=redact)
                                       or f"{type(exc).__name__}: {redact(str(exc))}")
        # the server's time for this page (browsers show it in their network panel)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        return _finish(request, response)
    return handle


NO_PAGE = "there is no page at this address"


async def no_page(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (no route, no static file) and 405 as the dashboard's error
    page (or JSON under ``/api/``), with the page headers and a link home."""
    status = int(getattr(exc, "status_code", 404))
    allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
    message = NO_PAGE if status == 404 else \
        f"{request.method} is not allowed here (only {allowed or 'other methods'})"
    response = request.app.state.dashboard.error_page(request, status, message)
    for key, value in (getattr(exc, "headers", None) or {}).items():  # Allow, for a 405
        response.headers[key] = value
    return _finish(request, response)


async def favicon(request: Request) -> Response:
    """The icon browsers ask for at ``/favicon.ico`` (pages link the same SVG)."""
    return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")


async def _checked_form(dash: Dashboard, request: Request) -> Any:
    """A POST's form, once it is known to come from this dashboard's own pages (or a
    script holding the token): same origin, and the signed CSRF token of its cookie."""
    why = cross_site(request.headers)
    if why:
        raise Problem(403, f"refused: {why}")
    form = await request.form()
    if not dash.guard.by_header(request.headers) and \
            not dash.guard.csrf_ok(request.cookies, form):
        raise Problem(403, "the form's CSRF token is missing or stale: reload the page and "
                           "try again")
    return form
