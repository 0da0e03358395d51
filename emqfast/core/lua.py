"""The Lua moves as text: locating ``lua/``, expanding ``--@include``, SHA1, declared KEYS.

Each ``lua/<move>.lua`` starts with a header naming every KEYS[i] and ARGV[i];
:class:`LuaSource` parses the fixed KEYS count from it so a test can check that the
Python call sites pass exactly what the header declares. Sending a script is the
backends' job (:mod:`emqfast.backends.scripts`).
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence, Tuple

_INCLUDE = re.compile(r"^--@include (\w+)\s*$", re.M)
_HEADER_KEY = re.compile(r"^-- KEYS\[(\d+)(\.\.)?\]", re.M)


def lua_dir() -> Path:
    """Directory holding the ``.lua`` files: ``emqfast/lua`` in an installed wheel,
    the repository's top-level ``lua/`` in a source tree or editable install."""
    package = Path(__file__).resolve().parent.parent  # emqfast/
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / "enqueue.lua").exists():
            return candidate
    raise FileNotFoundError(f"emqfast's Lua scripts are missing (looked in {package / 'lua'})")


class LuaSource:
    """One atomic move: its source (includes expanded), SHA1 and declared KEYS."""

    def __init__(self, name: str, raw: str, source: str):
        self.name = name
        self.raw = raw
        self.source = source
        # encoded once: the C Batcher takes the source (to load it on NOSCRIPT) with
        # every call, a single enqueue's included
        self.source_bytes = source.encode()
        self.sha = hashlib.sha1(self.source_bytes).hexdigest()
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


def expand(text: str, directory: Path) -> str:
    def include(match: "re.Match[str]") -> str:
        return (directory / "includes" / f"{match.group(1)}.lua").read_text()
    return _INCLUDE.sub(include, text)


def read(name: str) -> LuaSource:
    """The script ``lua/<name>.lua`` with its includes expanded."""
    directory = lua_dir()
    raw = (directory / f"{name}.lua").read_text()
    return LuaSource(name, raw, expand(raw, directory))


# What an operation names when it asks for a script call (the backends' Script is one).
if TYPE_CHECKING:
    from typing import Protocol

    class Script(Protocol):
        """A :class:`LuaSource` that runs itself (:class:`emqfast.backends.scripts.Script`)."""

        name: str
        raw: str
        source: str
        source_bytes: bytes
        sha: str
        fixed_keys: int
        variadic: bool

        def check_keys(self, keys: Sequence[Any]) -> None: ...
        def command(self, keys: Sequence[Any], args: Sequence[Any]) -> Tuple[Any, ...]: ...
        def __call__(self, client: Any, keys: Sequence[Any], args: Sequence[Any]) -> Any: ...
        async def call_async(self, client: Any, keys: Sequence[Any],
                             args: Sequence[Any]) -> Any: ...
else:
    Script = LuaSource
