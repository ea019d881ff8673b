"""Trace context reaches the code a step runs: spans a user's probe creates
with the OpenTelemetry API, in a worker thread, in a child step or in an
isolated child process, nest under the step's span in the run's trace, and
under the launcher's span (the command line checks the launcher's
TRACEPARENT at the door: ``tests/orchestrator/cli/test_bad_input.py``)."""

from __future__ import annotations

import os

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import orchestrator
from events import MemoryLog, StepStarted
from exporters import format_traceparent
from orchestrator import Graph, Isolation, Step
from tests.exporters.otlp_receivers import HttpReceiver

from . import probe_bodies
from .tracing_harness import DEADLINE_S, activate_span

pytestmark = pytest.mark.anyio


def step_span_ids(log: MemoryLog) -> dict[str, str]:
    return {event.step: event.span_id for event in log.read() if isinstance(event, StepStarted)}


@pytest.mark.slow
async def test_user_spans_nest_under_the_step_that_runs_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    captured = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    graph = Graph(
        "user-spans",
        [
            Step(name="threaded", body=probe_bodies.span_in_worker_thread),
            Step(name="nested", body=probe_bodies.span_in_child_step),
            Step(
                name="isolated",
                body=probe_bodies.span_in_child_process,
                isolation=Isolation.PROCESS,
            ),
        ],
    )
    log = MemoryLog("user-spans", 0)
    with HttpReceiver() as receiver:
        # The isolated child inherits this environment.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_url)
        with anyio.fail_after(DEADLINE_S):
            result = await orchestrator.run(
                graph,
                log,
                span_activator=activate_span,
                services={"tracer_provider": provider},
            )
        from_child = {span.name: span for span in receiver.wait_for_spans(2)}

    trace_id = result.trace_id
    steps = step_span_ids(log)
    in_process = {span.name: span for span in captured.get_finished_spans()}
    for step in ("threaded", "nested/probe"):
        span = in_process[f"user span in {step}"]
        assert span.parent is not None, step
        assert format(span.context.trace_id, "032x") == trace_id
        assert format(span.parent.span_id, "016x") == steps[step]
    assert result["threaded"].value == {"main_thread": False}

    assert sorted(from_child) == ["user span in the current context", "user span under TRACEPARENT"]
    for received in from_child.values():
        assert received.trace_id == trace_id
        assert received.parent_span_id == steps["isolated"]
        assert received.resource["service.name"] == "user-child"
    child = result["isolated"].value
    assert isinstance(child, dict)
    assert child["pid"] != os.getpid()
    assert child["traceparent"] == format_traceparent(trace_id, steps["isolated"])


async def test_the_launchers_span_is_the_parent_of_the_rank_root() -> None:
    log = MemoryLog("under-a-launcher", 0)
    trace_id, launcher_span = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    captured = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(captured))
    graph = Graph("g", [Step(name="threaded", body=probe_bodies.span_in_worker_thread)])
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            graph,
            log,
            trace_id=trace_id,
            parent_span_id=launcher_span,
            span_activator=activate_span,
            services={"tracer_provider": provider},
        )

    assert result.trace_id == trace_id
    events = list(log.read())
    assert {event.trace_id for event in events} == {trace_id}
    assert events[0].parent_span_id == launcher_span
    [span] = captured.get_finished_spans()
    assert format(span.context.trace_id, "032x") == trace_id
