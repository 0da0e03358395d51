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

from . import errors

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

    def __call__(self, client: "redis.Redis", keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run the script (EVALSHA, loading it on NOSCRIPT); Lua errors become typed errors."""
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                client.script_load(self.source)
                return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.ResponseError as exc:
            raise map_error(exc) from None

    async def call_async(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """:meth:`__call__` over a ``redis.asyncio`` client."""
        try:
            try:
                return await client.evalsha(self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                await client.script_load(self.source)
                return await client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.ResponseError as exc:
            raise map_error(exc) from None

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Append an EVALSHA to a pipeline; see :func:`run_pipeline` for NOSCRIPT handling."""
        # execute_command, not pipe.evalsha(): redis-py's ClusterPipeline blocks the
        # evalsha() helper but routes a raw EVALSHA by its first key (all our keys share
        # the queue's hash tag, so that is the right node).
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def map_error(exc: Exception) -> Exception:
    """Typed emqfast error for a Lua error reply, else the exception unchanged."""
    typed = errors.from_reply(str(exc))
    return typed if typed is not None else exc


def run_pipeline(client: "redis.Redis", calls: List[tuple]) -> List[Any]:
    """Run ``[(script, keys, args), ...]`` in one round trip (no MULTI).

    Replies come back in order; a Lua error is returned (typed) in its slot, not
    raised. Calls that met NOSCRIPT (Redis restarted or flushed its script
    cache) are re-sent once after loading their scripts; they had not run.
    """
    def send(batch):
        pipe = client.pipeline(transaction=False)
        for script, keys, args in batch:
            script.queue(pipe, keys, args)
        return pipe.execute(raise_on_error=False)

    replies = send(calls)
    missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            client.script_load(script.source)
        again = send([calls[i] for i in missing])
        for i, reply in zip(missing, again):
            replies[i] = reply
    return [map_error(r) if isinstance(r, redis.exceptions.ResponseError) else r
            for r in replies]


async def run_pipeline_async(client: Any, calls: List[tuple]) -> List[Any]:
    """:func:`run_pipeline` over a ``redis.asyncio`` client (same NOSCRIPT and error rules)."""
    async def send(batch: List[tuple]) -> List[Any]:
        pipe = client.pipeline(transaction=False)
        for script, keys, args in batch:
            script.queue(pipe, keys, args)
        return await pipe.execute(raise_on_error=False)

    replies = await send(calls)
    missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    if missing:
        for script in {calls[i][0] for i in missing}:
            await client.script_load(script.source)
        again = await send([calls[i] for i in missing])
        for i, reply in zip(missing, again):
            replies[i] = reply
    return [map_error(r) if isinstance(r, redis.exceptions.ResponseError) else r
            for r in replies]


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
