"""``emqfast metrics --serve``: the Prometheus text metrics over HTTP on loopback, for
the Host names it is bound to only (:mod:`emqfast.tools.hosts`: a web page rebinding
its own name to 127.0.0.1 gets 421, not the queue names and counts)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, List, Tuple
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

from emqfast.tools.hosts import AllowedHosts

WSGIApp = Callable[[Any, Any], Iterable[bytes]]
SAFE_HEADERS = [("X-Content-Type-Options", "nosniff"), ("Cache-Control", "no-store")]
REFUSED = b"This server does not answer that Host name (--allowed-host NAME adds one).\n"


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        """No access log on stderr."""


def host_checked(app: WSGIApp, hosts: AllowedHosts) -> WSGIApp:
    """``app`` answering only requests whose Host ``hosts`` allows (else 421)."""
    def checked(environ: Any, start_response: Any) -> Iterable[bytes]:
        if not hosts.allows(environ.get("HTTP_HOST")):
            start_response("421 Misdirected Request",
                           [("Content-Type", "text/plain; charset=utf-8"), *SAFE_HEADERS])
            return [REFUSED]

        def start(status: str, headers: List[Tuple[str, str]], *exc: Any) -> Any:
            return start_response(status, list(headers) + SAFE_HEADERS, *exc)
        return app(environ, start)
    return checked


def serve(registry: CollectorRegistry, port: int, hosts: AllowedHosts,
          addr: str = "127.0.0.1") -> Tuple[Any, threading.Thread]:
    """Serve ``registry`` on ``addr:port`` (0: a free port) in a daemon thread; the
    server (``server_port``, ``shutdown()``) and its thread."""
    app = host_checked(make_wsgi_app(registry), hosts)
    server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="emqfast-metrics", daemon=True)
    thread.start()
    return server, thread
