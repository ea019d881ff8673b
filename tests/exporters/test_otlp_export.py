"""The real OTLP exporters, configured from the standard variables, against
in-process gRPC and HTTP receivers; and a collector that refuses connections."""

from __future__ import annotations

import io
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult

from events import MemoryLog
from exporters import (
    TRACING_LOGGER_NAME,
    LiveSpans,
    SpanExportError,
    Tracing,
    console_exporter,
    export_events,
    exporter_from_environment,
    otlp_exporter,
    spans_from_events,
)
from exporters._environment import DEFAULT_EXPORT_TIMEOUT_S, export_timeout_from_environment
from tests.exporters.event_streams import (
    LAUNCHER_SPAN_ID,
    MNNVL_CAUSE,
    RUN_ID,
    SPANS_PER_RANK,
    TRACE_ID,
    WORLD_SIZE,
    ZENTORCH_CAUSE,
    reference_logs,
    reference_rank,
    reference_stream,
    severity_with_warning_attempts,
)
from tests.exporters.otlp_receivers import GrpcReceiver, HttpReceiver, OtlpReceiver, ReceivedSpan

STATUS_UNSET, STATUS_ERROR = 0, 2
PROTOCOLS = ["grpc", "http/protobuf"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_* variable of the machine running the tests leaks in."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def receiver_for(protocol: str) -> OtlpReceiver:
    return GrpcReceiver() if protocol == "grpc" else HttpReceiver()


@pytest.fixture
def closed_port() -> int:
    """A local port nobody listens on: connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def check_reference_trace(spans: list[ReceivedSpan]) -> None:
    """The reference scenario arrived whole: one trace, every rank, ids and
    parents as recorded, status as specified, exception events, resources."""
    assert len(spans) == WORLD_SIZE * SPANS_PER_RANK
    assert {span.trace_id for span in spans} == {TRACE_ID}
    recorded = {
        event.span_id: event
        for event in reference_stream()
        if event.TYPE in ("step.started", "run.started")
    }
    assert {span.span_id for span in spans} == set(recorded)
    for span in spans:
        opened = recorded[span.span_id]
        assert span.parent_span_id == opened.parent_span_id
        assert span.span.start_time_unix_nano == opened.wall_ns
        assert span.scope_name == "startup-orchestrator"

    ranks = {span.resource["startup.rank"] for span in spans}
    assert ranks == set(range(WORLD_SIZE))
    for span in spans:
        rank = span.resource["startup.rank"]
        assert span.attributes["startup.rank"] == rank
        assert span.resource["service.name"] == "startup-orchestrator"
        assert span.resource["service.instance.id"] == f"{RUN_ID}/rank-{rank}"
        assert span.resource["host.name"] == f"node-{rank // 4}"
        assert span.resource["process.pid"] == 4000 + rank
        assert span.resource["startup.world_size"] == WORLD_SIZE

    roots = [span for span in spans if span.name.startswith("startup rank ")]
    assert len(roots) == WORLD_SIZE
    assert {root.parent_span_id for root in roots} == {LAUNCHER_SPAN_ID}

    for span in spans:
        # The recovered fallback (WARNING) is marked by its severity and its
        # exception event, not by a red status: no span here is ERROR.
        assert span.status_code == STATUS_UNSET, span.name
        if span.name == "allreduce/workspace/mnnvl":
            assert span.attributes["startup.severity"] == "WARNING"
            assert [
                (name, attributes["exception.type"], attributes["exception.message"])
                for name, _, attributes in span.events
            ] == [("exception", "OSError", MNNVL_CAUSE.message)]
        if span.name == "platform/cpu/zentorch":
            assert [
                (attributes["exception.type"], attributes["exception.message"])
                for _, _, attributes in span.events
            ] == [(member.type, member.message) for member in ZENTORCH_CAUSE.chain()]
            assert span.attributes["startup.outcome"] == "unavailable"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_live_ranks_arrive_as_one_trace(monkeypatch: pytest.MonkeyPatch, protocol: str) -> None:
    with receiver_for(protocol) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=startup-tests")
        # One LiveSpans per rank, as each rank process has its own.
        ranks = []
        for events in reference_logs():
            exporter = exporter_from_environment()
            assert exporter is not None
            live = LiveSpans(exporter, severity_of=severity_with_warning_attempts)
            for event in events:
                live(event)
            ranks.append(live)
        for live in ranks:
            live.shutdown(timeout_s=10.0)

        spans = receiver.wait_for_spans(WORLD_SIZE * SPANS_PER_RANK)
        check_reference_trace(spans)
        assert all(headers.get("x-tenant") == "startup-tests" for headers in receiver.headers)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_replay_export_uses_the_traces_specific_variables(
    monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    with receiver_for(protocol) as receiver:
        endpoint = receiver.endpoint
        if isinstance(receiver, HttpReceiver):
            endpoint = receiver.traces_url  # the traces variable is used as is
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # overridden
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "definitely-not-used")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=traces")
        exporter = exporter_from_environment()
        assert exporter is not None

        count = export_events(
            reference_stream(), exporter, severity_of=severity_with_warning_attempts, batch_size=10
        )
        exporter.shutdown()

        assert count == WORLD_SIZE * SPANS_PER_RANK
        check_reference_trace(receiver.wait_for_spans(count))
        assert len(receiver.requests) == -(-count // 10)
        assert {headers.get("x-tenant") for headers in receiver.headers} == {"traces"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_refusing_collector_never_holds_up_the_run_and_replay_delivers_later(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    closed_port: int,
    protocol: str,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{closed_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.5")
    exporter = exporter_from_environment()
    assert exporter is not None
    live = LiveSpans(exporter, severity_of=severity_with_warning_attempts, max_export_batch_size=8)
    stream = reference_stream()

    feeding = threading.Thread(target=lambda: [live(event) for event in stream])
    feeding.start()
    feeding.join(10.0)
    assert not feeding.is_alive(), "feeding events waited for the collector"

    assert live.force_flush(timeout_s=5.0) is False
    begun = time.monotonic()
    live.shutdown(timeout_s=1.0)
    assert time.monotonic() - begun < 5.0
    assert live.export_failures >= 1

    warnings = [
        record
        for record in caplog.records
        if record.levelno >= logging.WARNING and record.name.startswith(("opentelemetry", "exp"))
    ]
    assert [record.name for record in warnings] == [TRACING_LOGGER_NAME]
    assert "replay export" in warnings[0].getMessage()

    with receiver_for(protocol) as receiver:
        endpoint = receiver.endpoint
        if isinstance(receiver, HttpReceiver):
            endpoint = receiver.traces_url
        later = otlp_exporter(protocol, endpoint=endpoint, timeout_s=5.0)
        count = export_events(stream, later, severity_of=severity_with_warning_attempts)
        later.shutdown()
        check_reference_trace(receiver.wait_for_spans(count))


def test_replay_export_reports_a_refusing_collector(closed_port: int) -> None:
    exporter = otlp_exporter(
        "http/protobuf", endpoint=f"http://127.0.0.1:{closed_port}/v1/traces", timeout_s=0.5
    )
    with pytest.raises(SpanExportError, match=r"0 of 56 delivered") as raised:
        export_events(reference_stream(), exporter)
    exporter.shutdown()
    assert raised.value.exported == 0
    assert raised.value.total == WORLD_SIZE * SPANS_PER_RANK


def test_replay_export_batch_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        export_events([], console_exporter(io.StringIO()), batch_size=0)


# Choosing the exporter from the environment ---------------------------------------------


def test_tracing_is_off_unless_asked_for() -> None:
    assert exporter_from_environment({}) is None
    assert exporter_from_environment() is None  # the (cleaned) process environment


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_sdk_disabled_turns_tracing_off(value: str) -> None:
    env = {"OTEL_SDK_DISABLED": value, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    assert exporter_from_environment(env) is None


def test_traces_exporter_none_console_and_fan_out(capsys: pytest.CaptureFixture[str]) -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}
    assert exporter_from_environment({"OTEL_TRACES_EXPORTER": "none", **endpoint}) is None
    assert isinstance(
        exporter_from_environment({"OTEL_TRACES_EXPORTER": "console"}), ConsoleSpanExporter
    )

    both = exporter_from_environment({"OTEL_TRACES_EXPORTER": "console, otlp", **endpoint})
    members = getattr(both, "members", ())
    assert [type(member).__name__ for member in members] == [
        "ConsoleSpanExporter",
        "OTLPSpanExporter",
    ]
    assert both is not None
    both.shutdown()


def test_console_exporter_writes_every_span_to_the_stream() -> None:
    stream = io.StringIO()
    count = export_events(reference_stream(), console_exporter(stream))
    text = stream.getvalue()
    assert text.count('"name": "platform/cpu/zentorch"') == WORLD_SIZE
    assert count == WORLD_SIZE * SPANS_PER_RANK == text.count('"trace_id"')


@pytest.mark.parametrize(
    ("variables", "named", "fallback"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL", "http"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "grpc",
        ),
    ],
)
def test_unknown_protocol_warns_once_and_falls_back(
    variables: dict[str, str], named: str, fallback: str, caplog: pytest.LogCaptureFixture
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", **variables}
    bad = variables.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or variables[named]
    with caplog.at_level(logging.WARNING, logger=TRACING_LOGGER_NAME):
        exporter = exporter_from_environment(env)
    assert exporter is not None
    assert f".{fallback}." in type(exporter).__module__
    [record] = [r for r in caplog.records if r.name == TRACING_LOGGER_NAME]
    assert f"{named}='{bad}' not supported (valid: grpc, http/protobuf)" in record.getMessage()
    exporter.shutdown()


def test_unknown_protocol_option_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown OTLP protocol 'zipkin'.*grpc, http/protobuf"):
        otlp_exporter("zipkin")


def test_unknown_exporter_name_warns_once_and_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=TRACING_LOGGER_NAME):
        assert exporter_from_environment({"OTEL_TRACES_EXPORTER": "jaeger"}) is None
    [record] = [r for r in caplog.records if r.name == TRACING_LOGGER_NAME]
    assert "OTEL_TRACES_EXPORTER: 'jaeger' not supported (valid: otlp" in record.getMessage()
    assert record.getMessage().endswith("tracing is off")


# A rank's tracing: what asks for spans, and where the launch's span goes ---------------


@pytest.mark.parametrize(
    ("environ", "options", "wanted"),
    [
        ({}, {}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, {}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, {}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, {}, True),
        ({}, {"otlp_endpoint": "http://127.0.0.1:4317"}, True),
        ({}, {"trace_file": "trace.json"}, True),
        ({"OTEL_SDK_DISABLED": "TRUE"}, {"trace_file": "trace.json"}, False),
        ({"OTEL_SDK_DISABLED": " true "}, {"otlp_endpoint": "http://127.0.0.1:4317"}, False),
    ],
)
def test_tracing_is_wanted_when_an_option_or_a_variable_asks(
    environ: dict[str, str], options: dict[str, Any], wanted: bool
) -> None:
    assert Tracing(environ=environ, **options).wanted is wanted


@pytest.mark.parametrize(
    ("suffix", "environ", "delivered"),
    [
        ("", {}, True),
        ("/", {}, True),  # a collector's address: the traces path is added
        ("", {"TRACEPARENT": f"00-{TRACE_ID}-{LAUNCHER_SPAN_ID}-00"}, False),
        # Another trace's TRACEPARENT says nothing of whether this one is sampled.
        ("", {"TRACEPARENT": f"00-{'1' * 32}-{LAUNCHER_SPAN_ID}-00"}, True),
        ("", {"OTEL_SDK_DISABLED": "true"}, False),
    ],
    ids=["address", "address-slash", "not-sampled", "other-trace", "disabled"],
)
def test_send_delivers_spans_to_the_collector_unless_the_trace_is_not_wanted(
    suffix: str, environ: dict[str, str], delivered: bool
) -> None:
    spans = spans_from_events(reference_rank(0).events)
    with HttpReceiver() as receiver:
        tracing = Tracing(
            otlp_endpoint=receiver.endpoint + suffix, otlp_protocol="http/protobuf", environ=environ
        )
        assert tracing.send(spans) is True
        received = receiver.spans()
    assert [span.span_id for span in received] == (
        [f"{span.context.span_id:016x}" for span in spans] if delivered else []
    )


@pytest.mark.parametrize(
    ("rank", "level"), [(0, logging.WARNING), (4, logging.WARNING), (5, logging.DEBUG)]
)
def test_a_bad_setting_is_a_warning_on_each_nodes_local_rank_0_only(
    rank: int, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=TRACING_LOGGER_NAME)
    log = MemoryLog(RUN_ID, rank)
    log.append(reference_rank(rank).events[0])  # four ranks a node: 4 is node 1's local rank 0
    tracing = Tracing(environ={"OTEL_TRACES_EXPORTER": "none", "OTEL_TRACES_SAMPLER": "sometimes"})
    tracing.attach(log)
    tracing.close()

    assert [
        (r.levelno, r.getMessage()) for r in caplog.records if r.name == TRACING_LOGGER_NAME
    ] == [
        (
            level,
            "tracing: OTEL_TRACES_SAMPLER='sometimes' not supported (valid: always_on, "
            "always_off, traceidratio, parentbased_always_on, parentbased_always_off, "
            "parentbased_traceidratio); using parentbased_always_on",
        )
    ]


def test_timeout_that_is_not_a_number_warns_once_and_takes_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "soon", "OTEL_EXPORTER_OTLP_TIMEOUT": "30"}
    with caplog.at_level(logging.WARNING, logger=TRACING_LOGGER_NAME):
        assert export_timeout_from_environment(env) == DEFAULT_EXPORT_TIMEOUT_S
    [record] = [r for r in caplog.records if r.name == TRACING_LOGGER_NAME]
    assert "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT='soon'" in record.getMessage()


def test_export_timeout_is_the_variable_else_the_specifications_ten_seconds() -> None:
    assert DEFAULT_EXPORT_TIMEOUT_S == 10.0
    assert export_timeout_from_environment({}) == 10.0
    assert export_timeout_from_environment({"OTEL_EXPORTER_OTLP_TIMEOUT": "30"}) == 30.0
    both = {"OTEL_EXPORTER_OTLP_TIMEOUT": "30", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2.5"}
    assert export_timeout_from_environment(both) == 2.5


def test_importing_the_package_leaves_grpc_and_the_otlp_exporters_unloaded() -> None:
    code = (
        "import sys, exporters\n"
        "heavy = [m for m in ('grpc', 'opentelemetry.exporter.otlp.proto.grpc',"
        " 'opentelemetry.exporter.otlp.proto.http', 'requests') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


def _announcing_exporter(*said: str) -> Any:
    """An exporter whose export says ``said`` on an OpenTelemetry logger, as
    the OTLP exporters announce a retry, then records that it went on to
    wait and retry."""

    def export(self: Any, spans: Sequence[Any]) -> SpanExportResult:
        logger = logging.getLogger("opentelemetry.fake_exporter")
        for message in said:
            logger.warning(message)
        self.retried = True
        return SpanExportResult.SUCCESS

    namespace = {"__module__": "opentelemetry.fake_exporter", "export": export, "retried": False}
    return type("AnnouncingExporter", (SpanExporter,), namespace)()


def test_a_refused_collector_ends_a_replay_export_at_its_first_retry() -> None:
    from events.testing import EventStream

    events = EventStream().run_started().started("probe").succeeded("probe").run_finished()
    refused = _announcing_exporter(
        "Failed to connect to remote host: Connection refused",
        "Transient error StatusCode.UNAVAILABLE encountered while exporting traces, "
        "retrying in 1s.",
    )
    with pytest.raises(SpanExportError, match="0 of 2 delivered"):
        export_events(events, refused)
    assert refused.retried is False  # it never got to wait for the retry
    # A slow collector's retries are its exporter's to make, within its timeout.
    slow = _announcing_exporter(
        "Transient error StatusCode.DEADLINE_EXCEEDED encountered while exporting traces, "
        "retrying in 1s."
    )
    assert export_events(events, slow) == 2
    assert slow.retried is True
    timed_out = _announcing_exporter(
        "Transient error Read timed out. encountered while exporting span batch, retrying in 1s."
    )
    assert export_events(events, timed_out) == 2
    assert timed_out.retried is True
