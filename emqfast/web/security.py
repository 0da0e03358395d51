"""Who may look and who may act: the auth token, CSRF tokens, response headers.

- **Auth** (``create_app(auth="TOKEN")``): a request is let in with the header
  ``Authorization: Bearer TOKEN`` (or ``X-Emqfast-Token: TOKEN``), or with the cookie the
  login form sets, which holds an HMAC of the token under a secret drawn at start (never
  the token itself; a restart logs everyone out).
- **CSRF**: every state-changing request is a POST whose form carries the token of the
  ``emq_csrf`` cookie (double submit; the cookie is SameSite=Strict and HttpOnly), compared
  in constant time. A request authenticated by header (a script) is not a browser's,
  so it needs no CSRF token.
- **Headers**: a strict Content-Security-Policy (scripts and styles from this app only, no
  inline script), no framing, no referrer, no MIME sniffing."""
from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any, Mapping, Optional

CSRF_COOKIE = "emq_csrf"
AUTH_COOKIE = "emq_auth"
CSRF_FIELD = "csrf"
HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; "
                                "img-src 'self' data:; connect-src 'self'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class Guard:
    """The auth token check and the CSRF tokens of one app."""

    def __init__(self, token: Optional[str]):
        if token is not None and (not isinstance(token, str) or len(token) < 8):
            from emqfast.core.errors import InvalidInput

            raise InvalidInput("auth token must be a str of at least 8 characters")
        self.token = token
        self._secret = secrets.token_bytes(32)

    @property
    def enabled(self) -> bool:
        return self.token is not None

    def login_cookie(self) -> str:
        """The value the login form's cookie holds: an HMAC of the token, not the token."""
        assert self.token is not None
        return hmac.new(self._secret, self.token.encode(), hashlib.sha256).hexdigest()

    def check_token(self, offered: Optional[str]) -> bool:
        """Whether ``offered`` is the auth token (constant time)."""
        if self.token is None or not offered:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def by_header(self, headers: Mapping[str, str]) -> bool:
        """The request carries the token in a header (a script, not a browser form)."""
        bearer = headers.get("authorization", "")
        if bearer[:7].lower() == "bearer ":
            return self.check_token(bearer[7:].strip())
        return self.check_token(headers.get("x-emqfast-token"))

    def allows(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> bool:
        """Whether the request may see the dashboard."""
        if self.token is None or self.by_header(headers):
            return True
        cookie = cookies.get(AUTH_COOKIE, "")
        return bool(cookie) and hmac.compare_digest(cookie.encode(), self.login_cookie().encode())


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(cookies: Mapping[str, str], form: Mapping[str, Any]) -> bool:
    """The form's CSRF field matches the cookie's token (constant time)."""
    cookie, sent = cookies.get(CSRF_COOKIE, ""), form.get(CSRF_FIELD, "")
    if not cookie or not isinstance(sent, str) or not sent:
        return False
    return hmac.compare_digest(cookie.encode(), sent.encode())
