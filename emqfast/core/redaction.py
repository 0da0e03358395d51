"""Masking secrets in anything emqfast echoes (errors, logs, the CLI's output).

Nothing here parses URLs: a malformed URL (scheme missing, ``redis//`` typos, an
unencoded ``@`` or ``/`` in the password) is exactly the one a parser misreads, and
then quotes a piece of the password as a host or port. Instead, in every
whitespace-separated word that holds an ``@``, whatever looks like userinfo is masked:
from the first ``:`` that is not a scheme's (``redis:/``, ``redis://``) up to the LAST
``@`` of the word. ``password=...`` (redis-py's query form) is
masked wherever it appears. Masking too much is fine; leaking is not.
"""
from __future__ import annotations

import re
from typing import Iterable, List, Optional, Tuple
from urllib.parse import unquote  # decoding only: no parsing

MASK = "***"

_WORD = re.compile(r"\S+")
_PASSWORD_PARAM = re.compile(r"((?:password|passwd|pwd|pass)=)[^&#\s'\"]*", re.I)
_PIECE_SEPARATORS = re.compile(r"[/@:?#&=\[\]]")
# a scheme ending at the colon: ``redis``, ``rediss+cluster`` (after start or punctuation)
_SCHEME_END = re.compile(r"(?:^|[^\w/:@%.+-])[A-Za-z][\w+.-]*$")
_MIN_PIECE = 3  # shorter pieces of a password would mask ordinary text (ports, "db")


def _userinfo_span(word: str) -> Optional[Tuple[int, int]]:
    """(start, end) of the secret part of ``word``'s userinfo, or None when it has none."""
    at = word.rfind("@")
    if at <= 0:
        return None
    head = word[:at]
    colon = head.find(":")
    while colon >= 0 and head.startswith("/", colon + 1) and _SCHEME_END.search(head, 0, colon):
        colon = head.find(":", colon + 1)  # ``redis:/`` or ``redis://``: the scheme's colon
    if colon < 0:
        return None  # ``user@host``: a user name, not a secret
    return colon + 1, at


def _mask_word(word: str) -> str:
    span = _userinfo_span(word)
    if span is None or span[0] == span[1]:
        return word
    start, end = span
    return word[:start] + MASK + word[end:]


def redact(text: str) -> str:
    """``text`` with anything that looks like a URL password replaced by ``***``.

    Works on any text (an error message, a log line, a list of URLs), whether or not
    the URLs in it parse.
    """
    if not isinstance(text, str):
        text = str(text)
    if "@" in text:
        text = _WORD.sub(lambda m: _mask_word(m.group(0)), text)
    if "=" in text:
        text = _PASSWORD_PARAM.sub(lambda m: m.group(1) + MASK, text)
    return text


def secrets_in(url: Optional[str]) -> List[str]:
    """The secret parts of ``url`` (as :func:`redact` would mask them), longest first,
    plus their pieces: a parser that misread the URL may quote a piece alone."""
    if not url:
        return []
    found: List[str] = []
    for m in _WORD.finditer(url):
        span = _userinfo_span(m.group(0))
        if span and span[0] < span[1]:
            found.append(m.group(0)[span[0]:span[1]])
    found += [m.group(0).split("=", 1)[1] for m in _PASSWORD_PARAM.finditer(url)]
    found += [unquote(secret) for secret in found if "%" in secret]
    pieces = {piece for secret in found
              for piece in [secret, *_PIECE_SEPARATORS.split(secret)] if len(piece) >= _MIN_PIECE}
    return sorted(pieces, key=len, reverse=True)


def scrub(text: str, urls: Iterable[Optional[str]] = ()) -> str:
    """``text`` redacted, and without any copy (or piece) of a secret from ``urls``.

    Use it on a message that may quote a URL the way a parser split it (a piece
    of the password as the port, say), where :func:`redact` alone cannot see it.
    """
    text = redact(text)
    for url in urls:
        for secret in secrets_in(url):
            text = text.replace(secret, MASK)
    return text
