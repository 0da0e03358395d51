"""OpenTelemetry tracing (the optional extra ``emqfast[otel]``): a producer's trace context
travels in the job, and the worker runs the handler in a span that is its child.

- **Enqueue**: when ``opentelemetry-api`` is importable and a span is active,
  :func:`stamp` adds the W3C ``traceparent`` of the current context to the job's
  options blob (key ``"tp"`` of the hash field ``opts``; see docs/ARCHITECTURE.md).
  Every job of one ``enqueue_many`` shares it, like the rest of its options. Schedules
  do not stamp: the jobs they mint have no producer span.
- **Worker**: :func:`traced` wraps the handler once, when the Worker is built. Each run
  is a ``CONSUMER`` span ``emqfast.run <queue>``, the child of the stamped context,
  with attributes ``emqfast.queue``, ``emqfast.job_id``, ``emqfast.attempt`` and
  ``emqfast.outcome`` (``completed`` or ``failed``; an exception is recorded on the
  span). A retry (attempt > 1) is the child of the same producer span and carries a
  link to it marked ``emqfast.retry``, so a trace shows every attempt of a job.

Zero cost when the extra is not installed: the import is tried once, here, and both
hooks then return what they were given. With the API but no SDK configured (its no-op
provider) a handler runs without a span; a provider configured later is picked up within
a second (or at once after :func:`refresh`).
"""
from __future__ import annotations

import functools
import inspect
import json
import time
from typing import Any, Callable, Dict, List, Optional

from emqfast.facade.options import DEFAULT_OPTIONS

_trace: Any  # the opentelemetry.trace module, or None without the extra
try:  # the one guarded import: without the extra every hook is the identity
    from opentelemetry import context as _context
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _trace = _otel_trace
except ImportError:  # pragma: no cover - exercised where the extra is not installed
    _trace = None

OPTION_KEY = "tp"  # the key of the traceparent in a job's options blob
_TRACER_NAME = "emqfast"

if _trace is not None:
    _propagator = TraceContextTextMapPropagator()
    # the API's own providers until an SDK is configured: every span would be a no-op
    _NO_SDK = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
# [monotonic s until which it holds, the provider, its emqfast tracer or None]: looking the
# provider up costs µs per job, so it is looked up at most once per _RECHECK_S
_tracer_of: List[Any] = [0.0, None, None]
_RECHECK_S = 1.0


def available() -> bool:
    """Whether ``opentelemetry-api`` is importable (the ``otel`` extra is installed)."""
    return _trace is not None


def current_traceparent() -> Optional[str]:
    """The W3C ``traceparent`` of the active span, or None (no extra, no valid span)."""
    if _trace is None or not _context.get_current():  # (no context attached: no span)
        return None
    if not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: Dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get("traceparent")


def stamp(opts: bytes) -> bytes:
    """``opts`` (an encoded options blob, ``b""`` for the defaults) with the producer's
    traceparent added when a span is active; unchanged otherwise."""
    if _trace is None:
        return opts
    parent = current_traceparent()
    if parent is None:
        return opts
    decoded = json.loads(opts) if opts else dict(DEFAULT_OPTIONS)
    decoded[OPTION_KEY] = parent
    return json.dumps(decoded, separators=(",", ":")).encode()


def traced(handler: Callable[..., Any], queue: str) -> Callable[..., Any]:
    """``handler`` wrapped to run in a span per job (async stays async); ``handler``
    itself when the extra is not installed."""
    if _trace is None:
        return handler
    if inspect.iscoroutinefunction(handler) or \
            inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
        @functools.wraps(handler)
        async def run_async(job: Any) -> Any:
            tracer = _tracer()
            if tracer is None:
                return await handler(job)
            with _job_span(tracer, queue, job) as span:
                return _ended(span, await handler(job))
        return run_async

    @functools.wraps(handler)
    def run(job: Any) -> Any:
        if _tracer_of[2] is None and time.monotonic() < _tracer_of[0]:
            return handler(job)  # no SDK, checked less than a second ago: _tracer()'s None
        tracer = _tracer()
        if tracer is None:
            return handler(job)
        with _job_span(tracer, queue, job) as span:
            return _ended(span, handler(job))
    return run


def _tracer() -> Any:
    """emqfast's tracer from the configured provider; None while no SDK is configured (the
    API alone records nothing: skipping the span saves ~20 µs per job). A provider set
    later is picked up within a second, or at once after :func:`refresh`."""
    now = time.monotonic()
    if now < _tracer_of[0]:
        return _tracer_of[2]
    provider = _trace.get_tracer_provider()
    if isinstance(provider, _NO_SDK):
        _tracer_of[:] = [now + _RECHECK_S, None, None]
    elif provider is not _tracer_of[1] or _tracer_of[2] is None:
        _tracer_of[:] = [now + _RECHECK_S, provider, provider.get_tracer(_TRACER_NAME)]
    else:
        _tracer_of[0] = now + _RECHECK_S
    return _tracer_of[2]


def refresh() -> None:
    """Look the tracer provider up again on the next job (after setting one)."""
    _tracer_of[0] = 0.0


def _ended(span: Any, result: Any) -> Any:
    """Mark a run that returned as completed; its result passes through."""
    span.set_attribute("emqfast.outcome", "completed")
    return result


class _job_span:  # noqa: N801 - used as a context manager, named like one
    """The span of one handler run; an exception marks it failed and propagates."""

    def __init__(self, tracer: Any, queue: str, job: Any):
        parent = _parent_context(job)
        links = []
        if parent is not None and job.attempts > 1:
            producer = _trace.get_current_span(parent).get_span_context()
            links.append(_trace.Link(producer, {"emqfast.retry": True}))
        self._span = tracer.start_span(
            f"emqfast.run {queue}", context=parent, kind=_trace.SpanKind.CONSUMER,
            links=links, attributes={"emqfast.queue": queue, "emqfast.job_id": job.id,
                                     "emqfast.attempt": job.attempts})
        self._use = _trace.use_span(self._span, end_on_exit=True,
                                    record_exception=True, set_status_on_exception=True)

    def __enter__(self) -> Any:
        return self._use.__enter__()

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> Any:
        if exc is not None:
            self._span.set_attribute("emqfast.outcome", "failed")
        return self._use.__exit__(kind, exc, tb)


def _parent_context(job: Any) -> Any:
    """The producer's context stamped in the job's options, or None (a root span)."""
    parent = job.extra.get(OPTION_KEY) if job.extra else None
    if not isinstance(parent, str):
        return None
    extracted = _propagator.extract({"traceparent": parent}, context=_context.Context())
    if not _trace.get_current_span(extracted).get_span_context().is_valid:
        return None
    return extracted
