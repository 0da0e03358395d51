"""Forked producers must never mint the same job ids.

A process nonce drawn once at import (or one of few bits) is shared by processes forked
after import: they mint identical ids in the same millisecond, and the second enqueue of
such an id is a silent ``duplicate``: the job is never stored."""
from __future__ import annotations

import multiprocessing
import os
import time

import redis

import emqfast
from emqfast.core import ids

PRODUCERS, ROUNDS, PER_ROUND = 4, 5, 2_000


def _produce(redis_url: str, qname: str, start_ms: int) -> int:
    """In a forked child: enqueue ROUNDS x PER_ROUND jobs, each round starting at the same
    instant in every child (as a pre-forked server's workers would, under load)."""
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.redis.ping()
    admitted = 0
    for round_ in range(ROUNDS):
        target = start_ms + round_ * 150
        while time.time_ns() // 1_000_000 < target:
            pass  # spin: a sleep would wake each child at a different millisecond
        refs = q.enqueue_many([{"pid": os.getpid()}] * PER_ROUND)
        admitted += sum(ref.status != "duplicate" for ref in refs)
    return admitted


def test_forked_producers_store_every_job(redis_url, r, qname):
    ids.new_id()  # the parent has minted (and drawn its nonce) before forking
    start_ms = time.time_ns() // 1_000_000 + 300
    children = []
    for _ in range(PRODUCERS):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 1
            try:
                code = 0 if _produce(redis_url, qname, start_ms) == ROUNDS * PER_ROUND else 3
            finally:
                os._exit(code)
        children.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
    assert codes == [0] * PRODUCERS, "a child saw duplicates (or failed)"
    assert emqfast.Queue(qname, r).counts()["pending"] == PRODUCERS * ROUNDS * PER_ROUND


def _mint(n: int) -> list:
    return ids.new_ids(n)


def test_multiprocessing_workers_mint_distinct_ids():
    ids.new_id()
    with multiprocessing.get_context("fork").Pool(4) as pool:
        batches = pool.map(_mint, [5_000] * 8)
    minted = [i for batch in batches for i in batch] + ids.new_ids(5_000)
    assert len(set(minted)) == len(minted)
    nonces = {i[11:11 + 11] for i in minted}
    assert len(nonces) >= 2  # the pool's processes each drew their own nonce


def test_ids_are_branded_sortable_short_and_parse_their_mint_time():
    batch = ids.new_ids(70_000)  # past the counter table: the slow formatting path too
    assert all(len(i) == ids.ID_LENGTH == 26 and i.startswith("JOB") for i in batch[::997])
    assert batch == sorted(batch) and len(set(batch)) == len(batch)
    assert ids.mint_time_ms(batch[0]) is not None
    assert ids.mint_time_ms("JOB" + "0" * 12 + "ABCD" + "00000001") == 0  # the 27-char form
    assert ids.mint_time_ms("JOB-mine") is None
    assert ids.mint_time_ms("JOB01A22CDA006CRABCDEF0123456789") is None  # a schedule id


def _mint_in_child_at(frozen_ns: int, out_w: int) -> None:  # pragma: no cover - child
    try:
        time.time_ns = lambda: frozen_ns  # the same millisecond as every sibling
        os.write(out_w, ",".join(ids.new_ids(1_000)).encode() + b"\n")
    finally:
        os._exit(0)


def test_siblings_forked_in_one_millisecond_mint_disjoint_ids():
    frozen_ns = time.time_ns()
    ids.new_ids(10)
    out_r, out_w = os.pipe()
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            _mint_in_child_at(frozen_ns, out_w)
        children.append(pid)
    os.close(out_w)
    with os.fdopen(out_r) as reader:
        lines = reader.read().split()
    for pid in children:
        os.waitpid(pid, 0)
    first, second = (set(line.split(",")) for line in lines)
    assert len(first) == len(second) == 1_000 and not first & second
