"""The Jaeger-UI JSON file: valid against Jaeger's JSON model, and every span
round-trips."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import Link, SpanContext, Status, StatusCode, TraceFlags

from exporters import JaegerJsonExporter, export_events, jaeger_document, spans_from_events
from tests.exporters.event_streams import (
    SPANS_PER_RANK,
    TRACE_ID,
    WORLD_SIZE,
    reference_rank,
    reference_stream,
    severity_with_warning_attempts,
)

# Jaeger's JSON model (jaegertracing/jaeger, model/json/model.go): the keys
# each object may carry, the ones it must carry, and their JSON types.
VALUE_TYPES = {"string": str, "bool": bool, "int64": int, "float64": float, "binary": str}
REFERENCE_TYPES = {"CHILD_OF", "FOLLOWS_FROM"}
TRACE_KEYS = {"traceID": str, "spans": list, "processes": dict, "warnings": (list, type(None))}
TRACE_REQUIRED = {"traceID", "spans", "processes"}
SPAN_KEYS = {
    "traceID": str,
    "spanID": str,
    "flags": int,
    "operationName": str,
    "references": list,
    "startTime": int,
    "duration": int,
    "tags": list,
    "logs": list,
    "processID": str,
    "warnings": (list, type(None)),
}
SPAN_REQUIRED = {"traceID", "spanID", "operationName", "startTime", "duration", "processID"}
TRACE_ID_FORM = re.compile(r"[0-9a-f]{32}")
SPAN_ID_FORM = re.compile(r"[0-9a-f]{16}")


def check_object(value: Any, keys: dict[str, Any], required: set[str], where: str) -> None:
    assert isinstance(value, dict), f"{where}: not an object"
    assert required <= set(value), f"{where}: missing {sorted(required - set(value))}"
    assert set(value) <= set(keys), f"{where}: unknown keys {sorted(set(value) - set(keys))}"
    for key, expected in keys.items():
        if key in value:
            assert isinstance(value[key], expected), f"{where}.{key}: {value[key]!r}"
            if expected is int:
                assert not isinstance(value[key], bool), f"{where}.{key} is a bool"


def check_key_value(value: Any, where: str) -> None:
    check_object(value, {"key": str, "type": str, "value": object}, {"key", "value"}, where)
    kind = value.get("type", "string")
    assert kind in VALUE_TYPES, f"{where}: unknown type {kind!r}"
    expected = VALUE_TYPES[kind]
    assert isinstance(value["value"], expected), f"{where}: {value!r} is not {kind}"
    if kind == "int64":
        assert not isinstance(value["value"], bool)
        assert -(2**63) <= value["value"] < 2**63
    if kind == "float64":
        assert math.isfinite(value["value"])


def validate_jaeger(document: Any) -> None:
    """Check a document against Jaeger's UI JSON model."""
    check_object(document, {"data": list}, {"data"}, "document")
    for t, trace in enumerate(document["data"]):
        where = f"data[{t}]"
        check_object(trace, TRACE_KEYS, TRACE_REQUIRED, where)
        assert TRACE_ID_FORM.fullmatch(trace["traceID"]), f"{where}.traceID"
        for process_id, process in trace["processes"].items():
            check_object(
                process,
                {"serviceName": str, "tags": list},
                {"serviceName"},
                f"{where}.processes[{process_id}]",
            )
            for k, tag in enumerate(process.get("tags", [])):
                check_key_value(tag, f"{where}.processes[{process_id}].tags[{k}]")
        for s, span in enumerate(trace["spans"]):
            span_where = f"{where}.spans[{s}]"
            check_object(span, SPAN_KEYS, SPAN_REQUIRED, span_where)
            assert span["traceID"] == trace["traceID"], f"{span_where}: foreign trace"
            assert SPAN_ID_FORM.fullmatch(span["spanID"]), f"{span_where}.spanID"
            assert span["startTime"] >= 0
            assert span["duration"] >= 0
            assert span["processID"] in trace["processes"], f"{span_where}.processID"
            for r, reference in enumerate(span.get("references", [])):
                check_object(
                    reference,
                    {"refType": str, "traceID": str, "spanID": str},
                    {"refType", "traceID", "spanID"},
                    f"{span_where}.references[{r}]",
                )
                assert reference["refType"] in REFERENCE_TYPES
                assert TRACE_ID_FORM.fullmatch(reference["traceID"])
                assert SPAN_ID_FORM.fullmatch(reference["spanID"])
            for k, tag in enumerate(span.get("tags", [])):
                check_key_value(tag, f"{span_where}.tags[{k}]")
            for g, log in enumerate(span.get("logs", [])):
                check_object(
                    log,
                    {"timestamp": int, "fields": list},
                    {"timestamp"},
                    f"{span_where}.logs[{g}]",
                )
                for k, field in enumerate(log.get("fields", [])):
                    check_key_value(field, f"{span_where}.logs[{g}].fields[{k}]")


def typed(value: Any) -> tuple[str, Any]:
    """The (type, value) a Jaeger tag should hold for an attribute value."""
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, int):
        return "int64", value
    if isinstance(value, float):
        return "float64", value
    if isinstance(value, str):
        return "string", value
    return "string", json.dumps(list(value))


def tags_of(items: list[dict[str, Any]]) -> dict[str, tuple[str, Any]]:
    return {item["key"]: (item["type"], item["value"]) for item in items}


@pytest.fixture
def exported(tmp_path: Path) -> tuple[list[ReadableSpan], dict[str, Any]]:
    """The reference run exported to a Jaeger file, and the spans behind it."""
    path = tmp_path / "trace.json"
    exporter = JaegerJsonExporter(path)
    stream = reference_stream()
    count = export_events(stream, exporter, severity_of=severity_with_warning_attempts)
    exporter.shutdown()
    assert count == WORLD_SIZE * SPANS_PER_RANK
    spans = spans_from_events(stream, severity_of=severity_with_warning_attempts)
    return spans, json.loads(path.read_text(encoding="utf-8"))


def test_the_file_validates_against_jaegers_model(
    exported: tuple[list[ReadableSpan], dict[str, Any]],
) -> None:
    _, document = exported
    validate_jaeger(document)
    (trace,) = document["data"]
    assert trace["traceID"] == TRACE_ID
    assert len(trace["spans"]) == WORLD_SIZE * SPANS_PER_RANK
    # One process per rank: each rank has its own resource.
    assert len(trace["processes"]) == WORLD_SIZE
    assert {process["serviceName"] for process in trace["processes"].values()} == {
        "startup-orchestrator"
    }


def test_every_span_round_trips(exported: tuple[list[ReadableSpan], dict[str, Any]]) -> None:
    spans, document = exported
    (trace,) = document["data"]
    by_id = {span["spanID"]: span for span in trace["spans"]}
    assert len(by_id) == len(spans)

    for span in spans:
        out = by_id[f"{span.context.span_id:016x}"]
        assert out["traceID"] == f"{span.context.trace_id:032x}"
        assert out["operationName"] == span.name
        assert out["flags"] == 1
        assert span.start_time is not None
        assert span.end_time is not None
        assert out["startTime"] * 1000 == span.start_time
        assert out["duration"] * 1000 == span.end_time - span.start_time
        parent = span.parent
        assert parent is not None
        assert out["references"][0] == {
            "refType": "CHILD_OF",
            "traceID": f"{parent.trace_id:032x}",
            "spanID": f"{parent.span_id:016x}",
        }

        tags = tags_of(out["tags"])
        for key, value in (span.attributes or {}).items():
            assert tags[key] == typed(value), key
        assert tags["span.kind"] == ("string", "internal")
        assert tags["otel.scope.name"] == ("string", "startup-orchestrator")
        if span.status.status_code is StatusCode.ERROR:
            assert tags["error"] == ("bool", True)
            assert tags["otel.status_code"] == ("string", "ERROR")
            assert tags["otel.status_description"] == ("string", span.status.description)
        else:
            assert "error" not in tags
            assert "otel.status_code" not in tags

        assert len(out["logs"]) == len(span.events)
        for log, event in zip(out["logs"], span.events, strict=True):
            assert log["timestamp"] * 1000 == event.timestamp
            fields = tags_of(log["fields"])
            assert fields["event"] == ("string", event.name)
            for key, value in (event.attributes or {}).items():
                assert fields[key] == typed(value)

        process = trace["processes"][out["processID"]]
        resource = dict(span.resource.attributes)
        assert process["serviceName"] == resource.pop("service.name")
        assert tags_of(process["tags"]) == {key: typed(value) for key, value in resource.items()}


def test_a_recovered_fallback_is_marked_by_severity_not_red(
    exported: tuple[list[ReadableSpan], dict[str, Any]],
) -> None:
    _, document = exported
    (trace,) = document["data"]
    red = {
        span["operationName"]
        for span in trace["spans"]
        if tags_of(span["tags"]).get("error") == ("bool", True)
    }
    assert red == set()  # every rank started: Jaeger lists no errors
    for span in trace["spans"]:
        if span["operationName"] == "allreduce/workspace/mnnvl":
            assert tags_of(span["tags"])["startup.severity"] == ("string", "WARNING")
            assert [tags_of(log["fields"])["event"][1] for log in span["logs"]] == ["exception"]
    zentorch = next(s for s in trace["spans"] if s["operationName"] == "platform/cpu/zentorch")
    assert [tags_of(log["fields"])["exception.type"][1] for log in zentorch["logs"]] == [
        "OSError",
        "FileNotFoundError",
    ]


def test_each_export_rewrites_a_complete_file(tmp_path: Path) -> None:
    path = tmp_path / "live.json"
    exporter = JaegerJsonExporter(path)
    assert exporter.path == path
    first = spans_from_events(reference_rank(0).events)
    second = spans_from_events(reference_rank(1).events)

    assert exporter.export(first) is SpanExportResult.SUCCESS
    document = json.loads(path.read_text(encoding="utf-8"))
    validate_jaeger(document)
    assert len(document["data"][0]["spans"]) == len(first)

    assert exporter.export(second) is SpanExportResult.SUCCESS
    document = json.loads(path.read_text(encoding="utf-8"))
    validate_jaeger(document)
    assert len(document["data"][0]["spans"]) == len(first) + len(second)
    assert len(document["data"][0]["processes"]) == 2
    assert exporter.force_flush()

    exporter.shutdown()
    assert exporter.export(first) is SpanExportResult.FAILURE
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_shutdown_without_spans_writes_an_empty_document(tmp_path: Path) -> None:
    path = tmp_path / "empty.json"
    exporter = JaegerJsonExporter(path)
    exporter.shutdown()
    exporter.shutdown()
    assert json.loads(path.read_text(encoding="utf-8")) == {"data": []}


def test_an_unwritable_file_is_a_failed_export(tmp_path: Path) -> None:
    exporter = JaegerJsonExporter(tmp_path / "missing-directory" / "trace.json")
    assert exporter.export(spans_from_events(reference_rank(0).events)) is (
        SpanExportResult.FAILURE
    )


def test_traces_are_grouped_and_odd_values_stay_valid() -> None:
    def span(trace_id: int, span_id: int, attributes: dict[str, Any]) -> ReadableSpan:
        return ReadableSpan(
            name=f"s{span_id}",
            context=SpanContext(trace_id, span_id, False, TraceFlags(1)),
            resource=Resource({"service.name": "odd", "weights": (0.5, 1.0)}),
            attributes=attributes,
            status=Status(StatusCode.ERROR),
            start_time=5_000,
            end_time=4_000,  # a clock that stepped back
        )

    document = jaeger_document(
        [
            span(1, 1, {"nan": math.nan, "inf": math.inf, "flags": (True, False)}),
            span(2, 2, {}),
            span(1, 3, {}),
        ]
    )
    validate_jaeger(json.loads(json.dumps(document, allow_nan=False)))

    first, second = document["data"]
    assert [s["spanID"] for s in first["spans"]] == [f"{1:016x}", f"{3:016x}"]
    assert [s["spanID"] for s in second["spans"]] == [f"{2:016x}"]
    assert first["spans"][0]["references"] == []
    assert first["spans"][0]["duration"] == 0
    tags = tags_of(first["spans"][0]["tags"])
    assert tags["nan"] == ("string", "nan")
    assert tags["inf"] == ("string", "inf")
    assert tags["flags"] == ("string", "[true, false]")
    assert "otel.status_description" not in tags
    assert tags["error"] == ("bool", True)
    assert tags_of(first["processes"]["p1"]["tags"]) == {"weights": ("string", "[0.5, 1.0]")}


def test_a_red_span_says_why_and_its_links_follow_its_parent() -> None:
    red = ReadableSpan(
        name="attention",
        context=SpanContext(1, 8, False, TraceFlags(1)),
        parent=SpanContext(1, 7, True, TraceFlags(1)),
        resource=Resource({"service.name": "probe"}),
        links=(Link(SpanContext(1, 9, False, TraceFlags(1))),),
        # A probe's own span may stamp its events outside itself.
        events=(SpanEvent("late", {}, 9_000_000), SpanEvent("early", {}, 1_000_000)),
        status=Status(StatusCode.ERROR, "RuntimeError: boom"),
        start_time=2_000_000,
        end_time=5_000_000,
    )
    [out] = jaeger_document([red])["data"][0]["spans"]

    assert out["references"] == [
        {"refType": "CHILD_OF", "traceID": f"{1:032x}", "spanID": f"{7:016x}"},
        {"refType": "FOLLOWS_FROM", "traceID": f"{1:032x}", "spanID": f"{9:016x}"},
    ]
    tags = tags_of(out["tags"])
    assert tags["otel.status_code"] == ("string", "ERROR")
    assert tags["otel.status_description"] == ("string", "RuntimeError: boom")
    assert tags["error"] == ("bool", True)
    assert [log["timestamp"] for log in out["logs"]] == [5_000, 2_000]


def test_span_events_never_fall_after_their_span_ends() -> None:
    """Recorded clocks round independently: an exception recorded as a step
    ended may carry a later nanosecond than the step's end, and whole
    microseconds may round a log past its span. Neither shows."""
    from events import StepFailed
    from events.testing import EventStream
    from tests.exporters.event_streams import MNNVL_CAUSE

    builder = EventStream(run_id="r", rank=0, world_size=1, wall_ns=1_000_000_999, tick_ns=1_501)
    builder.run_started()
    builder.started("probe")
    builder.end(StepFailed, "probe", cause=MNNVL_CAUSE)
    spans = spans_from_events(builder.run_finished())
    for span in spans:
        assert span.start_time is not None
        assert span.end_time is not None
        for event in span.events:
            assert span.start_time <= event.timestamp <= span.end_time

    trace = jaeger_document(spans)["data"][0]
    for out in trace["spans"]:
        end = out["startTime"] + out["duration"]
        for log in out["logs"]:
            assert out["startTime"] <= log["timestamp"] <= end
