"""W3C traceparent and the OpenTelemetry context of a recorded span."""

from __future__ import annotations

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporters import TraceParent, context_with_span, format_traceparent, parse_traceparent

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN_ID = "00f067aa0ba902b7"
HEADER = f"00-{TRACE_ID}-{SPAN_ID}-01"


def test_format_gives_the_version_00_form() -> None:
    assert format_traceparent(TRACE_ID, SPAN_ID) == HEADER
    assert format_traceparent(TRACE_ID, SPAN_ID, sampled=False) == f"00-{TRACE_ID}-{SPAN_ID}-00"
    assert str(TraceParent(TRACE_ID, SPAN_ID)) == HEADER


def test_parse_round_trips() -> None:
    parent = parse_traceparent(HEADER)
    assert parent == TraceParent(trace_id=TRACE_ID, span_id=SPAN_ID, sampled=True)
    assert str(parent) == HEADER
    assert parse_traceparent(f"  {HEADER}\t") == parent
    assert parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-00").sampled is False
    assert parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-03").sampled is True
    # Only the lowest bit says "sampled"; the others are for other flags.
    assert parse_traceparent(f"00-{TRACE_ID}-{SPAN_ID}-02").sampled is False


def test_a_later_version_may_carry_more_fields() -> None:
    parent = parse_traceparent(f"cc-{TRACE_ID}-{SPAN_ID}-01-what-the-future-holds")
    assert parent == TraceParent(TRACE_ID, SPAN_ID, True)
    assert parse_traceparent(f"01-{TRACE_ID}-{SPAN_ID}-01") == parent


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "too short"),
        ("00-4bf92f35-00f067aa0ba902b7-01", "too short"),
        (HEADER.upper(), "trace id must be 32 lower-case hex"),
        (f"00-{TRACE_ID.upper()}-{SPAN_ID}-01", "trace id must be 32 lower-case hex"),
        (f"00-{TRACE_ID}-{SPAN_ID.upper()}-01", "span id must be 16 lower-case hex"),
        (f"ff-{TRACE_ID}-{SPAN_ID}-01", "version ff is forbidden"),
        (f"0g-{TRACE_ID}-{SPAN_ID}-01", "version must be 2 lower-case hex"),
        (f"00-{'0' * 32}-{SPAN_ID}-01", "trace id must not be all zeros"),
        (f"00-{TRACE_ID}-{'0' * 16}-01", "span id must not be all zeros"),
        (f"00-{TRACE_ID}-{SPAN_ID}-0x", "flags must be 2 lower-case hex"),
        (f"00_{TRACE_ID}_{SPAN_ID}_01", "separated by '-'"),
        (f"00-{TRACE_ID}-{SPAN_ID}-01-extra", "version 00 must be exactly 55"),
        (f"01-{TRACE_ID}-{SPAN_ID}-01x", "separated by '-'"),
        (f"00-{TRACE_ID}0-{SPAN_ID[:-1]}-01", "separated by '-'"),
    ],
)
def test_invalid_values_are_rejected_with_the_reason(value: str, why: str) -> None:
    with pytest.raises(ValueError, match="invalid traceparent") as raised:
        parse_traceparent(value)
    message = str(raised.value)
    assert why in message
    assert repr(value) in message
    assert "expected 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>" in message


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [
        (TRACE_ID[:-1], SPAN_ID),
        (TRACE_ID, SPAN_ID + "0"),
        ("0" * 32, SPAN_ID),
        (TRACE_ID, "0" * 16),
        (TRACE_ID.upper(), SPAN_ID),
    ],
)
def test_malformed_ids_are_rejected(trace_id: str, span_id: str) -> None:
    with pytest.raises(ValueError, match="must"):
        format_traceparent(trace_id, span_id)
    with pytest.raises(ValueError, match="must"):
        context_with_span(trace_id, span_id)


def test_context_makes_the_recorded_span_current() -> None:
    ctx = context_with_span(TRACE_ID, SPAN_ID)
    span_context = trace.get_current_span(ctx).get_span_context()

    assert f"{span_context.trace_id:032x}" == TRACE_ID
    assert f"{span_context.span_id:016x}" == SPAN_ID
    assert span_context.is_remote is False
    assert span_context.trace_flags.sampled
    assert not trace.get_current_span(ctx).is_recording()


def test_spans_started_in_that_context_are_its_children() -> None:
    captured = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(captured))
    token = otel_context.attach(context_with_span(TRACE_ID, SPAN_ID))
    try:
        with provider.get_tracer("probe").start_as_current_span("user work") as span:
            child_traceparent = format_traceparent(
                f"{span.get_span_context().trace_id:032x}",
                f"{span.get_span_context().span_id:016x}",
            )
    finally:
        otel_context.detach(token)
    provider.shutdown()

    (finished,) = captured.get_finished_spans()
    assert finished.parent is not None
    assert f"{finished.parent.span_id:016x}" == SPAN_ID
    assert parse_traceparent(child_traceparent).trace_id == TRACE_ID
