"""The Lua moves are self-describing and wired as they say: every ``lua/*.lua`` has a header
(KEYS / ARGV / Returns / Errors), names each KEYS and ARGV entry and binds it to that local
once at the top (the body reads them by name, never by position), the Python call sites pass
exactly the KEYS and ARGV the header declares, every ``EMQ<CODE>`` is mapped in errors.py,
and no script builds a key."""
from __future__ import annotations

import re
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

import emqfast
from emqfast.core import errors
from emqfast.backends import drive, scripts
from emqfast.backends.pure_batcher import Batcher
import lua_static
from engine_util import claim, make_queue, wait_server_past
from waiting import wait_until

LUA = scripts.lua_dir()
FILES = sorted(LUA.glob("*.lua"))
ENGINE = {"cancel", "claim", "complete", "due", "enqueue", "extend", "fail", "pause", "promote",
          "reap", "release", "retry", "start", "trim"}
PACKAGE_DIR = str(Path(emqfast.__file__).resolve().parent)

_DECL = re.compile(r"^-- (KEYS|ARGV)\[(\d+)(\.\.)?\]\s+\S", re.M)
# PUBLISH names a channel, not a key (no slot: Cluster broadcasts it to every node)
_KEYLESS = {"TIME", "PING", "ECHO", "PUBLISH"}
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _header(raw: str) -> List[str]:
    lines = []
    for line in raw.splitlines():
        if not line.startswith("--") or line.startswith("--@include"):
            break
        lines.append(line)
    return lines


def _declared(raw: str, kind: str) -> Tuple[int, int]:
    """(fixed count, first variadic index or 0) of ``kind`` in the header."""
    found = [(int(n), bool(v)) for k, n, v in _DECL.findall("\n".join(_header(raw))) if k == kind]
    numbers = [n for n, _ in found]
    assert numbers == list(range(1, len(numbers) + 1)), f"{kind} not numbered 1..n: {numbers}"
    variadic = [n for n, v in found if v]
    assert not variadic or variadic == [numbers[-1]], f"only the last {kind} may be variadic"
    return len([1 for _, v in found if not v]), (variadic[0] if variadic else 0)


def _strip_comments(src: str) -> str:
    """Lua source without ``--`` line comments (a ``--`` inside a string literal stays)."""
    out = []
    for line in src.splitlines():
        quote, cut = None, len(line)
        for i, ch in enumerate(line):
            if quote:
                if ch == quote:
                    quote = None
            elif ch in "'\"":
                quote = ch
            elif line.startswith("--", i):
                cut = i
                break
        out.append(line[:cut])
    return "\n".join(out)


def _split_args(src: str, start: int) -> Tuple[List[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at ``start``."""
    depth, quote, args, cur, i = 0, None, [], [], start + 1
    while i < len(src):
        ch = src[i]
        if quote:
            cur.append(ch)
            if ch == "\\":
                cur.append(src[i + 1])
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            cur.append(ch)
        elif ch in "([{":
            depth += 1
            cur.append(ch)
        elif ch in ")]}":
            if depth == 0:
                args.append("".join(cur).strip())
                return [a for a in args if a], i
            depth -= 1
            cur.append(ch)
        elif ch == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
        i += 1
    raise AssertionError("unbalanced call")


def _split_top(text: str) -> List[str]:
    """Comma-separated expressions of one line; a value continuing on the next line (an
    unbalanced call) is kept whole: it is opaque, so never counts as a key."""
    try:
        args, _ = _split_args("(" + text + ")", 0)
    except (AssertionError, IndexError):
        return [text]
    return args


class _KeyFlow:
    """Which names in one (include-expanded) script are bound to a KEYS element."""

    def __init__(self, src: str):
        self.src = src
        self.bindings: Dict[str, List[str]] = defaultdict(list)
        self.dead_params: Set[str] = set()
        functions = re.findall(r"\bfunction\s+(\w+)\s*\(([^)]*)\)", src)
        for name, params in functions:
            params = [p.strip() for p in params.split(",") if p.strip()]
            sites = [m.end() - 1 for m in re.finditer(rf"(?<![\w.]){name}\s*\(", src)
                     if not re.search(r"function\s+$", src[:m.start()])]
            if not sites:
                self.dead_params.update(params)
            for site in sites:
                args, _ = _split_args(src, site)
                for param, arg in zip(params, args):
                    self.bindings[param].append(arg)
        for line in src.splitlines():
            m = re.match(r"^\s*(?:local\s+)?([\w\s,]+?)\s*=(?!=)\s*(.+)$", line)
            if not m or line.lstrip().startswith(("for ", "if ", "elseif ", "return ")):
                continue
            names = [n.strip() for n in m.group(1).split(",")]
            if not all(_IDENT.fullmatch(n) for n in names):
                continue
            for name, value in zip(names, _split_top(m.group(2))):
                self.bindings[name].append(value)

    def is_key(self, expr: str, seen: Tuple[str, ...] = ()) -> bool:
        expr = expr.strip()
        if re.fullmatch(r"KEYS\[[^\]]+\]", expr):
            return True
        if re.fullmatch(r"unpack\(KEYS,[^()]*\)", expr):  # a range of the declared keys
            return True
        if not _IDENT.fullmatch(expr) or expr in seen:
            return False
        # a helper passing its own parameter on under the same name adds nothing
        values = [v for v in self.bindings.get(expr, []) if v.strip() != expr]
        if not values:
            return expr in self.dead_params  # a parameter of a helper this script never calls
        return all(self.is_key(v, seen + (expr,)) for v in values)


def _redis_calls(src: str):
    for m in re.finditer(r"redis\.p?call\s*\(", src):
        args, _ = _split_args(src, m.end() - 1)
        yield args


# --- headers --------------------------------------------------------------------------------

def test_every_engine_script_is_present():
    assert ENGINE <= {p.stem for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_header_lists_keys_argv_returns_errors(path):
    raw = path.read_text()
    header = _header(raw)
    assert header and header[0].startswith(f"-- {path.name}: "), "first line names the file"
    text = "\n".join(header)
    for needed in (r"^-- KEYS\[1(\.\.)?\]", r"^-- ARGV\[1(\.\.)?\]", r"^-- Returns: \S", r"^-- Errors: +\S"):
        assert re.search(needed, text, re.M), f"{path.name}: header lacks {needed}"
    fixed_keys, var_keys = _declared(raw, "KEYS")
    fixed_argv, var_argv = _declared(raw, "ARGV")
    script = scripts.load(path.stem)
    assert (script.fixed_keys, script.variadic) == (fixed_keys, bool(var_keys))
    body = _strip_comments(script.source)
    # every KEYS[n] / ARGV[n] literal used is declared
    for kind, fixed, var in (("KEYS", fixed_keys, var_keys), ("ARGV", fixed_argv, var_argv)):
        for n in map(int, re.findall(rf"\b{kind}\[(\d+)\]", body)):
            assert n <= fixed or (var and n >= var), f"{path.name} uses undeclared {kind}[{n}]"
        if not var:
            assert f"#{kind}" not in body, f"{path.name}: #{kind} without a variadic {kind}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_script_builds_a_key(path):
    script = scripts.load(path.stem)
    body = _strip_comments(script.source)
    flow = _KeyFlow(body)
    calls = list(_redis_calls(body))
    assert calls
    for args in calls:
        command = args[0].strip("'\"").upper()
        if command in _KEYLESS:
            continue
        assert len(args) > 1 and ".." not in args[1], f"{path.name}: key built in {args}"
        assert flow.is_key(args[1]), f"{path.name}: {args[1]!r} in {args} is not from KEYS"


def test_key_flow_check_catches_built_keys():
    """The checker itself: a concatenated or literal key must be flagged."""
    bad = ("local k = KEYS[1]\nlocal j = 'emq:{q}:job:' .. ARGV[1]\n"
           "redis.call('DEL', j)\nredis.call('HGET', k .. ':x', 'f')\n"
           "redis.call('GET', 'emq:{q}:meta')\nredis.call('SET', KEYS[2], 1)\n")
    flow = _KeyFlow(bad)
    verdicts = [flow.is_key(args[1]) and ".." not in args[1] for args in _redis_calls(bad)]
    assert verdicts == [False, False, False, True]


def test_key_flow_takes_a_range_of_keys_but_not_of_argv():
    """enqueue_many.lua's EXISTS over a chunk of KEYS passes; ARGV does not."""
    src = "redis.call('EXISTS', unpack(KEYS, 7, 9))\nredis.call('DEL', unpack(ARGV, 1, 2))\n"
    flow = _KeyFlow(src)
    assert [flow.is_key(args[1]) for args in _redis_calls(src)] == [True, False]


# --- named KEYS and ARGV --------------------------------------------------------------------

INCLUDES = sorted((LUA / "includes").glob("*.lua"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_header_names_are_the_bindings_and_the_body_reads_only_them(path):
    """Each header entry is bound once, by its header name, in the block that opens the
    body; outside it no KEYS[n] / ARGV[n] is read by position, KEYS[i] / ARGV[i] only
    where the header declares a variadic tail, and no bound name is declared again."""
    naming = lua_static.naming(path.stem, path.read_text())
    assert naming.violations() == []


def test_no_positional_read_remains_outside_the_bindings():
    """The count over every script and include: 0 reads of KEYS[n] / ARGV[n] by position
    outside a script's binding block."""
    found = []
    for path in FILES:
        naming = lua_static.naming(path.stem, path.read_text())
        found += [f"{path.name}:{line}: {text}" for line, text in naming.positional]
    for path in INCLUDES:
        found += [f"includes/{path.name}:{line}: {text}"
                  for line, text in lua_static.include_positional(path.read_text())]
    assert len(found) == 0, found


def test_naming_check_catches_a_script_out_of_step_with_its_header():
    """The checker itself: a misnamed, missing or doubly declared binding, a positional
    read in the body and an index into KEYS without a tail are each flagged."""
    raw = ("-- x.lua: a move.\n"
           "-- KEYS[1] job_key  job hash\n"
           "-- KEYS[2] meta     meta hash\n"
           "-- ARGV[1] id       job id\n"
           "-- ARGV[2] version  keyspace version\n"
           "--@include common\n\n"
           "local job_key = KEYS[1]\n"
           "local meta = KEYS[2]\n"
           "local ident = ARGV[1]\n\n"
           "local function f(job_key) return job_key end\n"
           "redis.call('HGET', job_key, ARGV[2])\n"
           "for i = 1, 2 do redis.call('DEL', KEYS[i]) end\n"
           "-- a comment may say KEYS[2]\n"
           "return 'ARGV[1]'\n")
    naming = lua_static.naming("x", raw)
    assert [(line, text) for line, text in naming.positional] == [(13, "ARGV[2]")]
    flagged = [v.split(": ", 1)[1] for v in naming.violations()]
    assert len(flagged) == 5, flagged
    assert flagged[0].startswith("KEYS[2] is bound as 'meta'")
    assert flagged[1].startswith("the binding block")
    assert "reads ARGV[2] by position" in flagged[2]
    assert "indexes KEYS without a variadic tail" in flagged[3]
    assert "'job_key' is bound to a KEYS/ARGV entry and declared again" in flagged[4]


def test_every_script_compiles_on_the_server(r):
    """The bindings stay within Lua's limits (200 locals per function, 60 upvalues): Redis
    compiles each script as sent."""
    for path in FILES:
        r.script_load(scripts.load(path.stem).source)


# --- error codes ---------------------------------------------------------------------------

def test_every_lua_error_code_is_mapped():
    mapped = set(errors.codes())
    used = set()
    for path in [*FILES, *sorted((LUA / "includes").glob("*.lua"))]:
        src = path.read_text()
        used |= set(re.findall(r"['\"](EMQ[A-Z]+)\b", src))
        used |= set(re.findall(r"\b(EMQ[A-Z]+)\b", "\n".join(_header(src))))
        for m in re.finditer(r"redis\.error_reply\s*\(", src):
            arg = _split_args(src, m.end() - 1)[0][0]
            assert re.match(r"['\"]EMQ[A-Z]+ ", arg) or _IDENT.fullmatch(arg), \
                f"{path.name}: error reply without an EMQ<CODE> prefix: {arg}"
    assert used, "no codes found: the scan is broken"
    assert used <= mapped, f"unmapped codes: {used - mapped}"
    for code, cls in errors.codes().items():
        typed = errors.from_reply(f"{code} some message")
        assert isinstance(typed, cls) and isinstance(typed, errors.EmqError)
        assert str(typed) == "some message"


# --- Python call sites ---------------------------------------------------------------------

def _exercise_engine(redis_url: str, qname: str, r) -> None:
    """Drive every engine move through the public API (incl. a Worker's whole life)."""
    q = make_queue(redis_url, qname)
    q.enqueue("a")
    q.enqueue_many(["b", "c"])
    due = q.enqueue_in("d", 30)
    wait_server_past(r, q.get(due.id).run_at_ms)
    assert q.promote() == 1
    [(stale, _)] = claim(q, "zombie", lease_ms=50)  # test-side call: not counted
    wait_server_past(r, int(r.zscore(q.keys.active, stale)))
    assert q.reap() == (1, 0)
    gone = q.enqueue_in("e", 60_000)
    assert q.cancel(gone.id)
    q.pause()
    q.resume()
    q.enqueue("boom", attempts=2, backoff=emqfast.Backoff.fixed(20))

    def handler(job):
        job.extend_lease(10_000)
        if job.payload == "boom":
            raise RuntimeError("boom")
        return job.payload
    emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    failed = q.job_ids("failed")
    assert len(failed) == 1
    q.retry(failed[0])
    q.trim(keep_completed=0, keep_failed=0)
    # release: a worker stopped with a job claimed that its handler has not begun (a
    # running handler is never released: it would run twice)
    q.enqueue("busy")
    q.enqueue("held")
    gate = threading.Event()
    w = emqfast.Worker(q, lambda job: gate.wait(20), concurrency=1, prefetch=1,
                       shutdown_timeout_s=0.1)
    t = threading.Thread(target=w.run)
    t.start()
    wait_until(lambda: w.stats.claimed >= 2, what="held job claimed")
    w.stop()
    wait_until(lambda: w.stats.released >= 1, what="held job released")
    gate.set()
    t.join(30)
    assert w.stats.released >= 1


def test_call_sites_pass_what_headers_declare(monkeypatch, redis_url, qname, r):
    by_sha = {s.sha: s for s in (scripts.load(p.stem) for p in FILES)}
    seen: List[Tuple[str, int, int]] = []

    def from_package() -> bool:
        frame = sys._getframe(2)
        return frame.f_code.co_filename.startswith(PACKAGE_DIR)

    real_call = scripts.Script.__call__
    real_many = Batcher.evalsha_many

    def spy_call(self, client, keys, args):
        if from_package():
            seen.append((self.name, len(keys), len(args)))
        return real_call(self, client, keys, args)

    def spy_many(self, sha, script, numkeys, calls):
        for call in calls:
            seen.append((by_sha[sha].name, numkeys, len(call) - numkeys))
        return real_many(self, sha, script, numkeys, calls)

    real_send = scripts.send

    def spy_send(client, calls, *a, **kw):
        # pipelines (run_pipeline) go through scripts.send; calls made
        # by Script.__call__ are counted (or skipped as test-side) by spy_call already
        caller = sys._getframe(1).f_code
        if caller.co_filename.startswith(PACKAGE_DIR) and caller.co_name != "__call__":
            for script, keys, args in calls:
                seen.append((script.name, len(keys), len(args)))
        return real_send(client, calls, *a, **kw)

    monkeypatch.setattr(scripts, "send", spy_send)
    monkeypatch.setattr(drive, "send", spy_send)  # the drivers' pipelines of script calls
    monkeypatch.setattr(scripts.Script, "__call__", spy_call)
    monkeypatch.setattr(Batcher, "evalsha_many", spy_many)
    previous = emqfast.backend()
    from emqfast.backends.select import use
    use("python")  # so enqueue_many goes through the spied redis-py Batcher
    try:
        _exercise_engine(redis_url, qname, r)
    finally:
        use(previous)
    assert ENGINE <= {name for name, _, _ in seen}, ENGINE - {name for name, _, _ in seen}
    for name, n_keys, n_args in seen:
        raw = (LUA / f"{name}.lua").read_text()
        fixed_keys, var_keys = _declared(raw, "KEYS")
        fixed_argv, var_argv = _declared(raw, "ARGV")
        if var_keys:
            assert n_keys >= fixed_keys, (name, n_keys)
        else:
            assert n_keys == fixed_keys, (name, n_keys)
        if var_argv:
            assert n_args >= fixed_argv, (name, n_args)
        else:
            assert n_args == fixed_argv, (name, n_args)
        if name == "claim" and n_keys > fixed_keys:
            # group keys: ring, gactive, glimit, grate, the claim record, then a lane and a
            # rate key per group name (ARGV: three group settings, the request id, the names)
            assert n_keys - fixed_keys - 5 == 2 * (n_args - fixed_argv - 4), (n_keys, n_args)
        elif name == "start":
            # a key and an id/token pair per job, then a rate key and a name per group
            jobs = (n_args - fixed_argv) - (n_keys - fixed_keys)
            assert 0 <= jobs <= n_keys - fixed_keys, (n_keys, n_args)
        elif var_keys and var_argv:  # one job key per variadic id (pairs/triples count as one)
            extra_keys, extra_args = n_keys - fixed_keys, n_args - fixed_argv
            per = 4 if name == "complete" else None  # id, token, result, run
            assert extra_args in ((per * extra_keys,) if per else (extra_keys, 2 * extra_keys)), (
                name, n_keys, n_args)
