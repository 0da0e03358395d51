"""The Batcher against a real redis-server: the C one (hiredis, `_native`) and
its redis-py twin (`pure_batcher`) must behave the same for every batch.

Tests taking the `c_only` fixture cover what only the C Batcher does
itself: connecting, auth, reconnecting, timeouts, fork and thread safety.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import shutil
import threading
import time
import uuid

import pytest
import redis
from redis.exceptions import DataError, ResponseError

from conftest import require_native, start_redis_server
from emqfast.backends import pure_batcher
from emqfast.core.errors import (BackendUnavailable, ConnectionFailed, InvalidInput,
    PermissionDenied)

backend = importlib.import_module("emqfast.backend")  # emqfast.backend is also a function


def _script(source: str):
    body = source.encode()
    return hashlib.sha1(body).hexdigest(), body


ECHO = _script("return ARGV")
SHAPES = _script("""
local what = ARGV[1]
if what == 'int' then return tonumber(ARGV[2]) end
if what == 'bulk' then return ARGV[2] end
if what == 'status' then return redis.status_reply('FINE') end
if what == 'nil' then return false end
if what == 'nested' then return {1, {KEYS[1], {}}, 'x'} end
if what == 'error' then return redis.error_reply('EMQRANGE ' .. ARGV[2]) end
if what == 'crash' then return nosuchfunction() end
return redis.call('GET', KEYS[1])
""")
COUNT = _script("return redis.call('INCR', KEYS[1])")
HSET_ZADD = _script("""
redis.call('HSET', KEYS[1], 'v', ARGV[1])
return redis.call('ZADD', KEYS[2], ARGV[2], KEYS[1])
""")
SPIN = _script("local t = redis.call('TIME') local stop = t[1] * 1e6 + t[2] + ARGV[1] * 1e3 "
               "repeat t = redis.call('TIME') until t[1] * 1e6 + t[2] >= stop return 1")


def _key() -> str:
    return "emq-batch-test:" + uuid.uuid4().hex


def _native():
    require_native()
    return importlib.import_module("emqfast.backends.native")


@pytest.fixture(params=["c", "python"])
def batcher(request, r):
    """A Batcher of each kind on the session server."""
    module = _native() if request.param == "c" else pure_batcher
    b = module.Batcher.from_redis(r)
    yield b
    b.close()


@pytest.fixture
def c_only():
    return _native()


@pytest.fixture
def private_redis():
    """A redis-server of the test's own (it may be killed); yields start(extra_args)."""
    started = []

    def start(*extra_args, port=None):
        proc, port, workdir = start_redis_server(extra_args, port=port)
        started.append((proc, workdir))
        return proc, port, workdir

    yield start
    for proc, workdir in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _comparable(replies):
    return [("error", type(x), str(x)) if isinstance(x, Exception) else x for x in replies]


# --- both Batchers -----------------------------------------------------------
def test_reply_shapes(batcher, r):
    key = _key()
    r.set(key, b"stored")
    sha, body = SHAPES
    calls = [[key, "int", "42"], [key, "int", "-7"], [key, "bulk", b"\x00\xffbin"],
             [key, "status", ""], [key, "nil", ""], [key, "nested", ""],
             [key, "error", "bad run_at"], [key, "get", ""]]
    out = batcher.evalsha_many(sha, body, 1, calls)
    assert out[:6] == [42, -7, b"\x00\xffbin", b"FINE", None, [1, [key.encode(), []], b"x"]]
    assert isinstance(out[6], ResponseError) and str(out[6]) == "EMQRANGE bad run_at"
    assert out[7] == b"stored"


def test_error_replies_are_returned_per_call(batcher):
    sha, body = SHAPES
    out = batcher.evalsha_many(sha, body, 1, [["k", "crash", ""], ["k", "int", "1"],
                                              ["k", "error", "x"], ["k", "int", "2"]])
    assert isinstance(out[0], ResponseError) and "nosuchfunction" in str(out[0])
    assert out[1] == 1 and out[3] == 2
    assert isinstance(out[2], ResponseError) and str(out[2]) == "EMQRANGE x"
    # the connection is still in step afterwards
    assert batcher.evalsha_flat(sha, body, 1, 3, ["k", "int", "5"]) == [5]


def test_values_are_encoded_like_redis_py(batcher):
    sha, body = ECHO
    out = batcher.evalsha_many(sha, body, 0, [[b"raw", "h\u00e9", 12, -3, 1.5, 2**70]])
    assert out == [[b"raw", "h\u00e9".encode(), b"12", b"-3", b"1.5", str(2**70).encode()]]
    with pytest.raises(DataError):
        batcher.evalsha_many(sha, body, 0, [[True]])


def test_flat_and_many_agree(batcher):
    sha, body = ECHO
    calls = [[str(i), b"x" * i] for i in range(50)]
    flat = [v for call in calls for v in call]
    assert batcher.evalsha_flat(sha, body, 0, 2, flat) == \
        batcher.evalsha_many(sha, body, 0, calls) == \
        [[str(i).encode(), b"x" * i] for i in range(50)]


def test_calls_of_different_lengths(batcher):
    sha, body = ECHO
    calls = [[], [b"a"], [b"a", b"b", b"c"], [1, 2]]
    assert batcher.evalsha_many(sha, body, 0, calls) == [[], [b"a"], [b"a", b"b", b"c"],
                                                         [b"1", b"2"]]


def test_integer_fast_path(batcher, r):
    sha, body = HSET_ZADD
    h, z = _key(), _key()
    flat = []
    for i in range(1000):
        flat += [f"{h}:{i}", z, b"v", i]
    assert batcher.evalsha_flat(sha, body, 2, 4, flat) == [1] * 1000
    assert batcher.evalsha_flat(sha, body, 2, 4, flat) == [0] * 1000  # already members
    assert r.zcard(z) == 1000 and r.hget(f"{h}:7", "v") == b"v"


def test_noscript_loads_once_and_runs_each_call_once(batcher, r):
    sha, body = COUNT
    key = _key()
    r.script_flush()
    assert batcher.evalsha_many(sha, body, 1, [[key]] * 30) == list(range(1, 31))
    r.script_flush()
    assert batcher.evalsha_flat(sha, body, 1, 1, [key] * 30) == list(range(31, 61))
    assert int(r.get(key)) == 60
    assert r.script_exists(sha) == [True]


def test_big_batch_is_chunked_in_order(batcher):
    sha, body = _script("return {tonumber(ARGV[1]), string.len(ARGV[2])}")
    payload = b"p" * 4096
    n = 3000  # ~12 MB: more than one 8 MB chunk
    out = batcher.evalsha_flat(sha, body, 0, 2, [v for i in range(n) for v in (i, payload)])
    assert out == [[i, 4096] for i in range(n)]


def test_bad_numkeys_is_a_per_call_error(batcher):
    sha, body = ECHO
    out = batcher.evalsha_many(sha, body, 5, [[b"a"], [b"b"]])
    assert all(isinstance(x, ResponseError) for x in out)


def test_empty_batches(batcher):
    sha, body = ECHO
    assert batcher.evalsha_many(sha, body, 0, []) == []
    assert batcher.evalsha_flat(sha, body, 0, 2, []) == []


def test_c_and_python_agree(r):
    native, pure = _native(), pure_batcher
    sha, body = SHAPES
    key = _key()
    calls = [[key, what, arg] for what in ("int", "bulk", "status", "nil", "nested", "error",
                                           "crash", "get") for arg in ("1", "x\u00e9")]
    with native.Batcher.from_redis(r) as c:
        assert _comparable(c.evalsha_many(sha, body, 1, calls)) == \
            _comparable(pure.Batcher.from_redis(r).evalsha_many(sha, body, 1, calls))


def test_walking_nodes_reads_int_arrays_whole_and_mixed_ones_item_by_item(c_only):
    """walk_nodes reads an array of ints in one slice (an ack's run times); arrays that
    hold anything else, nested or empty ones, read as before."""
    from emqfast.backends.native_batcher import walk_nodes
    data = b"ab"
    nodes = [5, 3, 0, 1, 7, 0, 1, -1, 0, 1, 9, 0,        # [7, -1, 9]
             5, 3, 0, 1, 1, 0, 5, 2, 0, 1, 2, 0, 1, 3, 0, 2, 0, 2,  # [1, [2, 3], b"ab"]
             5, 0, 0,                                    # []
             5, 2, 0, 3, 0, 0, 1, 4, 0,                  # [None, 4]
             1, 5, 0]                                    # 5
    assert walk_nodes(nodes, data, 5) == [[7, -1, 9], [1, [2, 3], b"ab"], [], [None, 4], 5]


# --- the C Batcher's own connection --------------------------------------
def test_connects_lazily_and_reports_where(c_only):
    b = c_only.Batcher(host="127.0.0.1", port=1)  # nothing listens on port 1
    with pytest.raises(ConnectionFailed, match="127.0.0.1:1"):
        b.evalsha_many(*ECHO, 0, [[b"x"]])


def test_password_never_in_errors(c_only, private_redis):
    secret = "s3cr3t-" + uuid.uuid4().hex
    _, port, _ = private_redis()
    redis.Redis(port=port).config_set("requirepass", secret)
    client = redis.Redis(port=port, password=secret)
    with c_only.Batcher.from_redis(client) as b:
        assert b.evalsha_many(*ECHO, 0, [[b"ok"]]) == [[b"ok"]]
    for kwargs in ({"password": secret + "x"}, {"username": "nobody", "password": secret},
                   {"password": secret, "db": 99}):
        with pytest.raises((ConnectionFailed, PermissionDenied)) as info:  # wrong auth: the latter
            c_only.Batcher(port=port, **kwargs).evalsha_many(*ECHO, 0, [[b"x"]])
        assert secret not in str(info.value) and secret not in repr(info.value.args)


def test_acl_user_and_db(c_only, private_redis, r):
    _, port, _ = private_redis()
    admin = redis.Redis(port=port)
    admin.acl_setuser("worker", enabled=True, passwords=["+pw"], keys=["*"],
                      commands=["+@all"])
    sha, body = COUNT
    with c_only.Batcher(port=port, username="worker", password="pw", db=3) as b:
        assert b.evalsha_many(sha, body, 1, [["n"]]) == [1]
    assert redis.Redis(port=port, db=3).get("n") == b"1" and admin.get("n") is None


def test_unix_socket(c_only, private_redis, tmp_path):
    sock = str(tmp_path / "redis.sock")
    private_redis("--unixsocket", sock, "--unixsocketperm", "700")
    client = redis.Redis(unix_socket_path=sock, db=1)
    with c_only.Batcher.from_redis(client) as b:
        assert b.evalsha_many(*COUNT, 1, [["u"]] * 3) == [1, 2, 3]
    assert client.get("u") == b"3"


def test_from_redis_refuses_what_it_cannot_speak(c_only):
    from redis.cluster import RedisCluster
    from redis.sentinel import Sentinel

    with pytest.raises(BackendUnavailable, match="TLS"):  # a TLS setting C cannot honour
        c_only.Batcher.from_redis(redis.Redis(ssl=True, ssl_ca_data="-----BEGIN ..."))
    with pytest.raises(BackendUnavailable, match="Cluster"):
        c_only.Batcher.from_redis(object.__new__(RedisCluster))
    with pytest.raises(BackendUnavailable, match="Sentinel"):
        c_only.Batcher.from_redis(Sentinel([("127.0.0.1", 1)]).master_for("m"))


def test_reconnects_when_the_server_dropped_us(c_only, private_redis):
    _, port, _ = private_redis()
    admin = redis.Redis(port=port)
    with c_only.Batcher(port=port) as b:
        assert b.evalsha_many(*COUNT, 1, [["k"]]) == [1]
        admin.client_kill_filter(_type="normal", skipme=True)
        assert b.evalsha_many(*COUNT, 1, [["k"]]) == [2]


def test_survives_a_server_restart_between_batches(c_only, private_redis):
    proc, port, _ = private_redis()
    with c_only.Batcher(port=port) as b:
        assert b.evalsha_many(*COUNT, 1, [["k"]]) == [1]
        proc.terminate()
        proc.wait(10)
        private_redis(port=port)
        assert b.evalsha_many(*COUNT, 1, [["k"]]) == [1]  # NOSCRIPT handled too


def test_failure_mid_batch_raises_and_is_not_resent(c_only, private_redis):
    proc, port, _ = private_redis()
    with c_only.Batcher(port=port) as b:
        b.evalsha_many(*SPIN, 0, [[1]])  # connected, script loaded
        threading.Timer(0.3, proc.kill).start()
        with pytest.raises(ConnectionFailed, match="may have partly run"):
            b.evalsha_many(*SPIN, 0, [[1000]])


def test_socket_timeout(c_only, private_redis):
    _, port, _ = private_redis()
    with c_only.Batcher(port=port, socket_timeout=0.2) as b:
        b.evalsha_many(*SPIN, 0, [[1]])
        started = time.monotonic()
        with pytest.raises(ConnectionFailed, match="timed out"):
            b.evalsha_many(*SPIN, 0, [[800]])
        assert time.monotonic() - started < 0.7
        with redis.Redis(port=port, socket_timeout=10) as probe:
            probe.ping()  # answered once the server is free again: the script has finished
        assert b.evalsha_many(*SPIN, 0, [[1]]) == [1]


def test_script_not_matching_sha_is_refused(c_only, r):
    r.script_flush()
    sha, _ = ECHO
    with c_only.Batcher.from_redis(r) as b, pytest.raises(InvalidInput, match="hashes to"):
        b.evalsha_many(sha, b"return 1", 0, [[b"x"]])


def test_input_checks(c_only):
    b = c_only.Batcher()
    with pytest.raises(InvalidInput):
        b.evalsha_flat(*ECHO, 0, 2, [b"a", b"b", b"c"])
    with pytest.raises(InvalidInput):
        c_only.Batcher(port=0)


def test_threads_share_one_batcher(c_only, r):
    key = _key()
    errors = []

    with c_only.Batcher.from_redis(r) as b:
        def work():
            try:
                for _ in range(20):
                    out = b.evalsha_flat(*COUNT, 1, 1, [key] * 50)
                    assert out == sorted(out) and len(out) == 50
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and int(r.get(key)) == 4 * 20 * 50


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_gets_its_own_connection(c_only, r):
    key = _key()
    with c_only.Batcher.from_redis(r) as b:
        assert b.evalsha_many(*COUNT, 1, [[key]]) == [1]
        pid = os.fork()
        if pid == 0:  # child: must not talk over the parent's socket
            ok = b.evalsha_many(*COUNT, 1, [[key]]) == [2]
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        assert b.evalsha_many(*COUNT, 1, [[key]]) == [3]


def test_close_then_reuse(c_only, r):
    b = c_only.Batcher.from_redis(r)
    assert b.evalsha_many(*ECHO, 0, [[b"a"]]) == [[b"a"]]
    b.close()
    b.close()
    assert b.evalsha_many(*ECHO, 0, [[b"b"]]) == [[b"b"]]
    b.close()
