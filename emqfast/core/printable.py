"""Untrusted text made safe to print or log: every control character shown as an escape.

Queue names, job ids, payloads and error messages come from whoever can enqueue. Written
raw to a terminal or a log file, an ESC or C1 sequence steers the terminal (clears it,
sets its title, plants an OSC 8 link) and a newline forges a log line of its own.
:func:`printable` writes each such character as a visible escape (``\\x1b``, ``\\x9b``,
``\\u202e``) and leaves every other character, any script's letters included, as it is.
"""
from __future__ import annotations

import re
from typing import Match

# C0 and C1 controls, DEL, lone surrogates, and the invisible format characters that
# reorder or hide text (bidi embeddings/overrides/isolates, zero-width marks, line and
# paragraph separators, BOM): a terminal obeys or hides them.
UNSEEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e"
                    "\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]")
# the same, but newline and tab, for text whose lines are meant (a traceback)
UNSEEN_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f"
                              "\u2028-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]")


def _escape(match: Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, lines: bool = False) -> str:
    """``text`` with every control or invisible formatting character written as an
    escape (``\\x1b``, ``\\x9b``, ``\\u202e``), so a terminal or a log shows it instead of
    obeying it. ``lines``: keep newlines and tabs (a traceback); ``\\r`` is always
    escaped (it would overwrite the line)."""
    return (UNSEEN_BUT_LINES if lines else UNSEEN).sub(_escape, text)
