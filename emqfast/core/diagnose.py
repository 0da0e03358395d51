"""Plain-words explanations of connection, credential and permission failures.

Redis and redis-py word these for protocol people ("HELLO must be called with the
client already authenticated...", "Protocol error: unauthenticated multibulk
length"); :func:`explain` says what is wrong and what to do, for the CLI and for
logs. It never echoes a URL: callers scrub the result anyway.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

# A server that needs a password, contacted without one (redis-py under RESP3 sends
# HELLO first; RESP2 gets NOAUTH; a pipelined hiredis batch is cut with a protocol error).
_PASSWORD_MISSING = re.compile(
    r"NOAUTH|Authentication required|HELLO must be called with the client already "
    r"authenticated|unauthenticated (multi)?bulk|requires a password and none was given", re.I)
_PASSWORD_WRONG = re.compile(r"WRONGPASS|invalid username-password|invalid password", re.I)
_NO_PERMISSION = re.compile(r"NOPERM|no permissions to", re.I)

HOW_TO_PASS_A_PASSWORD = (
    "put it in the URL: --url 'redis://:PASSWORD@HOST:PORT/0' (or "
    "'redis://USER:PASSWORD@HOST:PORT/0' for an ACL user; percent-encode '@', '/' and ':' "
    "in it), or the same in EMQ_REDIS_URL")


def password_missing(text: str) -> bool:
    """True when ``text`` is a server's way of saying it wants a password."""
    return bool(_PASSWORD_MISSING.search(text))


def explain(exc: BaseException, clean: Callable[[str], str] = lambda text: text) -> Optional[str]:
    """One line saying what went wrong and what to do, for a credential or permission
    failure; None for anything else (the caller shows the error as it is).

    ``clean`` is applied to the error's own text (to scrub secrets), not to the advice:
    the advice's example URL is shaped like a password, and must not be masked."""
    text = clean(str(exc))
    if password_missing(text):
        return f"the Redis server requires a password and none was given: {HOW_TO_PASS_A_PASSWORD}"
    if _PASSWORD_WRONG.search(text):
        return ("authentication failed: wrong user name or password, or the user is disabled "
                f"({text.strip()}); check the credentials in --url / EMQ_REDIS_URL")
    if _NO_PERMISSION.search(text):
        return (f"permission denied: the Redis user lacks a right emqfast needs ({text.strip()}); "
                "grant it the least-privilege ACL rule from the README (Security)")
    return None


def is_permanent(exc: BaseException) -> bool:
    """True for failures retrying cannot fix: credentials and ACL rights."""
    return explain(exc) is not None
