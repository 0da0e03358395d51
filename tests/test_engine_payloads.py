"""Engine contract: payloads are bytes or JSON, round-trip exactly, never pickle."""
from __future__ import annotations

import math
import os
import pickle

import pytest

import emqfast
from conftest import dump_queue
from emqfast.core.errors import PayloadError
from engine_util import make_queue

JSON_VALUES = [
    {"to": "ada@example.com", "n": 3, "tags": ["a", "b"], "nested": {"x": None, "y": [1.5, -2]}},
    ["mixed", 1, 2.25, True, False, None, {"k": "v"}],
    "plain text",
    "ünïcødé ✓ 日本語 \u2028 \x00 inside",
    "",
    0,
    -(2 ** 70),
    1e-300,
    0.1,
    True,
    None,
    [],
    {},
]

BYTES_VALUES = [b"", b"\x00", b"\xff\xfe\xfd not utf-8 \x80", bytes(range(256)), b"{\"looks\": \"json\"}"]


class _Trap:
    """Unpickling this creates a file: proof that something unpickled a payload."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def q(redis_url, qname):
    return make_queue(redis_url, qname)


@pytest.mark.parametrize("value", JSON_VALUES + BYTES_VALUES, ids=repr)
def test_payload_round_trips_exactly(q, value):
    ref = q.enqueue(value)
    stored = q.get(ref.id).payload
    assert stored == value and type(stored) is type(value)
    if isinstance(value, float):
        assert math.copysign(1, stored) == math.copysign(1, value)


def test_payloads_reach_the_handler_exactly(q, backend):
    values = JSON_VALUES + BYTES_VALUES
    refs = q.enqueue_many(values)
    refs += [q.enqueue(bytearray(b"\x01\xff")), q.enqueue(memoryview(b"mv\x00"))]
    seen = {}
    emqfast.Worker(q, lambda job: seen.__setitem__(job.id, job.payload)).run_until_idle(30)
    expected = values + [b"\x01\xff", b"mv\x00"]
    for ref, value in zip(refs, expected):
        assert seen[ref.id] == value and type(seen[ref.id]) is type(value)


def test_pickle_payload_is_returned_as_bytes_never_unpickled(q, tmp_path):
    trap = tmp_path / "unpickled"
    blob = pickle.dumps(_Trap(str(trap)))
    ref = q.enqueue(blob)
    got = []
    emqfast.Worker(q, lambda job: got.append(job.payload)).run_until_idle(30)
    assert q.get(ref.id).payload == blob
    assert got == [blob] and isinstance(got[0], bytes)
    assert not os.path.exists(trap)


@pytest.mark.parametrize("bad", [
    object(),
    {"s": {1, 2}},
    float("nan"),
    {"x": float("inf")},
    [float("-inf")],
    "lone \ud800 surrogate",
    {"key \udfff": 1},
    {("tuple", "key"): 1},
], ids=["object", "set", "nan", "inf", "-inf", "surrogate", "surrogate-key", "tuple-key"])
def test_unserialisable_payload_is_payload_error(r, q, qname, backend, bad):
    q.enqueue("seed")
    before = dump_queue(r, qname)
    with pytest.raises(PayloadError):
        q.enqueue(bad)
    with pytest.raises(PayloadError):
        q.enqueue_many(["fine", bad, "fine"])
    assert dump_queue(r, qname) == before


def test_payload_size_limit(r, redis_url, qname, backend):
    q = make_queue(redis_url, qname, max_payload_bytes=16)
    assert q.get(q.enqueue(b"x" * 16).id).payload == b"x" * 16
    assert q.get(q.enqueue("x" * 14).id).payload == "x" * 14  # '"' + 14 + '"' = 16 bytes
    before = dump_queue(r, qname)
    for bad in (b"x" * 17, "x" * 15, "é" * 8, ["x" * 20]):
        with pytest.raises(PayloadError):
            q.enqueue(bad)
        with pytest.raises(PayloadError):
            q.enqueue_many([b"ok", bad])
    assert dump_queue(r, qname) == before
