"""Sending emqfast's commands without blind re-sends.

redis-py wraps every command and pipeline in the client's ``Retry``: when a connection
drops after Redis ran an EVALSHA but before its reply arrived, redis-py sends the same
EVALSHA again (10 times by default in redis-py 8), and a pipeline is re-sent whole.
emqfast's script calls must never be re-sent that way (a re-sent claim leases jobs
nobody sees; a re-sent batch reports its own jobs as duplicates), so they go through
:func:`execute` / :func:`execute_async` instead: the commands are written on one
connection taken from the client's pool (or, on Redis Cluster, from the pool of the
primary owning their slot) and their replies read back, once. The client's retry
policy never applies; the pool still reconnects on the next call.

What the caller learns when the connection fails:

- nothing of the batch was written: :class:`~emqfast.errors.ConnectionFailed`
  (``sent=False``: it certainly did not run);
- some of it was written: :class:`BatchCut`, a :class:`~emqfast.errors.ReplyLost`
  carrying one entry per command: its reply when it arrived, :data:`LOST` when it was
  written but its reply never came (it may have run), :data:`UNSENT` when it never left.

Error replies are returned in their slot (as redis-py's ``ResponseError`` instances),
never raised. On Cluster, ``MOVED`` and ``ASK`` replies (the command did not run) are
followed with redis-py's own slot map, as redis-py does; ``TRYAGAIN``/``CLUSTERDOWN``
stay in their slot (:func:`emqfast.errors.translate` makes them ``ServerBusy``). After a
connection failure the slot map is refreshed, so the next call finds a promoted replica.

``wait=(replicas, timeout_ms)`` appends ``WAIT replicas timeout_ms`` to the writes on the
same connection (per node), and the result then ends with one more entry: the smallest
number of replicas that acknowledged.

The exchange on one connection lives in :mod:`emqfast.backends.exchange`, the Cluster
routing and redirect rounds in :mod:`emqfast.backends.cluster_transport`; this module is
the entry both facades call.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

from emqfast.backends.cluster_transport import (cluster_execute, cluster_execute_async,
                                                routes_of)
from emqfast.backends.exchange import (LOST, UNSENT, BatchCut, Command, Failed, Wait,  # noqa: F401
                                       cut_error, min_acked, on_pool, on_pool_async, route_key,
                                       wait_lost, with_wait)

__all__ = ["LOST", "UNSENT", "BatchCut", "Command", "Wait", "cut_error", "execute",
           "execute_async", "route_key"]


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "nodes_manager")


def _single_node_result(failed: Failed, n: int, wait: Wait) -> List[Any]:
    """What a failed exchange on one node returns (only WAIT's reply lost: the writes'
    replies and 0 replicas), else raise the typed error it left."""
    got = wait_lost(failed, n, wait)
    if got is None:
        raise cut_error(failed.cause, failed.replies[:n]) from failed.cause
    return got


def execute(client: Any, commands: Sequence[Command], wait: Wait = None,
            routes: Optional[Sequence[Any]] = None) -> List[Any]:
    """Send ``commands`` once over a blocking redis-py client (see the module doc).

    On Cluster each command goes to the primary of its EVALSHA's first key, or of
    ``routes[i]`` when given (a SCRIPT LOAD for the node that met NOSCRIPT)."""
    commands = list(commands)
    if not commands:
        return [0] if wait else []
    if _is_cluster(client):
        return cluster_execute(client, commands, wait, routes_of(commands, routes))
    try:
        got = on_pool(client, with_wait(commands, wait))
    except Failed as failed:
        got = _single_node_result(failed, len(commands), wait)
    if wait:
        got[-1] = min_acked(None, got[-1])
    return got


async def execute_async(client: Any, commands: Sequence[Command], wait: Wait = None,
                        routes: Optional[Sequence[Any]] = None) -> List[Any]:
    """:func:`execute` over a ``redis.asyncio`` client."""
    commands = list(commands)
    if not commands:
        return [0] if wait else []
    if _is_cluster(client):
        return await cluster_execute_async(client, commands, wait, routes_of(commands, routes))
    try:
        got = await on_pool_async(client, with_wait(commands, wait))
    except Failed as failed:
        got = _single_node_result(failed, len(commands), wait)
    if wait:
        got[-1] = min_acked(None, got[-1])
    return got
