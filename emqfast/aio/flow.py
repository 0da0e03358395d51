"""``emqfast.aio.Flow``: :class:`emqfast.Flow` over ``redis.asyncio`` (``await
flow.enqueue()``); the graph, its checks and its admission order are the sync code."""
from __future__ import annotations

from typing import Any

from emqfast.aio.connection import LoopClients, resolve
from emqfast.backends.drive import run_async
from emqfast.core.ops import Op
from emqfast.facade.flow import Flow as _SyncFlow

__all__ = ["Flow"]


class Flow(_SyncFlow):
    """:class:`emqfast.Flow` whose :meth:`enqueue` is a coroutine. Its jobs may belong to
    ``emqfast.aio.Queue`` s or sync ones: only their names and settings are used."""

    def __init__(self, conn: Any = None):
        super().__init__(None)
        self._clients = LoopClients(resolve(conn))

    @staticmethod
    def _resolve(conn: Any) -> Any:  # the client is made per event loop (below)
        return conn

    @property
    def client(self) -> Any:
        """The ``redis.asyncio`` client for the running event loop."""
        return self._clients.current()

    def _drive(self, op: Op) -> Any:
        return self._run(op)

    async def _run(self, op: Op) -> Any:
        return await run_async(self.client, op)
