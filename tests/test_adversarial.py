"""Hostile input through the public API (hypothesis) against a real Redis.

Every call either succeeds and round-trips exactly, or raises a typed
``emqfast.EmqError`` and leaves the queue's keys byte-for-byte unchanged
(compared with ``DUMP`` of every key before and after).
"""
from __future__ import annotations

import itertools
import json
import math
import random
import re
import zoneinfo

import pytest
from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

import emqfast
from emqfast import EmqError, PayloadError, Queue, Worker
from emqfast.core.keys import QueueKeys

from conftest import dump_queue

SETTINGS = settings(max_examples=200, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])

_seq = itertools.count()

# --- strategies ---------------------------------------------------------------------------

huge_ints = st.sampled_from([0, 1, -1, 2**21 - 1, 2**21, 2**31, 2**53, 2**63, 2**64 + 1,
                             -(2**63), 10**30, -(10**30)])
hostile_numbers = st.one_of(
    st.integers(), huge_ints, st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, True, False, None, "5",
                     b"5", [1], 3 + 0j]),
)
hostile_text = st.one_of(
    st.text(), st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
    st.sampled_from(["", " ", "{", "}", "{x}", "a:b", "a b", "*", "?", "[a]", "\\", "\x00",
                     "é", "💥", "a" * 250, "JOB", "JOB{x}", "JOB\x00", "JOB" + "x" * 300]),
)
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), huge_ints,
              st.floats(allow_nan=False, allow_infinity=False), st.text()),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20,
)
not_json = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, {1, 2}, object(), {"k": b"bytes"},
                     [math.nan], {"x": {"y": math.inf}}, "\ud800", {"s": "\udfff"}]),
    st.builds(frozenset, st.lists(st.integers(), max_size=3)),
)
sized_bytes = st.sampled_from([0, 1, 255, 1 << 16, 1 << 20, 10 << 20]).map(
    lambda n: random.Random(n).randbytes(n))
payloads = st.one_of(st.binary(max_size=4096), sized_bytes,
                     st.binary().map(lambda b: b"\x80\x04\x95" + b + b"\xff\xfe"),  # not UTF-8
                     json_values, not_json)
job_ids = st.one_of(st.none(), st.just(None),
                    st.text(max_size=40).map(lambda s: "JOB" + s), hostile_text,
                    st.sampled_from([1, b"JOB1", ["JOB1"]]))


def fresh(r, qname: str) -> Queue:
    """A queue of this test, new for each example (keeps dumps small)."""
    return Queue(f"{qname}-{next(_seq)}", r)


def expect_round_trip(payload):
    """What a payload reads back as: bytes unchanged, anything else through JSON."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return bytes(payload)
    return json.loads(json.dumps(payload))


def check(r, q: Queue, call, on_success):
    """Run ``call``; success -> ``on_success(result)``; failure -> typed and untouched."""
    before = dump_queue(r, q.name)
    try:
        result = call()
    except EmqError as exc:
        event(f"typed error {type(exc).__name__}")  # shown by --hypothesis-show-statistics
        assert dump_queue(r, q.name) == before
        return None
    event("success")
    on_success(result)
    return result


# --- enqueue --------------------------------------------------------------------------------

def draw_fields(data, fields):
    """Draw every field plausible, or exactly one hostile, or all hostile (a third each),
    so the success path, each single bad argument and mixtures all get exercised."""
    mode = data.draw(st.sampled_from(["plausible", "one-hostile", "all-hostile"]), "mode")
    bad = data.draw(st.sampled_from(sorted(fields)), "hostile field") \
        if mode == "one-hostile" else None
    return {name: data.draw(hostile if mode == "all-hostile" or name == bad else plausible, name)
            for name, (plausible, hostile) in fields.items()}


ENQUEUE_FIELDS = {
    "payload": (st.one_of(st.binary(max_size=256), sized_bytes, json_values), payloads),
    "job_id": (st.one_of(st.none(), st.text(max_size=20).map(lambda s: "JOB" + s)), job_ids),
    "priority": (st.integers(0, 2**21 - 1), hostile_numbers),
    "attempts": (st.one_of(st.none(), st.integers(1, 10)), hostile_numbers),
    "when": (st.one_of(st.none(), st.tuples(st.sampled_from(["delay_ms", "run_at_ms"]),
                                            st.integers(0, 2**40))),
             st.tuples(st.sampled_from(["delay_ms", "run_at_ms"]), hostile_numbers)),
}


@SETTINGS
@given(data=st.data())
def test_enqueue_hostile_values(r, qname, data):
    f = draw_fields(data, ENQUEUE_FIELDS)
    payload, job_id, priority = f["payload"], f["job_id"], f["priority"]
    q = fresh(r, qname)
    kwargs = {"job_id": job_id, "priority": priority, "attempts": f["attempts"]}
    if f["when"]:
        kwargs[f["when"][0]] = f["when"][1]

    def ok(ref):
        job = q.get(ref.id)
        assert job is not None and ref.status in ("pending", "scheduled")
        assert job.payload == expect_round_trip(payload)
        assert isinstance(job.payload, bytes) == isinstance(payload, (bytes, bytearray))
        assert job.priority == priority and job.state == ref.status
        if job_id is not None:
            assert ref.id == job_id
            assert q.enqueue(b"again", job_id=job_id).duplicate  # idempotent, unchanged
            assert q.get(job_id).payload == job.payload

    check(r, q, lambda: q.enqueue(payload, **kwargs), ok)
    q.obliterate()


@SETTINGS
@given(items=st.lists(payloads.filter(lambda p: not isinstance(p, bytes) or len(p) < 1 << 16),
                      min_size=1, max_size=8),
       ids=st.one_of(st.none(), st.lists(job_ids, min_size=0, max_size=9)))
def test_enqueue_many_is_all_or_nothing_on_bad_input(r, qname, items, ids):
    q = fresh(r, qname)

    def ok(refs):
        assert len(refs) == len(items)
        for ref, payload in zip(refs, items):
            if not ref.duplicate:
                assert q.get(ref.id).payload == expect_round_trip(payload)

    check(r, q, lambda: q.enqueue_many(items, job_ids=ids), ok)
    q.obliterate()


# --- queue names ---------------------------------------------------------------------------

@SETTINGS
@given(name=hostile_text)
def test_queue_names_with_braces_colons_spaces_and_globs(r, qname, name):
    try:
        q = Queue(name, r)
    except EmqError:
        assert not isinstance(name, str) or "{" in name or "}" in name or not name.strip() \
            or len(name.encode("utf-8", "surrogatepass")) > 200 or _has_surrogate(name) \
            or re.search(r"[\x00-\x1f\x7f-\x9f]", name)  # blank / control chars (C0, C1)
        return
    assume(not r.exists(q.keys.meta))  # a name another test owns: leave it alone
    # a sibling whose name the glob of `name` could match if it were not escaped
    sibling = Queue(f"{qname}-sib-{next(_seq)}", r)
    sibling.enqueue(b"keep me")
    sib_before = dump_queue(r, sibling.name)
    ref = q.enqueue({"n": name})
    assert q.get(ref.id).payload == {"n": name}
    assert all(k.startswith(b"emq:{" + name.encode() + b"}:")
               for k in r.scan_iter(match=q.keys.glob()))
    assert q.obliterate() >= 4
    assert dump_queue(r, sibling.name) == sib_before  # obliterate touched only its own keys
    assert q.counts()["pending"] == 0
    sibling.obliterate()


def _has_surrogate(s: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in s)


# --- ids on inspection / control -------------------------------------------------------

@SETTINGS
@given(job_id=job_ids)
def test_get_cancel_retry_with_hostile_ids(r, qname, job_id):
    q = fresh(r, qname)
    q.enqueue(b"bystander")
    for op in (q.get, q.cancel, q.retry):
        before = dump_queue(r, q.name)
        try:
            result = op(job_id)
        except EmqError:
            assert dump_queue(r, q.name) == before
            continue
        assert result in (None, False)  # an unknown id: nothing to get or cancel
        assert dump_queue(r, q.name) == before
    q.obliterate()


@SETTINGS
@given(concurrency=hostile_numbers, lease_ms=hostile_numbers, limit=hostile_numbers)
def test_worker_and_moves_refuse_bad_numbers_with_typed_errors(r, qname, concurrency,
                                                               lease_ms, limit):
    q = fresh(r, qname)
    try:
        Worker(q, lambda job: None, concurrency=concurrency, lease_ms=lease_ms)
    except EmqError:
        pass
    for move in (lambda: q.promote(limit=limit), lambda: q.reap(limit=limit),
                 lambda: q.reap(max_stalled=limit), lambda: q.job_ids(limit),
                 lambda: q.job_ids("pending", limit), lambda: q.job_ids("completed", 0, limit),
                 lambda: q.trim(keep_completed=limit), lambda: q.trim(max_age_ms=limit),
                 lambda: q.trim(keep_completed=0, keep_failed=limit)):
        before = dump_queue(r, q.name)
        try:
            move()
        except EmqError:
            assert dump_queue(r, q.name) == before


# --- schedules: cron strings and time zones ------------------------------------------------

cron_fields = st.sampled_from(["*", "*/5", "0", "59", "60", "-1", "1-5", "5-1", "L", "?",
                               "MON", "JAN", "a", "", "1,2,3", "*/0", "99999999999"])
crons = st.one_of(st.lists(cron_fields, min_size=0, max_size=7).map(" ".join), st.text(),
                  st.sampled_from(["0 9 * * *", "* * * * *", "0 0 30 2 *", "@daily",
                                   "@reboot", "0 0 1 1 * 1999", "0 9 * * * *"]))
zones = st.one_of(st.none(), st.sampled_from(sorted(zoneinfo.available_timezones())[:400:7]),
                  st.sampled_from(["Europe/Paris", "UTC", "Mars/Olympus", "../etc/passwd",
                                   "", "Europe/", "+05:00", "\x00"]), st.text(max_size=20))


good_crons = st.sampled_from(["0 9 * * *", "*/5 * * * *", "30 2 * * *", "0 0 1 1 *",
                              "15 14 1 * *", "0 22 * * 1-5"])
good_zones = st.sampled_from(["UTC", "Europe/Paris", "America/New_York", "Asia/Kolkata",
                              "Australia/Lord_Howe", "Pacific/Chatham"])
SCHEDULE_FIELDS = {
    "name": (st.text(min_size=1, max_size=30).filter(lambda s: "{" not in s and "}" not in s
                                                     and not _has_surrogate(s)), hostile_text),
    "cadence": (st.one_of(st.tuples(good_crons, st.one_of(st.none(), good_zones), st.none()),
                          st.tuples(st.none(), st.none(), st.integers(1, 10**9))),
                st.tuples(st.one_of(st.none(), crons), zones,
                          st.one_of(st.none(), hostile_numbers))),
    "start": (st.one_of(st.none(), st.integers(0, 2**42)), hostile_numbers),
    "payload": (json_values, st.one_of(not_json, st.binary(max_size=64), json_values)),
}


@SETTINGS
@given(data=st.data())
def test_schedule_upsert_hostile(r, qname, data):
    f = draw_fields(data, SCHEDULE_FIELDS)
    name, (cron, tz, every), start, payload = f["name"], f["cadence"], f["start"], f["payload"]
    q = fresh(r, qname)

    def ok(sched):
        got = q.schedules.get(name)
        assert got is not None and got.name == name and got.payload == expect_round_trip(payload)
        assert (got.cron is None) == (cron is None)
        q.schedules.pump()  # minting from whatever was accepted must work too

    check(r, q, lambda: q.schedules.upsert(name, cron=cron, tz=tz, every_ms=every,
                                           start_at_ms=start, payload=payload), ok)
    q.obliterate()


# --- payload limit -------------------------------------------------------------------------

def test_payload_limit_is_configurable_with_a_clear_error(r, qname):
    q = Queue(qname, r, max_payload_bytes=1024)
    assert q.get(q.enqueue(b"x" * 1024).id).payload == b"x" * 1024  # at the limit: fine
    before = dump_queue(r, qname)
    with pytest.raises(PayloadError, match=r"1025 bytes exceeds the limit of 1024"):
        q.enqueue(b"x" * 1025)
    with pytest.raises(PayloadError, match="exceeds the limit of 1024"):
        q.enqueue({"text": "é" * 600})  # measured as encoded UTF-8 JSON, not characters
    with pytest.raises(PayloadError):
        q.enqueue_many([b"ok", b"y" * 2000, b"ok"])  # one too big: none written
    with pytest.raises(PayloadError):
        q.schedules.upsert("big", every_ms=1000, payload=b"z" * 4096)
    assert dump_queue(r, qname) == before
    assert isinstance(PayloadError("x"), emqfast.InvalidInput)  # one except clause catches all
    with pytest.raises(EmqError):
        Queue(qname, r, max_payload_bytes=-1)
    big = Queue(f"{qname}-default", r)  # the default takes a 10 MB payload
    blob = random.Random(7).randbytes(10 << 20)
    assert big.get(big.enqueue(blob).id).payload == blob
    big.obliterate()


def test_bad_trim_arguments_trim_nothing(r, qname):
    q = Queue(qname, r)
    q.enqueue_many([1, 2, 3])
    Worker(q, lambda job: None, keep_completed=100).run_until_idle(20)
    before = dump_queue(r, qname)
    with pytest.raises(EmqError):  # keep_completed is fine, keep_failed is not
        q.trim(keep_completed=0, keep_failed=-1)
    with pytest.raises(EmqError):
        q.trim(keep_completed=0, max_age_ms=float("nan"))
    assert dump_queue(r, qname) == before and q.counts()["completed"] == 3


def test_keys_of_hostile_names_stay_in_their_hash_tag():
    for name in ["a:b", "a b", "*", "??", "[x]", "é💥", " : "]:
        k = QueueKeys(name)
        assert k.meta == "emq:{" + name + "}:meta"
