""":func:`create_app`: the dashboard's routes (pages, actions, login, static files) on one
Starlette app."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from emqfast.web import actions, pages
from emqfast.web.app import HERE, Dashboard, endpoint


def create_app(conn: Any = None, *, queues: Optional[Sequence[str]] = None,
               read_only: bool = False, auth: Optional[str] = None) -> Starlette:
    """The dashboard as a Starlette ASGI app.

    ``conn``: anything :func:`emqfast.connect` accepts (a URL, a client; None: the
    embedded Redis). ``queues`` limits it to those queues (default: every queue found by
    SCAN over ``emq:{*}:meta``). ``read_only`` hides every action and refuses them (403).
    ``auth``: a token (at least 8 characters) required as an ``Authorization: Bearer``
    header, or entered once in the login form (a cookie then). Mount it under any prefix
    (``Mount("/jobs", create_app(conn))``): links are relative to the mount point.
    """
    dash = Dashboard(conn, queues, read_only, auth)
    routes: List[BaseRoute] = [
        Route(path, endpoint(fn, post=method == "POST", public=public), name=name,
              methods=[method])
        for path, name, method, fn, public in pages.ROUTES + actions.ROUTES]
    routes.append(Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"))
    app = Starlette(routes=routes)
    app.state.dashboard = dash
    return app
