"""An mkdocs hook: a strict build fails on every warning, ``--quiet`` or not.

``mkdocs build --quiet`` raises the ``mkdocs`` logger to ERROR, so a warning (a broken
link, an unresolved cross-reference from mkdocs-autorefs) is dropped before strict mode
counts it, and ``mkdocs build --strict --quiet`` (``make docs``) passed with broken
references. In a strict build this hook lowers the logger back to WARNING: info stays
quiet, and a warning is printed and fails the build.

Registered in mkdocs.yml (``hooks:``).
"""
from __future__ import annotations

import logging
from typing import Any


def on_config(config: Any) -> Any:
    logger = logging.getLogger("mkdocs")
    if config.strict and logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    return config
