"""Sending the Lua moves: EVALSHA once per call, NOSCRIPT recovery, typed error replies.

:class:`Script` is a :class:`~emqfast.core.lua.LuaSource` that can also run itself on a
client; :func:`load` hands out one per ``lua/<name>.lua``.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Dict, List, Sequence, Set, Tuple

import redis
import redis.crc

from emqfast.backends import transport
from emqfast.core import errors
from emqfast.core.lua import LuaSource, lua_dir, read


ScriptCall = Tuple[Any, Sequence[Any], Sequence[Any]]  # (script, keys, args); a Call is one


class Script(LuaSource):
    """A Lua move that can run itself on a redis-py client (sync or asyncio)."""

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> Tuple[Any, ...]:
        """The EVALSHA command of one call."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def __call__(self, client: "redis.Redis", keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run the script once (EVALSHA, loading it on NOSCRIPT); never re-sent after a lost
        reply (:class:`~emqfast.errors.ReplyLost`). Error replies raise typed errors."""
        [reply] = send(client, [(self, keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def call_async(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """:meth:`__call__` over a ``redis.asyncio`` client."""
        [reply] = await send_async(client, [(self, keys, args)])
        if isinstance(reply, Exception):
            raise reply
        return reply


def map_error(exc: Exception) -> Exception:
    """Typed emqfast error for an error reply (Lua ``EMQ*`` codes, OOM, NOPERM, transient
    states; see :func:`emqfast.errors.translate`), else the exception unchanged."""
    return errors.translate(exc)  # type: ignore[return-value]


def _typed(replies: List[Any]) -> List[Any]:
    return [map_error(r) if isinstance(r, redis.exceptions.RedisError) else r
            for r in replies]


def _reload_plan(client: Any, calls: Sequence[ScriptCall],
                 missing: List[int]) -> Tuple[List[Tuple[str, ...]], List[Any]]:
    """SCRIPT LOAD commands (one per script and node) and their routes, for ``missing``."""
    cluster = hasattr(client, "nodes_manager")
    loads: List[Tuple[str, ...]] = []
    routes: List[Any] = []
    seen: Set[Tuple[str, Any]] = set()
    for i in missing:
        script, keys = calls[i][0], calls[i][1]
        key = keys[0] if keys else None
        where = redis.crc.key_slot(key.encode() if isinstance(key, str) else key) \
            if cluster and key is not None else None
        if (script.sha, where) not in seen:
            seen.add((script.sha, where))
            loads.append(("SCRIPT", "LOAD", script.source))
            routes.append(key)
    return loads, routes


def _merge_again(replies: List[Any], missing: List[int], again: List[Any],
                 nloads: int) -> None:
    """Put the re-sent calls' replies (after ``nloads`` SCRIPT LOAD replies) in place; a
    failed load is the reply of the calls it was for."""
    failed_load = next((r for r in again[:nloads] if isinstance(r, Exception)), None)
    for i, reply in zip(missing, again[nloads:]):
        if failed_load is not None and isinstance(reply, redis.exceptions.NoScriptError):
            reply = failed_load
        replies[i] = reply


def _cut_again(cut: Exception, replies: List[Any], missing: List[int], nloads: int,
               raw: bool = False) -> BaseException:
    """A connection failure during the NOSCRIPT re-send, reported for the whole batch."""
    got = getattr(cut, "replies", None)
    if got is None:  # nothing of the re-send was written
        got = [transport.UNSENT] * (nloads + len(missing))
    full = list(replies)
    for i, reply in zip(missing, got[nloads:]):
        full[i] = reply
    return transport.cut_error(cut.__cause__ or cut, full if raw else _typed(full))


def send(client: Any, calls: Sequence[ScriptCall], wait: transport.Wait = None,
         raw: bool = False) -> List[Any]:
    """Run ``[(script, keys, args), ...]`` once each, pipelined on one connection per node.

    Replies in call order, error replies typed in their slot. Calls that met NOSCRIPT
    (Redis restarted or flushed its script cache: they did not run) are re-sent once after
    a SCRIPT LOAD on their node. A failed connection raises
    :class:`~emqfast.errors.ConnectionFailed` (nothing written) or
    :class:`~emqfast.backends.transport.BatchCut` (partial replies); nothing is re-sent blindly.
    With ``wait`` the list ends with the fewest replicas that acknowledged. ``raw`` keeps
    error replies as redis-py's exceptions (the Batcher contract)."""
    commands = [script.command(keys, args) for script, keys, args in calls]
    replies = transport.execute(client, commands, wait)
    acked = replies.pop() if wait else None
    missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        loads, routes = _reload_plan(client, calls, missing)
        try:
            again = transport.execute(client, loads + [commands[i] for i in missing], wait,
                                      routes + [None] * len(missing))
        except errors.ConnectionFailed as cut:
            raise _cut_again(cut, replies, missing, len(loads), raw) from cut.__cause__
        if wait:
            acked = min(acked, again.pop())
        _merge_again(replies, missing, again, len(loads))
    out = replies if raw else _typed(replies)
    return out + [acked] if wait else out


async def send_async(client: Any, calls: Sequence[ScriptCall], wait: transport.Wait = None,
                     raw: bool = False) -> List[Any]:
    """:func:`send` over a ``redis.asyncio`` client."""
    commands = [script.command(keys, args) for script, keys, args in calls]
    replies = await transport.execute_async(client, commands, wait)
    acked = replies.pop() if wait else None
    missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        loads, routes = _reload_plan(client, calls, missing)
        try:
            again = await transport.execute_async(
                client, loads + [commands[i] for i in missing], wait,
                routes + [None] * len(missing))
        except errors.ConnectionFailed as cut:
            raise _cut_again(cut, replies, missing, len(loads), raw) from cut.__cause__
        if wait:
            acked = min(acked, again.pop())
        _merge_again(replies, missing, again, len(loads))
    out = replies if raw else _typed(replies)
    return out + [acked] if wait else out


def run_pipeline(client: "redis.Redis", calls: Sequence[ScriptCall]) -> List[Any]:
    """Run ``[(script, keys, args), ...]`` in one round trip (no MULTI): :func:`send`.

    Replies come back in order; a Lua error is returned (typed) in its slot, not raised."""
    return send(client, calls)


async def run_pipeline_async(client: Any, calls: Sequence[ScriptCall]) -> List[Any]:
    """:func:`run_pipeline` over a ``redis.asyncio`` client (same NOSCRIPT and error rules)."""
    return await send_async(client, calls)


@lru_cache(maxsize=None)
def load(name: str) -> Script:
    """The script ``lua/<name>.lua``."""
    source = read(name)
    return Script(source.name, source.raw, source.source)


def all_scripts() -> Dict[str, Script]:
    """Every top-level script in ``lua/``, by name."""
    return {p.stem: load(p.stem) for p in sorted(lua_dir().glob("*.lua"))}
