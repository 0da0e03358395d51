"""Who may look and who may act: the auth token, sessions, CSRF tokens, cross-site
checks, response headers.

- **Host** (:mod:`emqfast.tools.hosts`, applied by :mod:`emqfast.web.shield`): only the
  Host names the dashboard is bound to are served (DNS rebinding).
- **Auth** (``create_app(auth="TOKEN")``, at least 16 characters, not from a tiny
  alphabet): a request is let in with the header ``Authorization: Bearer TOKEN`` (or
  ``X-Emqfast-Token: TOKEN``), or with the session cookie the login form sets: a random
  session id per login (never the token), revoked by logout, expired after
  :data:`SESSION_TTL_S`. A client's failed attempts (form or header) are rate-limited:
  after :data:`MAX_FAILURES` within :data:`FAILURE_WINDOW_S` every attempt of that
  client is refused (429) until the window has passed, the right token included.
- **CSRF**: every state-changing request is a POST whose form carries the token of the
  ``emq_csrf`` cookie (double submit; SameSite=Strict, HttpOnly), and that token is
  signed with a secret drawn at start, so a cookie planted from another port of the
  same host (cookies ignore ports) is worth nothing. A POST whose ``Origin`` names
  another origin, or whose ``Sec-Fetch-Site`` is not ``same-origin``, is refused
  whatever it carries. A request authenticated by header (a script) needs no CSRF token.
- **Headers**: a strict Content-Security-Policy (scripts and styles from this app only, no
  inline script), no framing, no referrer, no MIME sniffing, on every response."""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Deque, Mapping, Optional

from emqfast.core.errors import InvalidInput
from emqfast.tools.hosts import host_name

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
MIN_TOKEN_CHARS = 16
MIN_TOKEN_BITS = 64  # estimated from its length and the character classes it draws on
MIN_DISTINCT_CHARS = 8
SESSION_TTL_S = 12 * 3600
MAX_SESSIONS = 10_000  # the oldest logins go first past this
MAX_FAILURES = 10
FAILURE_WINDOW_S = 60.0
MAX_CLIENTS_TRACKED = 10_000
TOKEN_HINT = "make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"


def check_token_strength(token: Any) -> str:
    """``token`` if it is a str of at least :data:`MIN_TOKEN_CHARS` characters drawing on
    enough different characters to be hard to guess, else :class:`InvalidInput`."""
    if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
        raise InvalidInput(f"auth token must be a str of at least {MIN_TOKEN_CHARS} "
                           f"characters; {TOKEN_HINT}")
    classes = [any(c.islower() for c in token), any(c.isupper() for c in token),
               any(c.isdigit() for c in token), any(not c.isalnum() for c in token)]
    alphabet = sum(size for size, seen in zip((26, 26, 10, 32), classes) if seen)
    bits = len(token) * math.log2(max(alphabet, 2))
    repeated = any(token == (token[:k] * len(token))[:len(token)]
                   for k in range(1, len(token) // 2 + 1))
    if repeated or len(set(token)) < MIN_DISTINCT_CHARS or bits < MIN_TOKEN_BITS:
        raise InvalidInput(f"auth token is too easy to guess (too few different characters "
                           f"for its length, or a repeated pattern); {TOKEN_HINT}")
    return token


class Throttle:
    """Failed auth attempts per client: :meth:`blocked` once a client failed
    :data:`MAX_FAILURES` times within :data:`FAILURE_WINDOW_S` (memory bounded)."""

    def __init__(self, limit: int = MAX_FAILURES, window_s: float = FAILURE_WINDOW_S):
        self.limit, self.window_s = limit, window_s
        self._failures: "OrderedDict[str, Deque[float]]" = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> Deque[float]:
        times = self._failures.get(client) or deque()
        while times and now - times[0] > self.window_s:
            times.popleft()
        return times

    def blocked(self, client: str) -> float:
        """Seconds until ``client`` may try again (0: now)."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            return self.window_s - (now - times[0]) if len(times) >= self.limit else 0.0

    def failed(self, client: str) -> None:
        """Count one failed attempt of ``client``."""
        now = time.monotonic()
        with self._lock:
            times = self._recent(client, now)
            times.append(now)
            self._failures[client] = times
            self._failures.move_to_end(client)
            while len(self._failures) > MAX_CLIENTS_TRACKED:
                self._failures.popitem(last=False)


class Guard:
    """The auth token check, the login sessions and the CSRF tokens of one app."""

    def __init__(self, token: Optional[str]):
        self.token = None if token is None else check_token_strength(token)
        self._secret = secrets.token_bytes(32)
        self._sessions: "OrderedDict[str, float]" = OrderedDict()  # session id -> expiry
        self._lock = threading.Lock()
        self.throttle = Throttle()

    @property
    def enabled(self) -> bool:
        """Whether an auth token is required."""
        return self.token is not None

    # --- the token and the sessions ---------------------------------------------------
    def check_token(self, offered: Optional[str]) -> bool:
        """Whether ``offered`` is the auth token (constant time)."""
        if self.token is None or not offered:
            return False
        return hmac.compare_digest(offered.encode(), self.token.encode())

    def offered_by_header(self, headers: Mapping[str, str]) -> Optional[str]:
        """The token a request offers in a header, if any."""
        bearer = headers.get("authorization", "")
        if bearer[:7].lower() == "bearer ":
            return bearer[7:].strip()
        return headers.get("x-emqfast-token")

    def by_header(self, headers: Mapping[str, str]) -> bool:
        """The request carries the token in a header (a script, not a browser form)."""
        return self.check_token(self.offered_by_header(headers))

    def new_session(self) -> str:
        """A fresh random session id for a login (the login cookie's value)."""
        sid = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[self._key(sid)] = time.monotonic() + SESSION_TTL_S
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return sid

    def end_session(self, sid: Optional[str]) -> None:
        """Revoke a session (logout): its cookie opens nothing any more."""
        if sid:
            with self._lock:
                self._sessions.pop(self._key(sid), None)

    def session_ok(self, sid: Optional[str]) -> bool:
        """Whether ``sid`` is a live session (made by a login, not revoked, not expired)."""
        if not sid:
            return False
        key = self._key(sid)
        with self._lock:
            expiry = self._sessions.get(key)
            if expiry is not None and expiry < time.monotonic():
                del self._sessions[key]
                expiry = None
        return expiry is not None

    def _key(self, sid: str) -> str:
        # stored hashed: a dict lookup on the raw id would not be constant time
        return hmac.new(self._secret, b"session:" + sid.encode(), hashlib.sha256).hexdigest()

    def allows(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> bool:
        """Whether the request may see the dashboard."""
        if self.token is None or self.by_header(headers):
            return True
        return self.session_ok(cookies.get(AUTH_COOKIE))

    # --- CSRF ------------------------------------------------------------------------
    def new_csrf(self) -> str:
        """A CSRF token: a random nonce and its signature under this app's secret."""
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._sign(nonce)}"

    def csrf_valid(self, token: Optional[str]) -> bool:
        """Whether ``token`` is one this app signed (a planted cookie is not)."""
        nonce, dot, mac = (token or "").partition(".")
        return bool(nonce and dot) and hmac.compare_digest(mac.encode(),
                                                           self._sign(nonce).encode())

    def _sign(self, nonce: str) -> str:
        return hmac.new(self._secret, b"csrf:" + nonce.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, cookies: Mapping[str, str], form: Mapping[str, Any]) -> bool:
        """The form's CSRF field matches the cookie's token (constant time), and the
        token is one this app signed."""
        cookie, sent = cookies.get(CSRF_COOKIE, ""), form.get(CSRF_FIELD, "")
        if not cookie or not isinstance(sent, str) or not sent:
            return False
        return hmac.compare_digest(cookie.encode(), sent.encode()) and self.csrf_valid(cookie)


def cross_site(headers: Mapping[str, str]) -> Optional[str]:
    """Why a state-changing request comes from another site (None when it does not):
    its ``Sec-Fetch-Site`` is not ``same-origin``, or its ``Origin`` is not the origin the
    request was sent to (its Host; ``null`` counts as foreign unless Sec-Fetch-Site
    vouched for the request). Requests without either (scripts, old browsers) rely on
    the CSRF token alone."""
    site = headers.get("sec-fetch-site")
    if site is not None and site.lower() not in ("same-origin", "none"):
        return f"the request came from another site (Sec-Fetch-Site: {site[:40]})"
    origin = headers.get("origin")
    if origin is None or (origin.strip() == "null" and site is not None):
        # Chromium sends "Origin: null" on same-origin form posts of a page whose
        # Referrer-Policy is no-referrer (ours); its Sec-Fetch-Site said same-origin
        return None
    scheme, sep, netloc = origin.strip().lower().partition("://")
    host = headers.get("host", "").strip().lower()
    if not sep or scheme not in ("http", "https") or not host or netloc != host \
            or host_name(netloc) is None:
        return f"the request came from another origin (Origin: {origin[:80]})"
    return None
