"""What a handler may return.

bytes results are stored like bytes payloads and read back as the same bytes; JSON
results as before; a result that is neither (a set, a datetime) fails the job for good
with a PayloadError that says the side effects already happened and how to convert.
"""
from __future__ import annotations

import asyncio
import datetime as dt

import pytest

import emqfast
import emqfast.aio as emq
from emqfast import Queue, Worker
from emqfast.core import codec
from emqfast.core.errors import PayloadError
from emqfast.tools.render import job_detail_table, job_dict

BLOB = bytes(range(256))  # every byte value, not UTF-8; starts with 0x00
RESULTS = [BLOB, b"", b"\xffb\xff", b'{"a": 1}', bytearray(b"ba"), {"k": [1, "x"]}, "text",
           0, 1.5, True, None, [1, 2]]
WANT = [BLOB, b"", b"\xffb\xff", b'{"a": 1}', b"ba", {"k": [1, "x"]}, "text", 0, 1.5, True,
        None, [1, 2]]


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_codec_round_trips_bytes_and_json_results():
    for value, want in zip(RESULTS, WANT):
        stored = b"null" if value is None else codec.encode_handler_result(value)
        back = codec.decode_result(stored)
        assert back == want and type(back) is type(want)


def test_results_written_before_still_read_as_json():
    assert codec.decode_result(b'"\xc3\xa9"') == "é"
    assert codec.decode_result(None) is None
    with pytest.raises(PayloadError, match="not valid JSON"):
        codec.decode_result(b"{oops")
    with pytest.raises(PayloadError, match="unknown encoding marker"):
        codec.decode_result(b"\xffz1")


@pytest.mark.parametrize("value", [{1, 2}, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc),
                                   float("nan"), object()])
def test_non_json_result_message_says_what_happened_and_what_to_do(value):
    with pytest.raises(PayloadError) as info:
        codec.encode_handler_result(value)
    text = str(info.value)
    assert "not JSON-serialisable" in text and type(value).__name__ in text
    assert "side effects happened" in text and "not retried" in text
    assert "list" in text and "isoformat()" in text and "bytes" in text


def test_sync_worker_stores_bytes_results(redis_url, qname, backend):
    q = Queue(qname, emqfast.connect(redis_url))
    refs = q.enqueue_many(list(range(len(RESULTS))))
    stats = Worker(q, lambda job: RESULTS[job.payload]).run_until_idle(30)
    assert stats.completed == len(RESULTS) and stats.failed == 0
    got = [q.get(ref.id).result for ref in refs]
    assert got == WANT and type(got[0]) is bytes


def test_sync_worker_fails_a_non_json_result_for_good(redis_url, qname, backend):
    q = Queue(qname, emqfast.connect(redis_url))
    side_effects = []
    ref = q.enqueue({"n": 1}, attempts=3)

    def handler(job):
        side_effects.append(job.id)
        return {1, 2, 3}

    stats = Worker(q, handler).run_until_idle(30)
    assert stats.failed == 1 and stats.retried == 0 and side_effects == [ref.id]
    job = q.get(ref.id)
    assert job.state == "failed" and job.error.startswith("PayloadError: ")
    assert "not JSON-serialisable" in job.error and "side effects happened" in job.error


def test_aio_worker_stores_bytes_and_refuses_a_datetime(redis_url, qname):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        blob = await q.enqueue("blob")
        when = await q.enqueue("when")

        async def handler(job):
            return BLOB if job.payload == "blob" else dt.datetime.now(dt.timezone.utc)

        stats = await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        assert stats.completed == 1 and stats.failed == 1 and stats.retried == 0
        assert (await q.get(blob.id)).result == BLOB
        failed = await q.get(when.id)
        assert failed.state == "failed" and "isoformat()" in failed.error
        await q.aclose()
    _run(main())


def test_cli_shows_a_bytes_result(redis_url, qname):
    """``emqfast jobs QUEUE ID [--json]`` renders a bytes result like a bytes payload."""
    import json

    q = Queue(qname, emqfast.connect(redis_url))
    ref = q.enqueue(b"in\xff")
    Worker(q, lambda job: b"out\xff").run_until_idle(30)
    job = q.get(ref.id)
    shown = json.loads(json.dumps(job_dict(job)))
    assert shown["result"] == {"bytes": "out\\xff"} and shown["payload"] == {"bytes": "in\\xff"}
    assert job_detail_table(job, 0).row_count > 0
