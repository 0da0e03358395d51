"""Loading the Lua moves: include expansion, SHA, NOSCRIPT recovery, error mapping.

Each ``lua/<move>.lua`` starts with a header naming every KEYS[i] and ARGV[i];
:class:`Script` parses the fixed KEYS count from it so a test can check that the
Python call sites pass exactly what the header declares.
"""
from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Sequence

import redis
import redis.crc

from . import errors, transport

_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.M)
_HEADER_KEY = re.compile(r"^-- KEYS\[(\d+)(\.\.)?\]", re.M)


def lua_dir() -> Path:
    """Directory holding the ``.lua`` files: ``emqfast/lua`` in an installed wheel,
    the repository's top-level ``lua/`` in a source tree or editable install."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "enqueue.lua").exists():
            return candidate
    raise FileNotFoundError(f"emqfast's Lua scripts are missing (looked in {here / 'lua'})")


class Script:
    """One atomic move: its source (includes expanded), SHA1 and declared KEYS."""

    def __init__(self, name: str, raw: str, source: str):
        self.name = name
        self.raw = raw
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        header = raw.split("\n\n", 1)[0]
        declared = _HEADER_KEY.findall(header)
        self.fixed_keys = sum(1 for _, variadic in declared if not variadic)
        self.variadic = any(variadic for _, variadic in declared)

    def check_keys(self, keys: Sequence[Any]) -> None:
        """Assert the caller passes what the header declares (cheap; catches wiring bugs)."""
        n = len(keys)
        if n < self.fixed_keys or (n > self.fixed_keys and not self.variadic):
            raise AssertionError(
                f"{self.name}.lua declares {self.fixed_keys} fixed keys, got {n}")

    def command(self, keys: Sequence[Any], args: Sequence[Any]) -> tuple:
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

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Append an EVALSHA to a pipeline; see :func:`run_pipeline` for NOSCRIPT handling."""
        # execute_command, not pipe.evalsha(): redis-py's ClusterPipeline blocks the
        # evalsha() helper but routes a raw EVALSHA by its first key (all our keys share
        # the queue's hash tag, so that is the right node).
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def map_error(exc: Exception) -> Exception:
    """Typed emqfast error for an error reply (Lua ``EMQ*`` codes, OOM, NOPERM, transient
    states; see :func:`emqfast.errors.translate`), else the exception unchanged."""
    return errors.translate(exc)  # type: ignore[return-value]


def _typed(replies: List[Any]) -> List[Any]:
    return [map_error(r) if isinstance(r, redis.exceptions.ResponseError) else r
            for r in replies]


def _reload_plan(client: Any, calls: Sequence[tuple], missing: List[int]):
    """SCRIPT LOAD commands (one per script and node) and their routes, for ``missing``."""
    cluster = hasattr(client, "nodes_manager")
    loads: List[tuple] = []
    routes: List[Any] = []
    seen = set()
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
               raw: bool = False) -> Exception:
    """A connection failure during the NOSCRIPT re-send, reported for the whole batch."""
    got = getattr(cut, "replies", None)
    if got is None:  # nothing of the re-send was written
        got = [transport.UNSENT] * (nloads + len(missing))
    full = list(replies)
    for i, reply in zip(missing, got[nloads:]):
        full[i] = reply
    return transport.cut_error(cut.__cause__ or cut, full if raw else _typed(full))


def send(client: Any, calls: Sequence[tuple], wait: transport.Wait = None,
         raw: bool = False) -> List[Any]:
    """Run ``[(script, keys, args), ...]`` once each, pipelined on one connection per node.

    Replies in call order, error replies typed in their slot. Calls that met NOSCRIPT
    (Redis restarted or flushed its script cache: they did not run) are re-sent once after
    a SCRIPT LOAD on their node. A failed connection raises
    :class:`~emqfast.errors.ConnectionFailed` (nothing written) or
    :class:`~emqfast.transport.BatchCut` (partial replies); nothing is re-sent blindly.
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


async def send_async(client: Any, calls: Sequence[tuple], wait: transport.Wait = None,
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


def run_pipeline(client: "redis.Redis", calls: List[tuple]) -> List[Any]:
    """Run ``[(script, keys, args), ...]`` in one round trip (no MULTI): :func:`send`.

    Replies come back in order; a Lua error is returned (typed) in its slot, not raised."""
    return send(client, calls)


async def run_pipeline_async(client: Any, calls: List[tuple]) -> List[Any]:
    """:func:`run_pipeline` over a ``redis.asyncio`` client (same NOSCRIPT and error rules)."""
    return await send_async(client, calls)


def _expand(text: str, directory: Path) -> str:
    def include(match: "re.Match[str]") -> str:
        return (directory / "includes" / f"{match.group(1)}.lua").read_text()
    return _INCLUDE.sub(include, text)


@lru_cache(maxsize=None)
def load(name: str) -> Script:
    """The script ``lua/<name>.lua``."""
    directory = lua_dir()
    raw = (directory / f"{name}.lua").read_text()
    return Script(name, raw, _expand(raw, directory))


def all_scripts() -> Dict[str, Script]:
    """Every top-level script in ``lua/``, by name."""
    return {p.stem: load(p.stem) for p in sorted(lua_dir().glob("*.lua"))}
