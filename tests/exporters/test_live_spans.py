"""Live export: spans built while events are appended equal the replayed ones,
and tracing never blocks or fails the run."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from events import Event, MemoryLog, RunStarted, Severity, merge
from exporters import (
    TRACING_LOGGER_NAME,
    LiveSpans,
    context_with_span,
    rank_resource,
    spans_from_events,
)
from tests.exporters.event_streams import (
    RUN_ID,
    SPANS_PER_RANK,
    WORLD_SIZE,
    reference_logs,
    reference_rank,
    severity_with_warning_attempts,
)


def span_fields(span: ReadableSpan) -> tuple[Any, ...]:
    """Everything a span carries, as plain comparable values."""
    parent = span.parent
    scope = span.instrumentation_scope
    return (
        span.name,
        span.context.trace_id,
        span.context.span_id,
        span.context.is_remote,
        int(span.context.trace_flags),
        None if parent is None else (parent.trace_id, parent.span_id, parent.is_remote),
        span.kind,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        [(event.name, event.timestamp, dict(event.attributes or {})) for event in span.events],
        list(span.links),
        span.status.status_code,
        span.status.description,
        dict(span.resource.attributes),
        span.resource.schema_url,
        None if scope is None else (scope.name, scope.version, scope.schema_url),
    )


def by_span_id(spans: Sequence[ReadableSpan]) -> dict[int, tuple[Any, ...]]:
    return {span.context.span_id: span_fields(span) for span in spans}


def logged(caplog: pytest.LogCaptureFixture, name: str = TRACING_LOGGER_NAME) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == name and record.levelno >= logging.WARNING
    ]


def test_live_spans_equal_replayed_spans_field_by_field() -> None:
    captured = InMemorySpanExporter()
    live = LiveSpans(captured, severity_of=severity_with_warning_attempts)
    logs = [MemoryLog(RUN_ID, rank) for rank in range(WORLD_SIZE)]
    for log in logs:
        log.subscribe(live)
    # Ranks append concurrently in real life; interleave them here.
    for event in merge(reference_logs()):
        logs[event.rank].append(event)
    assert live.force_flush(timeout_s=10.0)
    live_spans = captured.get_finished_spans()
    live.shutdown()

    replayed = spans_from_events(
        merge([log.events for log in logs]), severity_of=severity_with_warning_attempts
    )

    assert len(live_spans) == len(replayed) == WORLD_SIZE * SPANS_PER_RANK
    assert by_span_id(live_spans) == by_span_id(replayed)


def test_each_span_is_exported_when_its_step_ends() -> None:
    captured = InMemorySpanExporter()
    live = LiveSpans(captured)
    events = reference_rank(0).events
    zentorch_end = next(
        index
        for index, event in enumerate(events)
        if event.TYPE == "step.unavailable" and event.step == "platform/cpu/zentorch"
    )
    for event in events[: zentorch_end + 1]:
        live(event)
    assert live.force_flush()
    assert [span.name for span in captured.get_finished_spans()] == ["platform/cpu/zentorch"]

    for event in events[zentorch_end + 1 :]:
        live(event)
    assert live.force_flush()
    assert len(captured.get_finished_spans()) == SPANS_PER_RANK
    live.shutdown()


class BlockingExporter(SpanExporter):
    """An exporter stuck on a collector that does not answer until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.exported: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait()
        self.exported.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_stuck_exporter_never_blocks_the_subscriber() -> None:
    exporter = BlockingExporter()
    live = LiveSpans(exporter, max_export_batch_size=1)
    log = MemoryLog(RUN_ID, 0)
    log.subscribe(live)
    events = reference_rank(0).events
    zentorch_end = next(i for i, e in enumerate(events) if e.TYPE == "step.unavailable")
    for event in events[: zentorch_end + 1]:
        log.append(event)
    # A full batch wakes the export thread, which now hangs in export().
    assert exporter.entered.wait(10.0)

    rest = threading.Thread(target=lambda: [log.append(e) for e in events[zentorch_end + 1 :]])
    rest.start()
    rest.join(10.0)
    assert not rest.is_alive(), "appending events waited for the exporter"
    assert log.next_seq == len(events)

    exporter.release.set()
    assert live.force_flush(timeout_s=10.0)
    assert len(exporter.exported) == SPANS_PER_RANK
    live.shutdown()


def test_flush_and_shutdown_are_bounded_by_their_timeout() -> None:
    exporter = BlockingExporter()
    live = LiveSpans(exporter)
    for event in reference_rank(0).events:
        live(event)

    assert live.force_flush(timeout_s=0.05) is False  # export hangs; flush gives up
    assert exporter.entered.is_set()
    live.shutdown(timeout_s=0.05)  # returns although the export never finished
    assert exporter.release.is_set()  # the exporter was told to shut down


class FailingExporter(SpanExporter):
    def __init__(self, *, raises: bool) -> None:
        self.raises = raises
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.raises:
            raise ConnectionRefusedError(111, "Connection refused")
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


@pytest.mark.parametrize("raises", [False, True])
def test_export_failures_are_logged_once(caplog: pytest.LogCaptureFixture, raises: bool) -> None:
    exporter = FailingExporter(raises=raises)
    live = LiveSpans(exporter)
    for rank in range(3):
        for event in reference_rank(rank).events:
            live(event)
        assert live.force_flush() is False

    assert exporter.calls == 3
    assert live.export_failures == 3
    (message,) = logged(caplog)
    assert "FailingExporter" in message
    assert "replay export" in message
    if raises:
        assert "ConnectionRefusedError" in message
    live.shutdown()
    assert logged(caplog) == [message]


def saying_exporter(*said: str, endpoint: str | None = None) -> SpanExporter:
    """An exporter that fails after saying ``said`` on an OpenTelemetry
    logger, as the OTLP exporters do; ``endpoint`` where it sends."""

    def export(self: SpanExporter, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        logger = logging.getLogger("opentelemetry.fake_exporter")
        for message in said:
            logger.warning(message)
        return SpanExportResult.FAILURE

    namespace: dict[str, Any] = {
        "__module__": "opentelemetry.fake_exporter",
        "export": export,
        "shutdown": lambda self: None,
        "_endpoint": endpoint,
    }
    return type("SayingExporter", (SpanExporter,), namespace)()  # type: ignore[no-any-return]


REFUSED = "Failed to connect to remote host: Connection refused"


@pytest.mark.parametrize(
    ("said", "endpoint", "peer", "level", "detail"),
    [
        ((REFUSED,), None, True, logging.DEBUG, "with SayingExporter (connection refused)"),
        ((REFUSED,), None, False, logging.WARNING, "with SayingExporter (connection refused)"),
        # Only a collector nobody reaches is left to the rank that reports it.
        (
            ("SSL: certificate verify failed",),
            None,
            True,
            logging.WARNING,
            "with SayingExporter (TLS error)",
        ),
        (
            ("first complaint.", "second complaint.", "final verdict."),
            None,
            False,
            logging.WARNING,
            "with SayingExporter (first complaint; then: final verdict)",
        ),
        (("x" * 200,), None, False, logging.WARNING, f"with SayingExporter ({'x' * 157}...)"),
        (
            (REFUSED,),
            "https://user:s3cr3t@collector.example:4318/v1/traces",
            False,
            logging.WARNING,
            "to https://[REDACTED]@collector.example:4318/v1/traces (connection refused)",
        ),
        (
            (REFUSED,),
            "user:s3cr3t@collector.example:4317",
            False,
            logging.WARNING,
            "to [REDACTED]@collector.example:4317 (connection refused)",
        ),
    ],
    ids=["refused-peer", "refused", "tls-peer", "first-and-last", "long", "https", "grpc"],
)
def test_a_failed_export_is_one_line_saying_where_and_why(
    caplog: pytest.LogCaptureFixture,
    said: tuple[str, ...],
    endpoint: str | None,
    peer: bool,
    level: int,
    detail: str,
) -> None:
    caplog.set_level(logging.DEBUG, logger=TRACING_LOGGER_NAME)
    live = LiveSpans(saying_exporter(*said, endpoint=endpoint))
    live.peer_reports_unreachable = peer
    for event in reference_rank(0).events:
        live(event)
    assert live.force_flush() is False
    live.shutdown()

    records = [r for r in caplog.records if r.name == TRACING_LOGGER_NAME]
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (
            level,
            f"could not export {SPANS_PER_RANK} span(s) {detail}; the run goes on, "
            "and its event log keeps every span for replay export",
        )
    ]
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry.")]


def test_a_broken_severity_hook_never_fails_the_append(caplog: pytest.LogCaptureFixture) -> None:
    def hook(rank: int, step: str, event: Event) -> Severity | None:
        if step.startswith("platform"):
            raise RuntimeError("policy bug")
        return None

    captured = InMemorySpanExporter()
    live = LiveSpans(captured, severity_of=hook)
    log = MemoryLog(RUN_ID, 0)
    log.subscribe(live)
    for event in reference_rank(0).events:
        log.append(event)  # must not raise
    assert live.force_flush()

    names = {span.name for span in captured.get_finished_spans()}
    assert "allreduce/workspace/trtllm" in names
    assert "platform" not in names
    (message,) = logged(caplog)
    assert "step.unavailable" in message
    live.shutdown()


def test_after_shutdown_events_are_ignored_and_flush_reports_false() -> None:
    captured = InMemorySpanExporter()
    live = LiveSpans(captured)
    live.shutdown()
    live.shutdown()  # twice is harmless

    for event in reference_rank(0).events:
        live(event)
    assert live.force_flush() is False
    assert captured.get_finished_spans() == ()


def test_spans_made_by_probe_code_nest_under_the_current_step() -> None:
    captured = InMemorySpanExporter()
    live = LiveSpans(captured)
    events = reference_rank(0).events
    started = events[0]
    assert isinstance(started, RunStarted)
    provider = TracerProvider(resource=rank_resource(started), shutdown_on_exit=False)
    provider.add_span_processor(live.span_processor)
    zentorch = next(e for e in events if e.step == "platform/cpu/zentorch")

    token = otel_context.attach(context_with_span(zentorch.trace_id, zentorch.span_id))
    try:
        with provider.get_tracer("probe").start_as_current_span("dlopen libzentorch.so"):
            pass
    finally:
        otel_context.detach(token)
    assert live.force_flush()

    (user_span,) = captured.get_finished_spans()
    assert user_span.parent is not None
    assert f"{user_span.context.trace_id:032x}" == zentorch.trace_id
    assert f"{user_span.parent.span_id:016x}" == zentorch.span_id
    assert user_span.resource.attributes["service.instance.id"] == f"{RUN_ID}/rank-0"
    live.shutdown()
