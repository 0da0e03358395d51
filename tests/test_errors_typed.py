"""Every error a user can hit from the public Queue API is an ``emqfast.EmqError``:
the common wrong inputs, tried on every public method of ``Queue``, its
``schedules`` and ``groups``, in both facades, raise typed errors with a message (some
also subclass ValueError/TypeError/LookupError, as Python would have raised); a key that
another program wrote with another type and an unreachable server are typed too."""
from __future__ import annotations

import asyncio
import datetime as dt
import inspect
from typing import Any, Iterator, List, Tuple

import pytest
import redis

import emqfast
import emqfast.aio

BAD = [None, "x", -1, 1.5, object(), [], {}, b"\xff", "JOBx", 10**30, True, {1, 2},
       float("nan"), dt.datetime(2030, 1, 1), "a\nb", " ", "\x00", "bad{name"]
SKIP = {"obliterate", "events", "retry_partial"}  # no arguments to get wrong / iterators


def good_args(job_id: str) -> dict:
    """A valid value for each required parameter, so one parameter at a time is wrong."""
    return {"payload": {"a": 1}, "payloads": [{"a": 1}], "job_id": job_id,
            "run_at_ms": 1_900_000_000_000, "delay_ms": 1000, "state": "pending",
            "name": "n1", "max_jobs": 5, "window_ms": 1000, "group": "g1", "limit": 5,
            "n": 1, "groups": ["g1"], "specs": [{"name": "s1", "every_ms": 1000}],
            "every_ms": 1000}


def public_methods(q: Any) -> Iterator[Tuple[str, Any]]:
    for owner, prefix in ((q, ""), (q.schedules, "schedules."), (q.groups, "groups.")):
        for name in dir(owner):
            fn = getattr(owner, name)
            if not name.startswith("_") and callable(fn) and name not in SKIP:
                yield prefix + name, fn


def calls(fn: Any, job_id: str) -> Iterator[Tuple[str, dict]]:
    """Each wrong value in each parameter, the others valid."""
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    good = good_args(job_id)
    for p in params:
        others = {o.name: good.get(o.name) for o in params
                  if o.default is o.empty and o is not p}
        if any(v is None for v in others.values()):
            continue  # a required parameter this test has no valid value for
        for value in BAD:
            yield f"{p.name}={value!r:.30}", {**others, p.name: value}


def escaped(outcomes: List[Tuple[str, BaseException]]) -> List[str]:
    return [f"{label}: {type(e).__name__}: {e}" for label, e in outcomes
            if not isinstance(e, emqfast.EmqError) or not str(e).strip()]


def test_sync_queue_wrong_inputs_are_typed(redis_url, qname):
    q = emqfast.Queue(qname, redis_url)
    job_id = q.enqueue({"a": 1}).id
    outcomes: List[Tuple[str, BaseException]] = []
    tried = 0
    for name, fn in public_methods(q):
        for label, kwargs in calls(fn, job_id):
            tried += 1
            try:
                fn(**kwargs)
            except Exception as exc:  # noqa: BLE001 - sorted below
                outcomes.append((f"{name}({label})", exc))
    assert tried > 500 and len(outcomes) > 300  # the sweep did reach the methods
    assert escaped(outcomes) == []


def test_aio_queue_wrong_inputs_are_typed(redis_url, qname):
    async def main() -> List[Tuple[str, BaseException]]:
        q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))
        job_id = (await q.enqueue({"a": 1})).id
        outcomes = []
        for name, fn in public_methods(q):
            for label, kwargs in calls(fn, job_id):
                try:
                    out = fn(**kwargs)
                    if inspect.isawaitable(out):
                        await out
                except Exception as exc:  # noqa: BLE001 - sorted below
                    outcomes.append((f"{name}({label})", exc))
        await q.aclose()
        return outcomes
    outcomes = asyncio.run(main())
    assert len(outcomes) > 300
    assert escaped(outcomes) == []


@pytest.mark.parametrize("args, kwargs", [
    ((None,), {}), ((123,), {}), (("bad{name",), {}), (("q", 42), {}),
    (("q",), {"attempts": "3"}), (("q",), {"backoff": 5}), (("q",), {"max_payload_bytes": -1}),
    (("q",), {"wait_replicas": 1.5}),
])
def test_wrong_queue_construction_is_typed(redis_url, args, kwargs):
    if len(args) == 1:
        args = (*args, redis_url)
    for cls in (emqfast.Queue, emqfast.aio.Queue):
        with pytest.raises(emqfast.EmqError):
            cls(*args, **kwargs)


def test_a_key_of_another_type_is_a_typed_conflict(r, qname):
    q = emqfast.Queue(qname, r)
    ref = q.enqueue({"a": 1})
    r.delete(q.keys.pending)
    r.set(q.keys.pending, "written by someone else")
    for call in (lambda: q.enqueue({"b": 2}), q.counts, lambda: q.job_ids("pending"),
                 lambda: q.cancel(ref.id), lambda: q.enqueue_many([1, 2])):
        with pytest.raises(emqfast.errors.KeyTypeConflict, match="another queue name"):
            call()


def test_an_unreachable_server_is_typed_in_both_facades():
    q = emqfast.Queue("nowhere", "redis://127.0.0.1:1/0")
    for call in (lambda: q.enqueue(1), lambda: q.get("JOBx"), q.counts,
                 lambda: q.enqueue_many([1, 2])):
        with pytest.raises(emqfast.ConnectionFailed):
            call()

    async def main() -> None:
        aq = emqfast.aio.Queue("nowhere", emqfast.aio.connect("redis://127.0.0.1:1/0"))
        with pytest.raises(emqfast.ConnectionFailed):
            await aq.enqueue(1)
    asyncio.run(main())
    assert issubclass(emqfast.ConnectionFailed, ConnectionError)
    assert issubclass(emqfast.errors.KeyTypeConflict, TypeError)


def test_wrong_worker_construction_is_typed(redis_url, qname):
    sync_q = emqfast.Queue(qname, redis_url)
    aio_q = emqfast.aio.Queue(qname, emqfast.aio.connect(redis_url))

    async def coroutine_handler(job: Any) -> None:
        return None
    for cls, q, other_q, other_handler in (
            (emqfast.Worker, sync_q, aio_q, coroutine_handler),
            (emqfast.aio.Worker, aio_q, sync_q, None)):
        bad: List[Tuple[tuple, dict]] = [
            ((None, print), {}), ((other_q, print), {}), ((q, None), {}), ((q, 42), {}),
            ((q, print), {"concurrency": 0}), ((q, print), {"concurrency": "2"}),
            ((q, print), {"lease_ms": -1}), ((q, print), {"prefetch": -1}),
            ((q, print), {"batch_size": -1}), ((q, print), {"max_stalled": -1})]
        if other_handler is not None:
            bad.append(((q, other_handler), {}))
        for args, kwargs in bad:
            with pytest.raises(emqfast.EmqError) as err:
                cls(*args, **kwargs)
            assert str(err.value), (cls, args, kwargs)
        with pytest.raises(TypeError):  # still a TypeError, as before
            cls(q, None)
