"""Tracing (the ``otel`` extra): enqueue stamps the producer's W3C traceparent in
the job's options; both Workers run the handler in a CONSUMER span that is its child (retries
too, with a link), carrying queue, job id, attempt and outcome. Checked with the SDK's
in-memory exporter against a real redis-server, under both backends (sync) and asyncio."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
import redis

pytest.importorskip("opentelemetry.sdk", reason="the otel extra (test extra installs the SDK)")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

import emqfast  # noqa: E402
import emqfast.aio as emq  # noqa: E402
from emqfast import Backoff  # noqa: E402
from emqfast.facade import tracing  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider():
    """One SDK provider for the module (the global provider can be set only once)."""
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(sdk)
    tracing.refresh()  # Workers look the provider up at most once a second
    yield sdk
    sdk.shutdown()  # the rest of the session exports nothing (the global provider stays set)


@pytest.fixture(autouse=True)
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def producer_tracer():
    return trace.get_tracer("test-producer")


def runs_of(exporter, queue):
    """The finished handler spans of ``queue``, by attempt."""
    found = [s for s in exporter.get_finished_spans() if s.name == f"emqfast.run {queue}"]
    return sorted(found, key=lambda s: s.attributes["emqfast.attempt"])


def test_enqueue_without_a_span_stores_no_trace_context(r, redis_url, qname):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    ref = q.enqueue({"n": 1})
    assert r.hget(f"emq:{{{qname}}}:job:{ref.id}", "opts") is None  # still the compact default
    assert tracing.stamp(b"") == b""


def test_sync_worker_span_is_child_of_the_producer(r, redis_url, qname, backend, spans):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    with producer_tracer().start_as_current_span("produce") as producer:
        ref = q.enqueue({"n": 1}, priority=3)
        many = q.enqueue_many([{"n": 2}, {"n": 3}])
    opts = json.loads(r.hget(f"emq:{{{qname}}}:job:{ref.id}", "opts"))
    want = producer.get_span_context()
    assert opts["tp"] == f"00-{want.trace_id:032x}-{want.span_id:016x}-{int(want.trace_flags):02x}"
    assert opts["p"] == 3  # the other options are intact
    inside = {}

    def handler(job):
        inside[job.id] = trace.get_current_span().get_span_context().span_id
        return job.payload["n"]

    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30)
    assert stats.completed == 3
    finished = runs_of(spans, qname)
    assert sorted(s.attributes["emqfast.job_id"] for s in finished) == \
        sorted([ref.id] + [m.id for m in many])
    for span in finished:
        assert span.kind is SpanKind.CONSUMER
        assert span.parent.span_id == want.span_id
        assert span.context.trace_id == want.trace_id
        assert span.context.span_id == inside[span.attributes["emqfast.job_id"]]
        assert dict(span.attributes) == {
            "emqfast.queue": qname, "emqfast.job_id": span.attributes["emqfast.job_id"],
            "emqfast.attempt": 1, "emqfast.outcome": "completed"}
        assert not span.links


def test_a_retry_is_a_second_child_linked_to_the_producer(redis_url, qname, spans):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    with producer_tracer().start_as_current_span("produce") as producer:
        q.enqueue_in("x", 0, attempts=3, backoff=Backoff.fixed(20))

    def handler(job):
        if job.attempts == 1:
            raise ValueError("first try fails")
        return "ok"

    stats = emqfast.Worker(q, handler).run_until_idle(timeout_s=30, wait_scheduled=True)
    assert (stats.retried, stats.completed) == (1, 1)
    first, second = runs_of(spans, qname)
    want = producer.get_span_context()
    assert first.attributes["emqfast.outcome"] == "failed"
    assert first.status.status_code is StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    assert (second.attributes["emqfast.attempt"], second.attributes["emqfast.outcome"]) == \
        (2, "completed")
    assert first.parent.span_id == second.parent.span_id == want.span_id
    assert [(link.context.span_id, dict(link.attributes)) for link in second.links] == \
        [(want.span_id, {"emqfast.retry": True})]


def test_job_enqueued_without_context_runs_in_a_root_span(redis_url, qname, spans):
    q = emqfast.Queue(qname, redis.Redis.from_url(redis_url))
    q.enqueue("x")
    emqfast.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
    (span,) = runs_of(spans, qname)
    assert span.parent is None
    assert span.attributes["emqfast.outcome"] == "completed"


def test_aio_worker_spans_coroutine_and_plain_handlers(redis_url, qname, spans):
    async def main():
        q = emq.Queue(qname, emq.connect(redis_url))
        with producer_tracer().start_as_current_span("produce") as producer:
            await q.enqueue("a")
            await q.enqueue_at("b", 0)
        seen = []

        async def handler(job):
            seen.append(trace.get_current_span().get_span_context().span_id)
            if job.payload == "b":
                raise emqfast.Unrecoverable("no")

        await emq.Worker(q, handler).run_until_idle(timeout_s=30)
        await q.enqueue("c")
        await emq.Worker(q, lambda job: None).run_until_idle(timeout_s=30)
        await q.aclose()
        return producer.get_span_context(), seen
    want, seen = asyncio.run(asyncio.wait_for(main(), 60))
    finished = runs_of(spans, qname)
    by_outcome = sorted((s.attributes["emqfast.outcome"], s.parent.span_id if s.parent else 0)
                        for s in finished)
    assert by_outcome == sorted([("completed", want.span_id), ("failed", want.span_id),
                                 ("completed", 0)])
    assert sorted(seen) == sorted(s.context.span_id for s in finished if s.parent)


def test_zero_cost_without_the_extra():
    """With opentelemetry not importable, both hooks hand back what they were given."""
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from emqfast.facade import tracing\n"
        "def h(job): pass\n"
        "assert not tracing.available()\n"
        "assert tracing.traced(h, 'q') is h\n"
        "assert tracing.stamp(b'') == b'' and tracing.stamp(b'{\"a\":1}') == b'{\"a\":1}'\n"
        "assert tracing.current_traceparent() is None\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)


def test_no_span_while_no_sdk_is_configured():
    """With the API alone (its no-op provider) a handler runs without a span."""
    code = (
        "from emqfast.facade import tracing\n"
        "from emqfast.facade.job import Job\n"
        "assert tracing.available() and tracing._tracer() is None\n"
        "job = Job(id='JOBx', queue='q', state='active', payload=None, attempts=1)\n"
        "assert tracing.traced(lambda j: 7, 'q')(job) == 7\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
