"""Deduplication: ``enqueue(..., dedupe_key=, dedupe_ms=, dedupe=)`` and
``enqueue_many(..., dedupe_keys=)`` on both facades and both backends. ``drop`` writes
nothing while the key's job waits or runs (and within its window), naming that job;
``extend`` restarts the window; ``replace`` debounces a waiting job (new payload and run-at)
and hands the key to a new job when the holder is already running. 8 racing producer
processes admit exactly one job. Bad input is typed and leaves Redis byte-identical."""
from __future__ import annotations

import asyncio
import multiprocessing
from typing import Any, List

import pytest

import emqfast
import emqfast.aio
from conftest import dump_queue
from emqfast import InvalidInput
from emqfast.core.errors import InputTypeError, RangeError
from emqfast.facade.dedupe import extras as dedupe_extras
from engine_util import claim, server_ms, wait_server_past

HOUR_MS = 3_600_000


@pytest.fixture(params=["sync", "aio"])
def call(request, redis_url, backend):
    """``call(q, method, *args)`` on the facade under test; ``call.make(name)`` its Queue."""
    def run(q: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        out = getattr(q, method)(*args, **kwargs)
        return asyncio.run(out) if asyncio.iscoroutine(out) else out

    def make(name: str) -> Any:
        if request.param == "sync":
            return emqfast.Queue(name, redis_url)
        return emqfast.aio.Queue(name, emqfast.aio.connect(redis_url))
    run.make = make  # type: ignore[attr-defined]
    return run


def test_drop_names_the_waiting_job_and_writes_nothing(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", {"n": 1}, dedupe_key="k")
    assert first.status == "pending"
    before = dump_queue(r, qname)
    again = call(q, "enqueue", {"n": 2}, dedupe_key="k")
    assert (again.id, again.status) == (first.id, "deduplicated")
    later = call(q, "enqueue_in", {"n": 3}, HOUR_MS, dedupe_key="k", dedupe="drop")
    assert (later.id, later.status) == (first.id, "deduplicated")
    assert dump_queue(r, qname) == before  # nothing written, not even an event
    assert call(q, "get", first.id).payload == {"n": 1}
    # another key, or none, is admitted as usual
    assert call(q, "enqueue", {"n": 4}, dedupe_key="other").status == "pending"
    assert call(q, "enqueue", {"n": 5}).status == "pending"


def test_drop_holds_while_active_and_frees_the_key_when_the_job_ends(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", "a", dedupe_key="k")
    [(job_id, token)] = claim(emqfast.Queue(qname, r), "w", lease_ms=60_000)
    assert job_id == first.id
    assert call(q, "enqueue", "b", dedupe_key="k").status == "deduplicated"
    from engine_util import complete
    complete(emqfast.Queue(qname, r), job_id, token)
    fresh = call(q, "enqueue", "c", dedupe_key="k")
    assert fresh.status == "pending" and fresh.id != first.id
    assert r.hget(q.keys.dedupe, "k").decode() == fresh.id


def test_a_window_ends_the_key_even_while_the_job_waits(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", "a", dedupe_key="k", dedupe_ms=300)
    assert call(q, "enqueue", "b", dedupe_key="k", dedupe_ms=300).status == "deduplicated"
    created = int(r.hget(q.keys.job(first.id), "created"))
    wait_server_past(r, created + 300)
    second = call(q, "enqueue", "c", dedupe_key="k", dedupe_ms=300)
    assert second.status == "pending" and second.id != first.id
    assert call(q, "counts")["pending"] == 2


def test_extend_restarts_the_window(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", "a", dedupe_key="k", dedupe_ms=400, dedupe="extend")
    until = int(r.hget(q.keys.job(first.id), "ddu"))
    wait_server_past(r, until - 200)
    again = call(q, "enqueue", "b", dedupe_key="k", dedupe_ms=400, dedupe="extend")
    assert (again.id, again.status) == (first.id, "deduplicated")
    extended = int(r.hget(q.keys.job(first.id), "ddu"))
    assert extended > until
    wait_server_past(r, until)  # past the first window, inside the extended one
    if server_ms(r) < extended:
        assert call(q, "enqueue", "c", dedupe_key="k", dedupe_ms=400,
                    dedupe="extend").id == first.id
    assert call(q, "get", first.id).payload == "a"  # extend never touches the payload


def test_replace_debounces_a_scheduled_job(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue_in", {"v": 1}, 60_000, dedupe_key="k", dedupe="replace")
    assert first.status == "scheduled"
    t0 = server_ms(r)
    again = call(q, "enqueue_in", {"v": 2}, HOUR_MS, dedupe_key="k", dedupe="replace")
    assert (again.id, again.status) == (first.id, "replaced")
    job = call(q, "get", first.id)
    assert job.payload == {"v": 2} and job.state == "scheduled"
    assert t0 + HOUR_MS <= job.run_at_ms <= server_ms(r) + HOUR_MS
    assert call(q, "counts")["scheduled"] == 1
    # replaced with no delay: the job is due now, on pending with its own score
    now = call(q, "enqueue", b"raw", dedupe_key="k", dedupe="replace")
    assert (now.id, now.status) == (first.id, "replaced")
    job = call(q, "get", first.id)
    assert (job.state, job.payload) == ("pending", b"raw")
    assert r.zscore(q.keys.pending, first.id) == float(r.hget(q.keys.job(first.id), "ps"))
    events = [e.name for e in call(q, "read_events")]
    assert events == ["enqueued", "replaced", "replaced"]


def test_replace_of_a_running_job_admits_the_new_one_and_moves_the_key(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", "a", dedupe_key="k", dedupe="replace")
    claim(emqfast.Queue(qname, r), "w", lease_ms=60_000)
    second = call(q, "enqueue", "b", dedupe_key="k", dedupe="replace")
    assert second.status == "pending" and second.id != first.id
    assert r.hget(q.keys.dedupe, "k").decode() == second.id
    third = call(q, "enqueue", "c", dedupe_key="k", dedupe="replace")
    assert (third.id, third.status) == (second.id, "replaced")
    assert call(q, "get", second.id).payload == "c"
    assert call(q, "get", first.id).payload == "a"


def test_replace_in_a_group_lane(call, r, qname):
    q = call.make(qname)
    first = call(q, "enqueue", "a", group="g1", dedupe_key="k", dedupe="replace")
    again = call(q, "enqueue_in", "b", HOUR_MS, group="g1", dedupe_key="k", dedupe="replace")
    assert (again.id, again.status) == (first.id, "replaced")
    assert call(q, "get", first.id).state == "scheduled"
    back = call(q, "enqueue", "c", group="g1", dedupe_key="k", dedupe="replace")
    assert back.status == "replaced" and call(q, "get", first.id).state == "pending"
    assert r.zscore(q.keys.group_pending("g1"), first.id) is not None
    before = dump_queue(r, qname)
    for group in ("g2", None):  # the waiting job's lane must be named
        with pytest.raises(InvalidInput, match="group"):
            call(q, "enqueue", "d", group=group, dedupe_key="k", dedupe="replace")
    assert dump_queue(r, qname) == before


def test_enqueue_many_with_keys_one_key_twice_in_a_batch(call, r, qname):
    q = call.make(qname)
    old = call(q, "enqueue", "old", dedupe_key="held")
    refs = call(q, "enqueue_many", ["a", "b", "c", "d", "e"],
                dedupe_keys=["x", "x", None, "held", "y"])
    assert refs[0].status == "pending"
    assert (refs[1].id, refs[1].status) == (refs[0].id, "deduplicated")
    assert refs[2].status == "pending"
    assert (refs[3].id, refs[3].status) == (old.id, "deduplicated")
    assert refs[4].status == "pending"
    assert call(q, "counts")["pending"] == 4
    assert {k.decode(): v.decode() for k, v in r.hgetall(q.keys.dedupe).items()} == {
        "held": old.id, "x": refs[0].id, "y": refs[4].id}
    # replace in a batch: the later payload wins, the ref names the first job
    refs = call(q, "enqueue_many", [1, 2, 3], dedupe_keys=["z"] * 3, dedupe="replace",
                delay_ms=HOUR_MS)
    assert [r_.status for r_ in refs] == ["scheduled", "replaced", "replaced"]
    assert {r_.id for r_ in refs} == {refs[0].id}
    assert call(q, "get", refs[0].id).payload == 3


def test_bad_input_is_typed_and_writes_nothing(call, r, qname):
    q = call.make(qname)
    call(q, "enqueue", "there", dedupe_key="k")
    before = dump_queue(r, qname)
    bad = [
        (dict(dedupe_key=""), InvalidInput),
        (dict(dedupe_key="x" * 1025), InvalidInput),
        (dict(dedupe_key=b"k"), InputTypeError),
        (dict(dedupe_key=7), InputTypeError),
        (dict(dedupe_key="k", dedupe="debounce"), InvalidInput),
        (dict(dedupe_key="k", dedupe=1), InvalidInput),
        (dict(dedupe_key="k", dedupe_ms=-5), RangeError),
        (dict(dedupe_key="k", dedupe_ms=0), RangeError),
        (dict(dedupe_key="k", dedupe_ms=1.5), InvalidInput),
        (dict(dedupe_key="k", dedupe_ms="10"), InvalidInput),
        (dict(dedupe_key="k", dedupe="extend"), InvalidInput),  # extend needs a window
        (dict(dedupe_ms=10), InvalidInput),                      # no key
        (dict(dedupe="drop"), InvalidInput),
    ]
    for kwargs, error in bad:
        with pytest.raises(error):
            call(q, "enqueue", "p", **kwargs)
    with pytest.raises(InputTypeError):
        call(q, "enqueue_many", ["a"], dedupe_keys="k")
    with pytest.raises(InvalidInput):
        call(q, "enqueue_many", ["a", "b"], dedupe_keys=["k"])
    with pytest.raises(InvalidInput):
        call(q, "enqueue_many", ["a", "b"], dedupe_keys=["k", ""])
    assert dump_queue(r, qname) == before


def test_the_script_refuses_malformed_extras_before_any_write(r, qname):
    q = emqfast.Queue(qname, r)
    q.enqueue("there")
    before = dump_queue(r, qname)
    from emqfast.facade.admission import ENQUEUE, fixed_keys
    from emqfast.core.version import KEYSPACE_VERSION
    keys = [q.keys.job("JOBx"), *fixed_keys(q.keys)]
    head = ["JOBx", "p", "j", "", 0, "now", 0, KEYSPACE_VERSION, 1]
    dkeys = [q.keys.dedupe, q.keys.job("JOBx"), q.keys.active]
    for extra, more_keys in [(["-1"], []), (["1.5"], []), (["", "k", "", "", "drop"], []),
                             (["", "", "", "", "drop"], dkeys), (["", "k", "", "", "zap"], dkeys),
                             (["", "k", "", "0", "drop"], dkeys), (["", "k", "XOB", "", "drop"],
                                                                  dkeys), (["", "k"], dkeys)]:
        with pytest.raises(InvalidInput):
            ENQUEUE(r, keys + more_keys, head + extra)
    assert dump_queue(r, qname) == before


def test_trim_takes_a_trimmed_jobs_key_with_it(r, qname):
    q = emqfast.Queue(qname, r)
    a = q.enqueue("a", dedupe_key="ka")
    b = q.enqueue("b", dedupe_key="kb")
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    newer = q.enqueue("b2", dedupe_key="kb")  # kb now held by a newer job
    assert newer.status == "pending"
    assert q.trim(keep_completed=0) == 2
    assert r.hgetall(q.keys.dedupe) == {b"kb": newer.id.encode()}
    assert not r.exists(q.keys.job(a.id)) and not r.exists(q.keys.job(b.id))


def _produce(url: str, queue: str, mode: str, start: Any, out: Any, n: int) -> None:
    """One racing producer: wait for the others, then enqueue the key ``n`` times."""
    q = emqfast.Queue(queue, url)
    start.wait()
    refs = [q.enqueue({"pid": multiprocessing.current_process().name, "i": i},
                      dedupe_key="race", dedupe=mode) for i in range(n)]
    out.put([(ref.id, ref.status) for ref in refs])


@pytest.mark.parametrize("mode", ["drop", "replace"])
def test_eight_racing_producers_admit_exactly_one_job(r, redis_url, qname, mode):
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=_produce, args=(redis_url, qname, mode, start, out, 25))
             for _ in range(8)]
    for p in procs:
        p.start()
    got: List[Any] = []
    for _ in procs:
        got += out.get(timeout=60)
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    q = emqfast.Queue(qname, r)
    admitted = [ref for ref in got if ref[1] == "pending"]
    assert len(admitted) == 1, admitted
    assert {ref[0] for ref in got} == {admitted[0][0]}
    other = "deduplicated" if mode == "drop" else "replaced"
    assert {ref[1] for ref in got} == {"pending", other}
    assert q.counts()["pending"] == 1
    assert r.hget(q.keys.dedupe, "race").decode() == admitted[0][0]


def test_plain_jobs_send_what_they_always_did(qname):
    """Jobs without dedupe or expiry pay nothing: enqueue.lua gets its 7 keys and 9 args,
    and enqueue_many stays on enqueue_many.lua's columns (no per-job call)."""
    from emqfast.core.ops import Batch, Columns
    from emqfast.facade import admission, enqueue_batch
    q = emqfast.Queue(qname, "redis://127.0.0.1:1/0")  # never connects
    shared = q._shared(0, None, None, None, None, None)
    call = admission.enqueue_call(q.keys, admission.Job("JOBa", b"1", "j"), shared)
    assert (len(call.keys), len(call.args)) == (7, 9)
    batch = enqueue_batch.EnqueueBatch([admission.Job("JOBa", b"1", "j")], shared)
    send = next(enqueue_batch.many_sends(1))
    request = enqueue_batch.chunk_request(q.keys, batch, send)
    assert isinstance(request, Columns) and request.script.name == "enqueue_many"
    keyed = enqueue_batch.EnqueueBatch([admission.Job("JOBa", b"1", "j")],
                                       shared._replace(extras=dedupe_extras(True, None, None,
                                                                            None)), None,
                                       dedupe_keys=["k"])
    assert isinstance(enqueue_batch.chunk_request(q.keys, keyed, send, [None]), Batch)


def test_depends_on_with_dedupe_is_refused(r, qname):
    q = emqfast.Queue(qname, r)
    dep = q.enqueue("dep")
    before = dump_queue(r, qname)
    with pytest.raises(InvalidInput, match="depends_on"):
        q.enqueue("x", depends_on=[dep], dedupe_key="k")
    with pytest.raises(InvalidInput, match="depends_on"):
        q.enqueue("x", depends_on=[dep], expires_ms=1000)
    assert dump_queue(r, qname) == before
