"""Static reading of the Lua scripts and of emqfast's Python sources: which Redis
commands each can send, and where a script's first write falls. Used by
tests/test_script_safety.py; no Redis needed.

The Lua reader is deliberately small: it knows comments, string literals, the
``redis.call('CMD', ...)`` form and the block keywords (``function``/``if``/``do``/
``repeat`` ... ``end``/``until``), which is all the scripts use. Anything it cannot read
(a command name that is not a literal) is an error, never a silent gap.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import emqfast
from emqfast.core.lua import lua_dir

PACKAGE = Path(emqfast.__file__).resolve().parent
README = PACKAGE.parent / "README.md"

# Commands that modify data. A script must run every check that can fail before the
# first of these (Redis does not roll back a script that errors half-way).
WRITE_COMMANDS = frozenset("""
set setnx setex psetex getset getdel getex append incr incrby incrbyfloat decr decrby
del unlink expire pexpire expireat pexpireat persist rename renamenx copy move
hset hsetnx hmset hdel hincrby hincrbyfloat
zadd zincrby zrem zpopmin zpopmax bzpopmin bzpopmax zremrangebyscore zremrangebyrank
zremrangebylex zrangestore zunionstore zinterstore zdiffstore
lpush rpush lpushx rpushx lpop rpop lset lrem ltrim linsert lmove blmove rpoplpush
sadd srem spop smove sunionstore sinterstore sdiffstore
xadd xtrim xdel xack xclaim xautoclaim xgroup xsetid
pfadd pfmerge setbit setrange bitop publish spublish
""".split())

_CALL = re.compile(r"redis\.p?call\s*\(")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPENERS = {"function", "if", "do", "repeat"}
_CLOSERS = {"end", "until"}


class LuaReadError(AssertionError):
    """The reader met something it cannot account for (e.g. a non-literal command)."""


def strip_comments(src: str) -> str:
    """``src`` with ``--`` comments blanked (strings kept; line numbers kept)."""
    out: List[str] = []
    i, n, quote = 0, len(src), ""
    while i < n:
        c = src[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(src[i + 1])
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
            out.append(c)
        elif src.startswith("--", i):
            end = src.find("\n", i)
            end = n if end == -1 else end
            i = end
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


def blank_strings(code: str) -> str:
    """``code`` (comments already stripped) with string literal contents blanked, so
    keywords inside strings do not count as blocks."""
    return re.sub(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"",
                  lambda m: m.group(0)[0] + " " * (len(m.group(0)) - 2) + m.group(0)[0], code)


def commands_in(code: str, where: str) -> List[Tuple[int, str]]:
    """``(line, command)`` for every ``redis.call``/``redis.pcall`` in ``code`` (comments
    stripped); a command name that is not a string literal raises :class:`LuaReadError`."""
    found = []
    for m in _CALL.finditer(code):
        line = code.count("\n", 0, m.start()) + 1
        lit = re.match(r"\s*(['\"])([A-Za-z]+)\1", code[m.end():])
        if not lit:
            snippet = code[m.start():code.find("\n", m.start())]
            raise LuaReadError(f"{where}:{line}: command name is not a literal: {snippet!r}")
        found.append((line, lit.group(2).lower()))
    return found


@dataclass
class Function:
    """A ``local function`` of a script or include: what it can call, transitively."""

    name: str
    commands: Set[str] = field(default_factory=set)
    calls: Set[str] = field(default_factory=set)


def _blocks(code: str) -> Iterator[Tuple[str, int, int]]:
    """``(name, first line, last line)`` of each top-level ``local function`` in ``code``."""
    plain = blank_strings(code).split("\n")
    depth, current, start = 0, None, 0
    for no, line in enumerate(plain, 1):
        for word in _WORD.findall(line):
            if word in _OPENERS:
                if depth == 0 and word == "function":
                    m = re.search(r"local\s+function\s+(\w+)", line)
                    current, start = (m.group(1) if m else None), no
                depth += 1
            elif word in _CLOSERS:
                depth -= 1
                if depth == 0 and current is not None:
                    yield current, start, no
                    current = None


def functions_of(code: str, where: str) -> Dict[str, Function]:
    """The ``local function`` s of ``code`` with their direct commands and calls."""
    lines = code.split("\n")
    out: Dict[str, Function] = {}
    for name, first, last in _blocks(code):
        body = "\n".join(lines[first - 1:last])
        fn = Function(name, {c for _, c in commands_in(body, f"{where}:{name}")})
        fn.calls = set(re.findall(r"\b(emq_\w+|\w+)\s*\(", blank_strings(body))) - {name}
        out[name] = fn
    return out


def close_over(functions: Dict[str, Function]) -> Dict[str, Set[str]]:
    """Each function's commands including those of the functions it calls."""
    memo: Dict[str, Set[str]] = {}

    def cmds(name: str, seen: Tuple[str, ...] = ()) -> Set[str]:
        if name in memo:
            return memo[name]
        fn = functions[name]
        got = set(fn.commands)
        for callee in fn.calls:
            if callee in functions and callee not in seen:
                got |= cmds(callee, seen + (name,))
        memo[name] = got
        return got

    return {name: cmds(name) for name in functions}


def include_text(name: str) -> str:
    return (lua_dir() / "includes" / f"{name}.lua").read_text()


def script_includes(raw: str) -> List[str]:
    return re.findall(r"^--@include (\w+)\s*$", raw, re.M)


@dataclass
class WriteOrder:
    """Where a script's checks and writes fall (line numbers of the script's own file)."""

    script: str
    fence: Optional[int]                 # the first fence (the boot stamp is a write)
    first_write: Optional[Tuple[int, str]]
    errors: List[int]
    fence_errors: Set[int]               # "if err then return redis.error_reply(err)"

    def violations(self) -> List[str]:
        """Each check that can fail yet comes after the fence's stamp or the first write."""
        out = []
        if self.first_write is not None:
            line, what = self.first_write
            if self.fence is None:
                out.append(f"{self.script}.lua:{line}: writes ({what}) without the boot fence")
            elif self.fence > line:
                out.append(f"{self.script}.lua:{line}: writes ({what}) before the fence "
                           f"(line {self.fence})")
        for err in self.errors:
            if err in self.fence_errors:
                continue
            if self.fence is not None and err > self.fence:
                out.append(f"{self.script}.lua:{err}: error reply after the fence's stamp "
                           f"(line {self.fence})")
            elif self.first_write is not None and err > self.first_write[0]:
                out.append(f"{self.script}.lua:{err}: error reply after the first write "
                           f"({self.first_write[1]}, line {self.first_write[0]})")
        return out


def write_order(name: str, raw: str) -> WriteOrder:
    """Read the main body of script ``name`` (raw text, includes not expanded): its fence,
    its first write (a write command, or a call of a helper that writes) and its error
    replies, in line order. Local functions count where they are called, not defined."""
    helpers: Dict[str, Function] = {}
    for inc in script_includes(raw):
        helpers.update(functions_of(strip_comments(include_text(inc)), f"includes/{inc}"))
    code = strip_comments(raw)
    helpers.update(functions_of(code, name))
    reach = close_over(helpers)
    writers = {fn for fn, cmds in reach.items() if cmds & WRITE_COMMANDS} - {"emq_fence"}
    inside = set()
    for _, first, last in _blocks(code):
        inside.update(range(first, last + 1))
    plain = blank_strings(code).split("\n")
    fence = first_write = last_fence = None
    errors: List[int] = []
    fence_errors: Set[int] = set()
    for no, line in enumerate(code.split("\n"), 1):
        if no in inside:
            continue
        # emq_fence_check: a many-queue script's fence, each queue's checked before any write
        if "emq_fence(" in plain[no - 1] or "emq_fence_check(" in plain[no - 1]:
            last_fence = no
            fence = no if fence is None else fence
        if "redis.error_reply(" in line:
            errors.append(no)
            if last_fence is not None and no - last_fence <= 1 \
                    and "redis.error_reply(err)" in line:
                fence_errors.add(no)
        if first_write is None:
            for _, cmd in commands_in(line, name):
                if cmd in WRITE_COMMANDS:
                    first_write = (no, cmd.upper())
                    break
            else:
                for call in re.findall(r"\b(\w+)\s*\(", plain[no - 1]):
                    if call in writers:
                        first_write = (no, call + "()")
                        break
    return WriteOrder(name, fence, first_write, errors, fence_errors)


# --- README -----------------------------------------------------------------------------

def _readme_rule(marker: str, what: str) -> List[str]:
    rules = [ln.strip() for ln in README.read_text().splitlines()
             if ln.strip().startswith("ACL SETUSER") and marker in ln]
    if len(rules) != 1:
        raise AssertionError(f"expected one {what} ACL rule in README.md, found {rules}")
    tokens = rules[0].split()
    return tokens[tokens.index("resetchannels") + 1:]


def readme_least_privilege() -> List[str]:
    """The README's least-privilege ACL rule: its ``+``/``-`` tokens after the key pattern."""
    return _readme_rule("-@all", "least-privilege")


def readme_simple_rule() -> List[str]:
    """The README's simple ACL rule (``+@all -@dangerous ...``), tokens as above."""
    return _readme_rule("-@dangerous", "simple")


def allowed_commands(rule: List[str]) -> Set[str]:
    """Lower-case command names the rule's ``+cmd`` / ``+cmd|sub`` tokens allow."""
    return {t[1:].lower() for t in rule if t.startswith("+") and not t.startswith("+@")}


# --- Python sources -----------------------------------------------------------------------

# redis-py methods emqfast calls on a client or pipeline, and the commands they send.
METHOD_COMMANDS: Dict[str, Set[str]] = {
    "evalsha": {"evalsha"}, "script_load": {"script|load"}, "scan_iter": {"scan"},
    "transaction": {"watch", "multi", "exec", "unwatch"}, "pipeline": set(), "execute": set(),
    "client_id": {"client|id"}, "config_get": {"config|get"}, "info": {"info"},
    "client_unblock": {"client|unblock"},
}
CONTAINERS = {"client", "script", "config", "acl", "memory", "object", "command", "xinfo",
              "cluster", "function", "latency", "slowlog"}
# Modules that talk only to a server emqfast itself started as its admin (not the ACL user).
ADMIN_ONLY = {"embedded.py", "demo.py", "demo_report.py"}
_CLIENTISH = re.compile(r"(^|\.)(_?client|_?redis|conn|pipe|_?r)$")


def _redis_methods() -> Set[str]:
    import inspect

    import redis.commands.core as core

    names: Set[str] = set()
    for obj in vars(core).values():
        if inspect.isclass(obj):
            names |= {m for m in vars(obj) if not m.startswith("_")}
    return names | set(METHOD_COMMANDS)


def _literal(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        v = node.value
        return (v.decode() if isinstance(v, bytes) else v).lower()
    return None


def _command_of(args: List[ast.expr]) -> Optional[str]:
    if not args:
        return None
    first = _literal(args[0])
    if first is None:
        return None
    if first in CONTAINERS and len(args) > 1 and _literal(args[1]) is not None:
        return f"{first}|{_literal(args[1])}"
    return first


def _resolve_starred(tree: ast.AST, node: ast.Call) -> Optional[List[ast.expr]]:
    """``Cmd.of(*args, ...)``: the literal list ``args = ["XREAD", ...]`` in the module."""
    first = node.args[0] if node.args else None
    if not (isinstance(first, ast.Starred) and isinstance(first.value, ast.Name)):
        return None
    for sub in ast.walk(tree):
        targets = (sub.targets if isinstance(sub, ast.Assign)
                   else [sub.target] if isinstance(sub, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == first.value.id for t in targets) \
                and isinstance(sub.value, (ast.List, ast.Tuple)):
            return list(sub.value.elts)
    return None


def python_commands(known: Optional[Set[str]] = None) -> Dict[str, Set[str]]:
    """``{command: {module, ...}}`` for every Redis command emqfast's Python code sends
    by name (``Cmd.of``, ``execute_command``, ``send_command``) or through a redis-py
    method on a client or pipeline. A ``Cmd.of`` whose command cannot be read raises
    :class:`LuaReadError` (the drivers' pass-through ``execute_command(*c.args)`` is
    not a command of its own). With ``known`` (the server's ``COMMAND LIST``, lower
    case), a tuple or list literal that starts with a known command name (``("WAIT", n,
    ms)``, ``[b"SCRIPT", b"LOAD", src]``: commands framed by hand) counts too."""
    methods = _redis_methods()
    out: Dict[str, Set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in ADMIN_ONLY:
            continue
        where = str(path.relative_to(PACKAGE))
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if known and isinstance(node, (ast.Tuple, ast.List)) and node.elts:
                first = _literal(node.elts[0])
                if first is not None and first in known and node.elts[0].value.isupper():
                    cmd = _command_of(list(node.elts))
                    out.setdefault(cmd or first, set()).add(where)
                continue
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr, recv = node.func.attr, ast.unparse(node.func.value)
            cmds: Set[str] = set()
            if (attr == "of" and recv == "Cmd") or attr in ("execute_command", "send_command"):
                cmd = _command_of(list(node.args))
                if cmd is None:
                    cmd = _command_of(_resolve_starred(tree, node) or [])
                if cmd is None and attr == "of":
                    raise LuaReadError(f"{where}:{node.lineno}: cannot read the command of "
                                       f"{ast.unparse(node)}")
                cmds = {cmd} if cmd else set()
            elif attr in methods and _CLIENTISH.search(recv):
                cmds = METHOD_COMMANDS.get(attr, {attr})
            for cmd in cmds:
                out.setdefault(cmd, set()).add(where)
    return out


# --- named KEYS and ARGV ------------------------------------------------------------------

# A header entry: "-- KEYS[2] pending_key  pending zset ..." (a fixed position) or, indented
# under a variadic "-- KEYS[8..]" entry, "--   KEYS[8] dedupe_hash_key  ..." (an optional
# position the caller may leave out). Each names the local the script binds it to.
_NAMED = re.compile(r"^--( |   )(KEYS|ARGV)\[(\d+)\] +(\S+)")
_TAIL = re.compile(r"^-- (KEYS|ARGV)\[(\d+)\.\.\]")
_BINDING = re.compile(r"^local ([a-z][a-z0-9_]*) = (KEYS|ARGV)\[(\d+)\]$")
_POSITIONAL = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")
_INDEXED = re.compile(r"\b(KEYS|ARGV)\[")


@dataclass
class Naming:
    """How one script (raw text, includes not expanded) names its KEYS and ARGV."""

    script: str
    declared: List[Tuple[str, int, str]]         # (kind, index, name) in header order
    tails: Dict[str, int]                        # kind -> first index of its variadic tail
    bound: List[Tuple[str, int, str]]            # (kind, index, name) of the binding block
    block: Tuple[int, int]                       # first and last line of the binding block
    positional: List[Tuple[int, str]]            # (line, text) of KEYS[n]/ARGV[n] elsewhere
    indexed: List[Tuple[int, str, str]]          # (line, kind, text) of KEYS[i]/ARGV[i]
    redeclared: List[Tuple[int, str]]            # (line, name) of a bound name declared again

    def violations(self) -> List[str]:
        """Each way the header, the binding block and the body are out of step."""
        where = f"{self.script}.lua"
        out = [f"{where}: header names {kind}[{n}] {name!r}: not a snake_case local"
               for kind, n, name in self.declared if not re.fullmatch(r"[a-z][a-z0-9_]*", name)]
        out += [f"{where}: KEYS[{n}] is bound as {name!r}: a key's local ends in _key"
                for kind, n, name in self.declared if kind == "KEYS" and not name.endswith("_key")]
        if self.bound != self.declared:
            out.append(f"{where}: the binding block {self.bound} is not the header's "
                       f"{self.declared} (each entry once, same name, header order)")
        names = [name for _, _, name in self.declared]
        out += [f"{where}: {name!r} names two entries" for name in set(names)
                if names.count(name) > 1]
        out += [f"{where}:{line}: reads {text} by position outside the binding block"
                for line, text in self.positional]
        out += [f"{where}:{line}: {text!r} indexes {kind} without a variadic tail"
                for line, kind, text in self.indexed if kind not in self.tails]
        out += [f"{where}:{line}: {name!r} is bound to a KEYS/ARGV entry and declared again"
                for line, name in self.redeclared]
        return out


def _declared_names(raw: str) -> Tuple[List[Tuple[str, int, str]], Dict[str, int]]:
    declared, tails = [], {}
    for line in raw.split("\n"):
        if not line.startswith("--") or line.startswith("--@include"):
            break
        tail = _TAIL.match(line)
        if tail:
            tails[tail.group(1)] = int(tail.group(2))
        m = _NAMED.match(line)
        if m:
            indent, kind, n, name = m.groups()
            if indent != " " and not (kind in tails and int(n) >= tails[kind]):
                raise LuaReadError(f"indented {kind}[{n}] outside a variadic tail: {line!r}")
            declared.append((kind, int(n), name))
    declared.sort(key=lambda e: (e[0] != "KEYS", e[1]))
    return declared, tails


def _declarations(code: str) -> Iterator[Tuple[int, str]]:
    """``(line, name)`` of each local, parameter and loop variable ``code`` declares."""
    for no, line in enumerate(code.split("\n"), 1):
        for m in re.finditer(r"\blocal\s+function\s+(\w+)", line):
            yield no, m.group(1)
        for m in re.finditer(r"\blocal\s+(?!function\b)(\w+(?:\s*,\s*\w+)*)", line):
            for name in m.group(1).split(","):
                yield no, name.strip()
        for m in re.finditer(r"\bfunction\b\s*[\w.:]*\s*\(([^)]*)\)", line):
            for name in m.group(1).split(","):
                if name.strip():
                    yield no, name.strip()
        for m in re.finditer(r"\bfor\s+(\w+(?:\s*,\s*\w+)*)\s*(?:=|\bin\b)", line):
            for name in m.group(1).split(","):
                yield no, name.strip()


def naming(name: str, raw: str) -> Naming:
    """Read how script ``name`` (its raw text) binds its KEYS and ARGV: the header's named
    entries, the binding block (the ``local x = KEYS[n]`` lines that open the body, right
    after the includes) and every other read of KEYS or ARGV by index."""
    declared, tails = _declared_names(raw)
    code = blank_strings(strip_comments(raw)).split("\n")
    lines = raw.split("\n")
    start = 0
    while start < len(lines) and (lines[start].startswith("--") or not lines[start].strip()):
        start += 1
    end = start
    bound = []
    while end < len(lines):
        m = _BINDING.match(lines[end])
        if not m:
            break
        bound.append((m.group(2), int(m.group(3)), m.group(1)))
        end += 1
    positional, indexed = [], []
    for no, line in enumerate(code, 1):
        if start < no <= end:
            continue
        positional += [(no, m.group(0)) for m in _POSITIONAL.finditer(line)]
        indexed += [(no, m.group(1), lines[no - 1].strip()) for m in _INDEXED.finditer(line)
                    if not _POSITIONAL.match(line, m.start())]
    names = {n for _, _, n in bound}
    redeclared = [(no, n) for no, n in _declarations("\n".join(code))
                  if n in names and not start < no <= end]
    return Naming(name, declared, tails, bound, (start + 1, end), positional, indexed, redeclared)


def include_positional(raw: str) -> List[Tuple[int, str]]:
    """``(line, text)`` of each ``KEYS[n]``/``ARGV[n]`` an include reads by position: an
    include serves many scripts, so it reads the caller's arguments only by index into a
    variadic tail the caller passes it, never a fixed position."""
    code = blank_strings(strip_comments(raw)).split("\n")
    return [(no, m.group(0)) for no, line in enumerate(code, 1)
            for m in _POSITIONAL.finditer(line)]
