"""The ASGI layer around the whole dashboard: a request whose ``Host`` is not one the
dashboard serves is refused before any route sees it (DNS rebinding), and every
response, static files and Starlette's own 404/405 included, carries the page headers
(:data:`emqfast.web.security.HEADERS`)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, MutableMapping

from emqfast.tools.hosts import AllowedHosts
from emqfast.web.security import HEADERS

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
_HEADERS = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in HEADERS.items()]
APP_ROOT = "emqfast.app_root"  # the scope key of the dashboard's own mount path
REFUSED = (b"This server does not answer that Host name. Open it by the address it was "
           b"started on, or start it with --allowed-host NAME.\n")


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


class Shield:
    """ASGI middleware around ``app``: the Host allow-list
    (:class:`~emqfast.tools.hosts.AllowedHosts`) and the security headers on every HTTP
    response."""

    def __init__(self, app: ASGIApp, hosts: AllowedHosts):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (the dashboard has no websockets)
            await self.app(scope, receive, send)
            return
        if not self.hosts.allows(_header(scope, b"host")):
            await _refuse(send)
            return
        scope[APP_ROOT] = scope.get("root_path", "")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {bytes(k).lower() for k, _ in message.get("headers") or ()}
                message["headers"] = list(message.get("headers") or ()) + \
                    [(k, v) for k, v in _HEADERS if k not in present]
            await send(message)

        await self.app(scope, receive, with_headers)


async def _refuse(send: Send) -> None:
    """421 Misdirected Request: nothing about the server, the page headers."""
    headers: Dict[bytes, bytes] = {b"content-type": b"text/plain; charset=utf-8",
                                   b"content-length": str(len(REFUSED)).encode()}
    await send({"type": "http.response.start", "status": 421,
                "headers": list(headers.items()) + _HEADERS})
    await send({"type": "http.response.body", "body": REFUSED})
