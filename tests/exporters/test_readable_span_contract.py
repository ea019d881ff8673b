"""The SDK contract the spans projection relies on.

Spans are built by hand as ``opentelemetry.sdk.trace.ReadableSpan`` objects,
which the SDK documents as created by its tracer only. pyproject.toml pins
the SDK minor version; these tests fail loudly when an upgrade changes what
the projection depends on, before any exporter sees a broken span.
"""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.sdk.version import __version__ as sdk_version
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

#: Every keyword the projection passes to ReadableSpan.
KEYWORDS_USED = {
    "name",
    "context",
    "parent",
    "resource",
    "attributes",
    "events",
    "links",
    "kind",
    "status",
    "start_time",
    "end_time",
    "instrumentation_scope",
}


def _pinned_range(distribution: str, group: list[str]) -> str:
    (requirement,) = [item for item in group if item.startswith(f"{distribution}>")]
    return requirement.removeprefix(distribution)


def test_sdk_version_is_inside_the_pinned_minor() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    pins = {
        "opentelemetry-sdk": _pinned_range("opentelemetry-sdk", project["dependencies"]),
        "opentelemetry-exporter-otlp": _pinned_range(
            "opentelemetry-exporter-otlp", project["dependencies"]
        ),
        "opentelemetry-proto": _pinned_range(
            "opentelemetry-proto", project["optional-dependencies"]["test"]
        ),
    }
    major, minor = (int(part) for part in sdk_version.split(".")[:2])
    expected = f">={major}.{minor},<{major}.{minor + 1}"
    assert pins == dict.fromkeys(pins, expected), (
        f"the installed opentelemetry-sdk is {sdk_version}, but pyproject.toml pins {pins}; "
        "spans are built by hand as ReadableSpan objects, so re-run the contract tests "
        "against the new SDK before moving the pin"
    )


def test_readable_span_constructor_takes_the_keywords_the_projection_passes() -> None:
    parameters = inspect.signature(ReadableSpan.__init__).parameters
    missing = KEYWORDS_USED - set(parameters)
    assert not missing, f"ReadableSpan() no longer accepts {sorted(missing)}"
    for name in KEYWORDS_USED:
        assert parameters[name].kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ), f"ReadableSpan() parameter {name!r} is no longer a keyword"
    required = {
        name
        for name, parameter in parameters.items()
        if name != "self"
        and parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    assert required <= KEYWORDS_USED, f"ReadableSpan() now requires {sorted(required)}"


def test_a_hand_built_span_reads_back_and_encodes_to_otlp() -> None:
    trace_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736
    context = SpanContext(trace_id, 0x1, is_remote=False, trace_flags=TraceFlags(1))
    parent = SpanContext(trace_id, 0x2, is_remote=True, trace_flags=TraceFlags(1))
    resource = Resource({"service.name": "contract"})
    scope = InstrumentationScope("startup-orchestrator", "1.2.3")
    event = Event("exception", {"exception.type": "OSError"}, 150)
    span = ReadableSpan(
        name="platform",
        context=context,
        parent=parent,
        resource=resource,
        attributes={"startup.rank": 3, "startup.reasons": ("a", "b")},
        events=(event,),
        links=(),
        kind=SpanKind.INTERNAL,
        status=Status(StatusCode.ERROR, "OSError: boom"),
        start_time=100,
        end_time=200,
        instrumentation_scope=scope,
    )

    assert span.name == "platform"
    assert span.context is context
    assert span.get_span_context() is context
    assert span.parent is parent
    assert span.resource is resource
    assert dict(span.attributes or {}) == {"startup.rank": 3, "startup.reasons": ("a", "b")}
    assert span.events == (event,)
    assert span.links == ()
    assert span.kind is SpanKind.INTERNAL
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "OSError: boom"
    assert (span.start_time, span.end_time) == (100, 200)
    assert span.instrumentation_scope is scope
    assert (span.dropped_attributes, span.dropped_events, span.dropped_links) == (0, 0, 0)
    assert '"name": "platform"' in span.to_json()

    request = encode_spans([span])
    (resource_spans,) = request.resource_spans
    (scope_spans,) = resource_spans.scope_spans
    (encoded,) = scope_spans.spans
    assert scope_spans.scope.name == "startup-orchestrator"
    assert scope_spans.scope.version == "1.2.3"
    assert encoded.trace_id == trace_id.to_bytes(16, "big")
    assert encoded.span_id == (1).to_bytes(8, "big")
    assert encoded.parent_span_id == (2).to_bytes(8, "big")
    assert (encoded.start_time_unix_nano, encoded.end_time_unix_nano) == (100, 200)
    assert encoded.status.code == 2
    assert encoded.status.message == "OSError: boom"
    assert [e.name for e in encoded.events] == ["exception"]
    assert encoded.events[0].time_unix_nano == 150
