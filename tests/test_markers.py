"""ManyMarkers: one blocking connection waits on many queues' wake markers (a real
redis-server; a half-open connection through tests/fault_proxy.py)."""
from __future__ import annotations

import threading
import uuid
from typing import Any, List

import pytest
import redis

import emqfast
from emqfast.backends.markers import ManyMarkers
from emqfast.core.errors import BackendUnavailable, InvalidInput, ReplyLost
from emqfast.core.keys import QueueKeys
from fault_proxy import FaultProxy
from waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def _markers(n: int) -> List[str]:
    tag = uuid.uuid4().hex[:8]
    return [QueueKeys(f"mm-{tag}-{i}").marker for i in range(n)]


def test_one_connection_waits_on_two_hundred_queues(redis_url, r):
    keys = _markers(200)
    name = "mm-" + uuid.uuid4().hex[:8]
    waiter = ManyMarkers(redis.Redis.from_url(redis_url, client_name=name))
    got: List[Any] = []
    t = threading.Thread(target=lambda: got.append(waiter.wait(keys, 20)), daemon=True)
    t.start()
    wait_until(lambda: any(c.get("name") == name and c.get("cmd") == "bzpopmin"
                           for c in r.client_list()), 10, "the wait blocked")
    assert sum(1 for c in r.client_list() if c.get("name") == name) == 1
    r.zadd(keys[137], {b"w": 5})
    t.join(10)
    assert got == [(keys[137], b"w", 5.0)]
    assert r.exists(keys[137]) == 0  # popped
    waiter.close()


def test_a_set_marker_is_popped_at_once_and_a_quiet_wait_times_out(redis_url, r):
    keys = _markers(3)
    r.zadd(keys[2], {b"due": 1})
    waiter = ManyMarkers(redis.Redis.from_url(redis_url))
    assert waiter.wait(keys, 5) == (keys[2], b"due", 1.0)
    assert waiter.wait(keys, 0.05) is None
    waiter.close()


def test_a_half_open_wait_is_typed_within_its_deadline_and_the_next_redials(redis_url, r):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    keys = _markers(2)
    with FaultProxy(upstream_port=port, seed=3) as proxy:
        waiter = ManyMarkers(redis.Redis.from_url(proxy.url(), socket_timeout=0.5))
        assert waiter.wait(keys, 0.05) is None  # a live connection
        assert proxy.half_open() == 1
        with pytest.raises(ReplyLost):
            waiter.wait(keys, 0.5)  # block time plus margin, then dropped
        r.zadd(keys[0], {b"m": 2})
        assert waiter.wait(keys, 5) == (keys[0], b"m", 2.0)
        waiter.close()


def test_refusals_are_typed():
    with pytest.raises(BackendUnavailable, match="CROSSSLOT"):
        ManyMarkers(object())
    with pytest.raises(InvalidInput):
        ManyMarkers(redis.Redis()).wait([], 1)


def test_a_connect_client_works_too(redis_url, r):
    keys = _markers(2)
    r.zadd(keys[1], {b"x": 3})
    waiter = ManyMarkers(emqfast.connect(redis_url))
    assert waiter.wait(keys, 1) == (keys[1], b"x", 3.0)
    waiter.close()
