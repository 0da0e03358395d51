"""A bulk enqueue builds its rows with the cyclic GC paused (emqfast/core/gcpause.py): the
app's GC setting is what it was after the call, whether it succeeded or refused its input."""
from __future__ import annotations

import gc

import pytest

import emqfast
from emqfast.core.errors import PayloadError
from emqfast.core.gcpause import BULK, gc_paused


def test_bulk_enqueue_leaves_the_collector_on(redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    assert gc.isenabled()
    refs = q.enqueue_many(list(range(3 * BULK)))
    assert gc.isenabled()
    assert len(refs) == 3 * BULK and q.counts()["pending"] == 3 * BULK


def test_refused_input_leaves_the_collector_on_and_redis_untouched(redis_url, qname, r):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    payloads = [{"n": i} for i in range(2 * BULK)]
    payloads[BULK] = object()  # not JSON: the whole batch is refused
    with pytest.raises(PayloadError):
        q.enqueue_many(payloads)
    assert gc.isenabled()
    assert list(r.scan_iter(match=f"emq:{{{qname}}}:*")) == []


def test_an_app_that_turned_the_collector_off_keeps_it_off(redis_url, qname):
    q = emqfast.Queue(qname, emqfast.connect(redis_url))
    gc.disable()
    try:
        q.enqueue_many(list(range(2 * BULK)))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_pauses_end_with_the_outer_one():
    with gc_paused(BULK):
        assert not gc.isenabled()
        with gc_paused(BULK):
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause found it off: not its to turn on
    assert gc.isenabled()
    with gc_paused(BULK - 1):  # small batches do not touch it
        assert gc.isenabled()
