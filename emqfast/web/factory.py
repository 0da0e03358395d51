""":func:`create_app`: the dashboard's routes (pages, actions, login, static files) on one
Starlette app."""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from emqfast.tools.hosts import AllowedHosts
from emqfast.web import actions, pages
from emqfast.web.app import HERE, Dashboard, endpoint, favicon, no_page
from emqfast.web.shield import Shield


def create_app(conn: Any = None, *, queues: Optional[Sequence[str]] = None,
               read_only: bool = False, auth: Optional[str] = None,
               allowed_hosts: Optional[Iterable[str]] = None) -> Starlette:
    """The dashboard as a Starlette ASGI app.

    ``conn``: anything :func:`emqfast.connect` accepts (a URL, a client; None: the
    embedded Redis). ``queues`` limits it to those queues (default: every queue found by
    SCAN over ``emq:{*}:meta``). ``read_only`` hides every action and refuses them (403).
    ``auth``: a token (at least 16 characters, not from a tiny alphabet) required as an
    ``Authorization: Bearer`` header, or entered once in the login form (a session
    cookie then). ``allowed_hosts``: the ``Host`` names it answers besides the loopback
    ones (``localhost``, ``127.0.0.1``, ``[::1]``), e.g. the name it is reached by
    through a proxy; ``["*"]`` answers any (the proxy checks it). Any other Host gets
    421 (a web page rebinding its own name to this machine's address). Mount it under
    any prefix (``Mount("/jobs", create_app(conn))``): links are relative to the mount
    point.
    """
    dash = Dashboard(conn, queues, read_only, auth)
    routes: List[BaseRoute] = [
        Route(path, endpoint(fn, post=method == "POST", public=public), name=name,
              methods=[method])
        for path, name, method, fn, public in pages.ROUTES + actions.ROUTES]
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))
    routes.append(Route("/favicon.ico", favicon, name="favicon"))  # GET and HEAD
    hosts = AllowedHosts(allowed_hosts or ())
    app = Starlette(routes=routes, middleware=[Middleware(Shield, hosts=hosts)],
                    exception_handlers={404: no_page, 405: no_page})
    app.state.dashboard = dash
    return app
