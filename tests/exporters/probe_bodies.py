"""Step bodies that create spans of their own with the OpenTelemetry API, as
a user's probe code would. Isolated bodies run in a fresh process that
imports them by name, so they live at module level in an importable module."""

from __future__ import annotations

import os
import threading

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from events import JsonValue
from orchestrator import StepContext

#: The instrumentation scope of the user's spans.
USER_SCOPE = "user-probe"


def span_in_worker_thread(ctx: StepContext) -> JsonValue:
    """A blocking body (run in a worker thread) that opens a span on the
    tracer provider the test handed over."""
    tracer = trace.get_tracer(USER_SCOPE, tracer_provider=ctx.services["tracer_provider"])
    with tracer.start_as_current_span(f"user span in {ctx.step}"):
        pass
    return {"main_thread": threading.current_thread() is threading.main_thread()}


async def span_in_child_step(ctx: StepContext) -> JsonValue:
    """An async body whose child step opens the span."""
    child = await ctx.run_child("probe", span_in_worker_thread)
    return child.value


def span_in_child_process(ctx: StepContext) -> JsonValue:
    """An isolated body: a real SDK tracer provider in the child exporting
    over OTLP/HTTP to the address in ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``.
    One span nests by the current context, one by reading ``TRACEPARENT``
    explicitly."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider(resource=Resource({"service.name": "user-child"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    tracer = trace.get_tracer(USER_SCOPE, tracer_provider=provider)
    with tracer.start_as_current_span("user span in the current context"):
        pass
    traceparent = os.environ["TRACEPARENT"]
    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    with tracer.start_as_current_span("user span under TRACEPARENT", context=parent):
        pass
    provider.shutdown()
    return {"pid": os.getpid(), "traceparent": traceparent}
