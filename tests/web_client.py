"""Starlette's TestClient as a browser on this machine would be: its requests carry
``Host: 127.0.0.1`` (the dashboard answers loopback names only by default, and the
TestClient's own ``testserver`` is not one)."""
from __future__ import annotations

from typing import Any

from starlette.testclient import TestClient as _TestClient


class TestClient(_TestClient):
    """:class:`starlette.testclient.TestClient` with ``base_url`` http://127.0.0.1."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, app: Any, base_url: str = "http://127.0.0.1", **kwargs: Any):
        super().__init__(app, base_url=base_url, **kwargs)
