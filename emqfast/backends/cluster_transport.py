"""Redis Cluster routing for :mod:`emqfast.backends.transport`: each command goes to the
primary owning its slot, ``MOVED``/``ASK`` replies (the command did not run) are followed
with redis-py's own slot map for a bounded number of rounds, and the slot map is
refreshed after a node failed (a replica may have taken over).

Both drivers (blocking and asyncio) share the redirect loop :func:`cluster_rounds`.
"""
from __future__ import annotations

from typing import Any, Dict, Generator, List, Optional, Sequence, Tuple

import redis
from redis.exceptions import AskError, MovedError

from emqfast.backends.exchange import (UNSENT, Command, Failed, Wait, cut_error, min_acked,
                                       on_node_async, on_pool, route_key, wait_lost, with_wait)
from emqfast.core import errors

_REDIRECTS = 5  # MOVED/ASK rounds before the redirect stays in its slot as an error


def routes_of(commands: List[Command], routes: Optional[Sequence[Any]]) -> List[Any]:
    """The key each command is routed by: ``routes[i]`` when given, else its own."""
    if routes is None:
        return [route_key(c) for c in commands]
    return [r if r is not None else route_key(c) for c, r in zip(commands, routes)]


Round = Tuple[str, Any, List[int]]  # (kind, target, indices) of one redirect round


def cluster_rounds(n: int) -> Generator[Round, List[Any], None]:
    """The redirect loop of both cluster drivers, as a generator: yields
    ``(kind, target, indices)`` (kind ``"slot"``: each command to its slot's primary;
    ``"ask"``: to ``target`` after ASKING) and receives the replies, aligned."""
    todo: List[Round] = [("slot", None, list(range(n)))]
    for _ in range(_REDIRECTS + 1):
        again: List[Round] = []
        for kind, target, idx in todo:
            got = yield kind, target, idx
            moved: List[int] = []
            for i, reply in zip(idx, got):
                if isinstance(reply, MovedError):  # did not run: follow the new slot map
                    moved.append(i)
                elif isinstance(reply, AskError):  # did not run: this slot is migrating
                    again.append(("ask", (reply.host, reply.port), [i]))
            if moved:
                again.append(("slot", None, moved))
        if not again:
            return
        todo = again


def asking(commands: List[Command]) -> List[Command]:
    return [c for command in commands for c in (("ASKING",), command)]


def by_node(client: Any, routes: List[Any]) -> Dict[str, Tuple[Any, List[int]]]:
    """Commands grouped by the primary owning their slot: ``{name: (node, indices)}``."""
    groups: Dict[str, Tuple[Any, List[int]]] = {}
    for j, key in enumerate(routes):
        if key is None:
            node = client.get_default_node()
        else:
            node = client.nodes_manager.get_node_from_slot(client.keyslot(key))
        groups.setdefault(node.name, (node, []))[1].append(j)
    return groups


def cluster_round(client: Any, kind: str, target: Any, commands: List[Command],
                   routes: List[Any], wait: Wait) -> Tuple[List[Any], Optional[int]]:
    """One round of a cluster batch: (replies aligned with ``commands``, fewest acks)."""
    raw: Optional[List[Any]]  # None: wait_lost saw more than WAIT's reply lost
    if kind == "ask":
        node = client.get_node(host=target[0], port=target[1])
        if node is None:
            raise Failed(redis.exceptions.ConnectionError(f"ASK to unknown node {target}"),
                          [UNSENT] * len(commands))
        try:
            raw = on_pool(client.get_redis_connection(node), with_wait(asking(commands), wait))
        except Failed as failed:
            raise Failed(failed.cause, failed.replies[1::2]) from failed.cause
        return raw[1::2], (min_acked(None, raw[-1]) if wait else None)
    out: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    for node, members in by_node(client, routes).values():
        try:
            raw = on_pool(client.get_redis_connection(node),
                           with_wait([commands[j] for j in members], wait))
        except Failed as failed:
            raw = wait_lost(failed, len(members), wait)
            if raw is None:
                for j, reply in zip(members, failed.replies):
                    out[j] = reply
                raise Failed(failed.cause, out) from failed.cause
        for j, reply in zip(members, raw):
            out[j] = reply
        if wait:
            acked = min_acked(acked, raw[-1])
    return out, acked


def cluster_execute(client: Any, commands: List[Command], wait: Wait,
                    routes: List[Any]) -> List[Any]:
    """Send ``commands`` once over a blocking cluster client, each to the primary of
    ``routes[i]``'s slot, following redirects; one reply per command (+ fewest acks)."""
    done: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    rounds = cluster_rounds(len(commands))
    try:
        kind, target, idx = next(rounds)
        while True:
            try:
                got, round_acked = cluster_round(client, kind, target,
                                                 [commands[i] for i in idx],
                                                 [routes[i] for i in idx], wait)
            except Failed as failed:
                refresh(client)
                for i, reply in zip(idx, failed.replies):
                    done[i] = reply
                raise cut_error(failed.cause, done) from failed.cause
            except redis.exceptions.RedisClusterException as exc:  # no node for the slot
                raise errors.ServerBusy(str(exc), "CLUSTERDOWN") from exc
            if wait:
                acked = min_acked(acked, round_acked)
            for i, reply in zip(idx, got):
                done[i] = reply
                if isinstance(reply, MovedError):
                    client.nodes_manager.move_slot(reply)
            kind, target, idx = rounds.send(got)
    except StopIteration:
        return done + ([acked] if wait else [])


def refresh(client: Any) -> None:
    """Re-read the slot map after a node failed (a replica may have taken over)."""
    try:
        client.nodes_manager.initialize()
    except Exception:  # every node down: the next call reports it
        pass


# --- asyncio -----------------------------------------------------------------------------

async def cluster_execute_async(client: Any, commands: List[Command], wait: Wait,
                                routes: List[Any]) -> List[Any]:
    """:func:`cluster_execute` over a ``redis.asyncio`` cluster client."""
    if getattr(client, "_initialize", False):
        try:
            await client.initialize()
        except Exception as exc:
            raise errors.translate(exc, sent=False) from exc
    done: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    rounds = cluster_rounds(len(commands))
    try:
        kind, target, idx = next(rounds)
        while True:
            try:
                got, round_acked = await cluster_round_async(
                    client, kind, target, [commands[i] for i in idx], [routes[i] for i in idx],
                    wait)
            except Failed as failed:
                await refresh_async(client)
                for i, reply in zip(idx, failed.replies):
                    done[i] = reply
                raise cut_error(failed.cause, done) from failed.cause
            except redis.exceptions.RedisClusterException as exc:
                raise errors.ServerBusy(str(exc), "CLUSTERDOWN") from exc
            if wait:
                acked = min_acked(acked, round_acked)
            for i, reply in zip(idx, got):
                done[i] = reply
                if isinstance(reply, MovedError):
                    await client.nodes_manager.move_slot(reply)
            kind, target, idx = rounds.send(got)
    except StopIteration:
        return done + ([acked] if wait else [])


async def cluster_round_async(client: Any, kind: str, target: Any, commands: List[Command],
                              routes: List[Any], wait: Wait) -> Tuple[List[Any], Optional[int]]:
    """:func:`cluster_round` over a ``redis.asyncio`` cluster client."""
    raw: Optional[List[Any]]  # None: wait_lost saw more than WAIT's reply lost
    if kind == "ask":
        node = client.nodes_manager.get_node(host=target[0], port=target[1])
        if node is None:
            raise Failed(redis.exceptions.ConnectionError(f"ASK to unknown node {target}"),
                          [UNSENT] * len(commands))
        try:
            raw = await on_node_async(node, with_wait(asking(commands), wait))
        except Failed as failed:
            raise Failed(failed.cause, failed.replies[1::2]) from failed.cause
        return raw[1::2], (min_acked(None, raw[-1]) if wait else None)
    out: List[Any] = [UNSENT] * len(commands)
    acked: Optional[int] = None
    for node, members in by_node(client, routes).values():
        try:
            raw = await on_node_async(node, with_wait([commands[j] for j in members], wait))
        except Failed as failed:
            raw = wait_lost(failed, len(members), wait)
            if raw is None:
                for j, reply in zip(members, failed.replies):
                    out[j] = reply
                raise Failed(failed.cause, out) from failed.cause
        for j, reply in zip(members, raw):
            out[j] = reply
        if wait:
            acked = min_acked(acked, raw[-1])
    return out, acked


async def refresh_async(client: Any) -> None:
    """:func:`refresh` over a ``redis.asyncio`` cluster client."""
    try:
        await client.nodes_manager.initialize()
    except Exception:
        pass
