"""Every transient server answer is classified the same way wherever it arrives.

BUSY, LOADING, READONLY, MASTERDOWN, TRYAGAIN and CLUSTERDOWN are ``ServerBusy`` whose
``state`` is the server's code, OOM is ``ServerFull``: from a single command, a script,
a pipeline (redis-py words an error of one of its commands "Command # 1 (...) of
pipeline caused error: BUSY ..."), either Batcher and pub/sub. A Worker waits them out;
an unclassified one would end ``Worker.run()``.
"""
from __future__ import annotations

import asyncio
import hashlib
import importlib
import shutil
import threading

import pytest
import redis
import redis.asyncio

import emqfast
import emqfast.aio
from emqfast.backends import pure_batcher
from emqfast.core.errors import ServerBusy, ServerFull, is_transient, translate

from conftest import require_native, start_redis_server
from engine_util import raised
from waiting import wait_until

from emqfast.backends.native_batcher import _RedisParser as _Parser  # both Batchers' mapping

STATES = ("BUSY", "LOADING", "READONLY", "MASTERDOWN", "TRYAGAIN", "CLUSTERDOWN")
MESSAGES = {"BUSY": "Redis is busy running a script. You can only call SCRIPT KILL or "
                    "SHUTDOWN NOSAVE.",
            "LOADING": "Redis is loading the dataset in memory",
            "READONLY": "You can't write against a read only replica.",
            "MASTERDOWN": "Link with MASTER is down and replica-serve-stale-data is set "
                          "to 'no'.",
            "TRYAGAIN": "Multiple keys request during rehashing of slot",
            "CLUSTERDOWN": "The cluster is down",
            "OOM": "command not allowed when used memory > 'maxmemory'."}


def _pipelined(exc: Exception, pipeline: object) -> Exception:
    """``exc`` worded as redis-py words the error of a pipeline's first command."""
    pipeline.annotate_exception(exc, 1, ("EVALSHA", "abc", "1", "emq:{q}:job:JOBx"))
    return exc


def _wordings(code: str):
    """The exception each path hands emqfast for the error reply ``code ...``."""
    reply = f"{code} {MESSAGES[code]}"
    sync_pipe = redis.Redis().pipeline(transaction=False)  # never connects
    aio_pipe = redis.asyncio.Redis().pipeline(transaction=False)
    yield "single", _Parser.parse_error(reply)
    yield "pipeline", _pipelined(_Parser.parse_error(reply), sync_pipe)
    yield "asyncio pipeline", _pipelined(_Parser.parse_error(reply), aio_pipe)
    yield "transaction", _pipelined(_Parser.parse_error(reply),
                                    redis.Redis().pipeline(transaction=True))
    # a server before Redis 7 wraps the error of a command a script calls
    yield "script", _Parser.parse_error(
        f"ERR Error running script (call to f_abc): @user_script:3: @user_script: 3: "
        f"-{reply}")


@pytest.mark.parametrize("code", STATES)
def test_a_transient_state_is_server_busy_in_every_wording(code):
    for where, exc in _wordings(code):
        typed = translate(exc)
        assert isinstance(typed, ServerBusy), (where, type(typed), str(exc))
        assert typed.state == code, (where, typed.state)
        assert is_transient(exc), where


def test_oom_is_server_full_in_every_wording():
    for where, exc in _wordings("OOM"):
        assert isinstance(translate(exc), ServerFull), (where, str(exc))
        assert is_transient(exc), where


def test_our_own_codes_are_typed_inside_a_pipeline():
    exc = _pipelined(_Parser.parse_error("EMQNOJOB no such job"),
                     redis.Redis().pipeline(transaction=False))
    assert type(translate(exc)).__name__ == "JobNotFound"


# --- a real busy server: every path answers ServerBusy("BUSY") --------------------------

ECHO = b"return KEYS[1]"
ECHO_SHA = hashlib.sha1(ECHO).hexdigest()
SPIN = ("local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + 20e6 "
        "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop return 1")


@pytest.fixture
def busy_server():
    """A private server kept busy in a read-only script until the test ends (SCRIPT KILL)."""
    proc, port, workdir = start_redis_server(["--busy-reply-threshold", "10"])
    url = f"redis://127.0.0.1:{port}/0"
    admin = redis.Redis.from_url(url, socket_timeout=30)
    spinner = threading.Thread(target=lambda: _spin(url), daemon=True)
    yield url, lambda: (spinner.start(), wait_until(lambda: _is_busy(admin), 15,
                                                    "the server to answer BUSY"))
    try:
        admin.script_kill()
    except redis.RedisError:
        pass
    spinner.join(30)
    proc.kill()
    proc.wait(10)
    shutil.rmtree(workdir, ignore_errors=True)


def _spin(url: str) -> None:
    try:
        redis.Redis.from_url(url, socket_timeout=60).eval(SPIN, 0)
    except redis.RedisError:
        pass  # killed: the test is over


def _is_busy(admin: redis.Redis) -> bool:
    try:
        admin.ping()
        return False
    except redis.ResponseError as exc:
        return "BUSY" in str(exc)


def _batchers(r: redis.Redis):
    yield "python batcher", pure_batcher.Batcher.from_redis(r)
    try:
        require_native()
    except pytest.skip.Exception:
        return
    yield "c batcher", importlib.import_module("emqfast.backends.native").Batcher.from_redis(r)


def test_every_path_answers_server_busy_from_a_busy_server(busy_server, qname):
    url, make_busy = busy_server
    r = redis.Redis.from_url(url)
    q = emqfast.Queue(qname, r)
    ref = q.enqueue("x")
    batchers = list(_batchers(r))
    make_busy()
    got = {
        "single command": raised(lambda: q.pause()),
        "script": raised(lambda: q.enqueue("y")),
        "pipeline (get)": raised(lambda: q.get(ref.id)),
        "pipeline (counts)": raised(q.counts),
        "pub/sub (wait)": raised(lambda: ref.wait(timeout_s=5)),
    }
    for name, batcher in batchers:
        try:
            replies = batcher.evalsha_many(ECHO_SHA, ECHO, 1, [["emq-busy"]])
        except Exception as exc:  # noqa: BLE001 - a batch refused as a whole
            got[name] = exc
        else:
            got[name] = translate(replies[0]) if isinstance(replies[0], Exception) \
                else None
        finally:
            batcher.close()
    wrong = {where: (type(exc).__name__, getattr(exc, "state", None), str(exc)[:120])
             for where, exc in got.items()
             if not (isinstance(exc, ServerBusy) and exc.state == "BUSY")}
    assert not wrong, wrong


def test_every_asyncio_path_answers_server_busy_from_a_busy_server(busy_server, qname):
    url, make_busy = busy_server

    async def main() -> dict:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(url))
        ref = await q.enqueue("x")
        make_busy()
        got = {}
        for where, call in [("single command", q.pause), ("script", lambda: q.enqueue("y")),
                            ("pipeline (get)", lambda: q.get(ref.id)),
                            ("pipeline (counts)", q.counts),
                            ("pub/sub", lambda: ref.wait(timeout_s=5))]:
            try:
                await call()
                got[where] = None
            except Exception as exc:  # noqa: BLE001 - inspected below
                got[where] = exc
        return got
    got = asyncio.run(main())
    wrong = {where: (type(exc).__name__, getattr(exc, "state", None), str(exc)[:120])
             for where, exc in got.items()
             if not (isinstance(exc, ServerBusy) and exc.state == "BUSY")}
    assert not wrong, wrong
