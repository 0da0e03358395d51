"""The C Batcher on Redis Cluster: a queue is one slot, so a columnar bulk of
its calls (``enqueue_many``) goes straight to that slot's master over the C core's own
connection, instead of through redis-py's ClusterPipeline.

The slot map is redis-py's (``client.nodes_manager``), so both paths agree on it. Calls
answered ``MOVED`` did not run: the map is updated and they go to the new master (at most
:data:`REDIRECTS` rounds). Calls answered ``ASK`` / ``TRYAGAIN`` (the slot is migrating)
did not run either and are handed to redis-py's path, which speaks ``ASKING``. A master
that cannot be reached before a byte left (a failover) is looked up again once the map
is refreshed; a batch cut after bytes left is never re-sent (``BatchCut``, as ever).
``evalsha_many`` whose calls all lie in one slot (a Worker's outcome writes: one queue)
goes the same way; calls over several slots (``promote_many`` across queues) and the rest
go through redis-py's cluster path.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from redis.exceptions import AskError, MovedError, TryAgainError

from emqfast.backends import pure_batcher
from emqfast.backends.transport import cut_error
from emqfast.backends.transport import Wait
from emqfast.core.errors import BackendUnavailable, ConnectionFailed
from emqfast.core.ops import as_bytes, rows_per_call

REDIRECTS = 5
NodeBatcher = Callable[[Dict[str, Any]], Any]  # connection params -> a C Batcher


def node_params(client: Any) -> Dict[str, Any]:
    """What every node's C connection shares (credentials, timeouts); refuses TLS."""
    kw = dict(getattr(client.nodes_manager, "connection_kwargs", {}) or {})
    if kw.get("ssl") or kw.get("connection_class", object).__name__.startswith("SSL"):
        raise BackendUnavailable("the C batcher does not speak TLS to cluster nodes")
    username, password = kw.get("username"), kw.get("password")
    provider = kw.get("credential_provider")
    if provider is not None:
        creds = provider.get_credentials()
        username, password = (creds[0], creds[1]) if len(creds) == 2 else (None, creds[0])
    return dict(username=username, password=password, db=0,
                socket_timeout=kw.get("socket_timeout"),
                socket_connect_timeout=kw.get("socket_connect_timeout"))


def _redirect(reply: Any) -> Optional[str]:
    """'moved', 'ask' (ASK or TRYAGAIN: the slot is migrating) or None."""
    if isinstance(reply, MovedError):  # (redis-py's parser names the reply by its class)
        return "moved"
    if isinstance(reply, (AskError, TryAgainError)):
        return "ask"
    return None


class ClusterBatcher:
    """A Batcher for a ``RedisCluster`` client: columnar bulks through the C core to the
    slot's master (``node_batcher`` gives the shared C connection for a node's params),
    the rest through redis-py."""

    def __init__(self, client: Any, node_batcher: NodeBatcher) -> None:
        self.client = client
        self._params = node_params(client)
        self._node_batcher = node_batcher
        self._pure = pure_batcher.Batcher.from_redis(client)

    def evalsha_many(self, sha: str, script: bytes, numkeys: int,
                     calls: Sequence[Sequence[Any]], wait: Wait = None) -> List[Any]:
        """As the C Batcher's: calls whose first keys share one slot go to its master
        over the C core (a partitioned queue's Worker writes each partition's outcomes so,
        at the cost of one queue on one server); the rest through redis-py."""
        slot = None if wait or numkeys < 1 else self._one_slot(calls)
        if slot is None:
            return self._pure.evalsha_many(sha, script, numkeys, calls,
                                           *((wait,) if wait else ()))
        replies = self._on_master(slot, lambda b: b.evalsha_many(sha, script, numkeys, calls))
        again = [i for i, reply in enumerate(replies) if _redirect(reply)]
        if again:  # moved or migrating: none of those ran; redis-py follows the redirect
            if any(_redirect(replies[i]) == "moved" for i in again):
                self._refresh()
            for i, reply in zip(again, self._pure.evalsha_many(
                    sha, script, numkeys, [calls[i] for i in again])):
                replies[i] = reply
        return replies

    def _one_slot(self, calls: Sequence[Sequence[Any]]) -> Optional[int]:
        """The slot of every call's first key, or None when they differ."""
        keyslot = self.client.keyslot
        slots = {keyslot(as_bytes(call[0])) for call in calls}
        return slots.pop() if len(slots) == 1 else None

    def evalsha_flat(self, *args: Any) -> Any:
        return self._pure.evalsha_flat(*args)

    def evalsha_columns(self, sha: str, script: bytes, numkeys: int,
                        slots: Sequence[Tuple[Any, ...]], columns: Sequence[Sequence[Any]],
                        wait: Wait = None) -> List[Any]:
        """As the C Batcher's, sent to the master of the slot of the first key slot."""
        nrows = len(columns[0]) if columns else 0
        if not nrows or numkeys < 1:
            return self._pure.evalsha_columns(sha, script, numkeys, slots, columns,
                                              *((wait,) if wait else ()))
        slot = self.client.keyslot(as_bytes(slots[0][0]))
        rows = rows_per_call(slots)
        ncalls = -(-nrows // rows)
        replies: List[Any] = [None] * ncalls
        todo, acked = list(range(ncalls)), None
        for _ in range(REDIRECTS):
            sub = _rows_of(columns, todo, rows, nrows)
            try:
                got = self._on_master(slot, lambda b: b.evalsha_columns(
                    sha, script, numkeys, slots, sub, *((wait,) if wait else ())))
            except ConnectionFailed as exc:
                cut = getattr(exc, "replies", None)
                if cut is None or len(todo) == ncalls:
                    raise  # the first round: its replies are the whole batch's
                for i, reply in zip(todo, cut):  # a later round: keep what landed before
                    replies[i] = reply
                raise cut_error(exc, replies) from exc
            if wait:
                acked = got[-1] if acked is None else min(acked, got[-1])
                got = got[:-1]
            moved, asked = [], []
            for i, reply in zip(todo, got):
                replies[i] = reply
                kind = _redirect(reply)
                if kind == "moved":
                    moved.append(i)
                elif kind == "ask":
                    asked.append(i)
            if asked:  # migrating: redis-py's path sends ASKING
                again = self._pure.evalsha_columns(sha, script, numkeys, slots,
                                                   _rows_of(columns, asked, rows, nrows),
                                                   *((wait,) if wait else ()))
                if wait:
                    acked = min(acked, again[-1]) if acked is not None else again[-1]
                    again = again[:-1]
                for i, reply in zip(asked, again):
                    replies[i] = reply
            if not moved:
                break
            self._refresh()
            todo = moved
        return replies + [acked or 0] if wait else replies

    def _on_master(self, slot: int, send: Callable[[Any], List[Any]]) -> List[Any]:
        """``send(batcher)``: one C batch to the slot's master; looked up again once if it
        cannot be reached before a byte left (nothing ran: safe)."""
        for attempt in (0, 1):
            node = self.client.nodes_manager.get_node_from_slot(slot)
            batcher = self._node_batcher(dict(self._params, host=node.host, port=node.port))
            try:
                return send(batcher)
            except ConnectionFailed as exc:
                if getattr(exc, "replies", None) is not None or attempt:
                    raise  # bytes left (BatchCut), or the refreshed master is down too
                self._refresh()
        raise AssertionError("unreachable")

    def _refresh(self) -> None:
        """Re-read the slot map (after a MOVED, or a master that cannot be reached)."""
        try:
            self.client.nodes_manager.initialize()
        except Exception:  # every node down: the next call reports it
            pass

    def close(self) -> None:
        """Nothing to release: the node connections are the shared C Batchers."""

    def __enter__(self) -> "ClusterBatcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _rows_of(columns: Sequence[Sequence[Any]], calls: List[int], rows: int,
             nrows: int) -> List[List[Any]]:
    """The columns restricted to the rows of ``calls`` (whole calls: the grouping holds)."""
    picked = [r for i in calls for r in range(i * rows, min((i + 1) * rows, nrows))]
    return [[col[r] for r in picked] for col in columns]

