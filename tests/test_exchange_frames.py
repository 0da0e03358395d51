"""emqfast frames its script calls with hiredis (C) on redis.asyncio connections too,
whose own packer is pure Python (the asyncio Worker's drain runs on them). The bytes on the
wire must be exactly what the connection would have sent, and what redis-py refuses stays
refused."""
from __future__ import annotations

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import DataError

from emqfast.backends.transport import _frames

COMMANDS = [("EVALSHA", "a" * 40, 2, "emq:{q}:job:JOB1", "emq:{q}:pending", b"\xffraw\x00",
             0, 12345678901234567890, "é✓", 0.1, 1e300),
            ("SCRIPT", "LOAD", "return 1"), ("WAIT", 1, 1000)]


def _own(conn, commands):
    return b"".join(piece for args in commands for piece in conn.pack_command(*args))


@pytest.mark.parametrize("make", [aioredis.Connection, redis.Connection])
def test_frames_are_the_connections_own_bytes(make):
    conn = make()
    [(data, upto)] = list(_frames(conn, COMMANDS))
    assert upto == len(COMMANDS) and data == _own(conn, COMMANDS)


def test_a_connection_with_another_encoding_frames_with_its_own_packer():
    conn = aioredis.Connection(encoding="latin-1")
    [(data, _)] = list(_frames(conn, [("SET", "k", "é")]))
    assert data == _own(conn, [("SET", "k", "é")]) and b"\xe9" in data


def test_what_redis_py_refuses_is_refused_the_same_way():
    with pytest.raises(DataError):
        list(_frames(aioredis.Connection(), [("SET", "k", True)]))
