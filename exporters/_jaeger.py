"""Jaeger-UI JSON: a trace file the Jaeger UI opens with "upload JSON",
without a collector.

The layout is Jaeger's JSON model (``model/json`` in the Jaeger repository,
the body of its ``/api/traces`` answer)::

    {"data": [{"traceID": "<32 hex>",
               "spans": [{"traceID", "spanID", "flags", "operationName",
                          "references": [{"refType": "CHILD_OF", "traceID", "spanID"}],
                          "startTime": <µs since the epoch>, "duration": <µs>,
                          "tags": [{"key", "type", "value"}],
                          "logs": [{"timestamp": <µs>, "fields": [{"key", "type", "value"}]}],
                          "processID": "p1", "warnings": null}],
               "processes": {"p1": {"serviceName", "tags": [...]}},
               "warnings": null}]}

OpenTelemetry data is mapped as Jaeger's own OTLP translator maps it: the
parent is the first ``CHILD_OF`` reference (links follow as
``FOLLOWS_FROM``); attributes become typed tags (``string``, ``bool``,
``int64``, ``float64``; sequences as JSON text); span kind, scope and status
become the ``span.kind``, ``otel.scope.*`` and ``otel.status_*`` tags, and an
ERROR span also gets ``error=true``; span events (exceptions) become logs
whose ``event`` field is the event name; each distinct resource becomes one
process whose ``serviceName`` is ``service.name``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import SERVICE_NAME
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, StatusCode

from events._files import write_file

__all__ = ["JaegerJsonExporter", "jaeger_document"]

JsonObject = dict[str, Any]


def jaeger_document(spans: Iterable[ReadableSpan]) -> JsonObject:
    """The Jaeger-UI JSON document (see the module documentation) holding
    ``spans``: one entry of ``data`` per trace, in order of first appearance,
    spans in the order given."""
    by_trace: dict[int, list[ReadableSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.context.trace_id, []).append(span)
    return {"data": [_trace(trace_id, members) for trace_id, members in by_trace.items()]}


class JaegerJsonExporter(SpanExporter):
    """Writes every span it is given to one Jaeger-UI JSON file.

    Jaeger's layout is a single JSON document, so each :meth:`export`
    rewrites the whole file with every span received so far (atomically: a
    temporary file renamed over it). The file therefore always holds a
    complete, loadable trace. :meth:`shutdown` writes an empty document if
    nothing was ever exported, so the file always exists afterwards.

    Args:
        path: the file to write; its directory must exist.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = Path(path)
        self._spans: list[ReadableSpan] = []
        self._lock = threading.Lock()
        self._written = False
        self._closed = False

    @property
    def path(self) -> Path:
        """The file written."""
        return self._path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Add ``spans`` and rewrite the file; FAILURE if it cannot be written
        or the exporter was shut down."""
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            self._spans.extend(spans)
            try:
                self._write()
            except OSError:
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Stop accepting spans; make sure the file exists."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if not self._written:
                with contextlib.suppress(OSError):
                    self._write()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Nothing is buffered: every export is already on disk."""
        return True

    def _write(self) -> None:
        text = json.dumps(jaeger_document(self._spans), separators=(",", ":"), allow_nan=False)
        write_file(self._path, (text + "\n").encode())
        self._written = True


def _trace(trace_id: int, spans: Sequence[ReadableSpan]) -> JsonObject:
    processes: dict[str, tuple[str, JsonObject]] = {}
    out_spans: list[JsonObject] = []
    for span in spans:
        resource = span.resource.attributes
        process = {
            "serviceName": str(resource.get(SERVICE_NAME, "unknown_service")),
            "tags": [_tag(key, value) for key, value in resource.items() if key != SERVICE_NAME],
        }
        identity = json.dumps(process, sort_keys=True)
        process_id, _ = processes.setdefault(identity, (f"p{len(processes) + 1}", process))
        out_spans.append(_span(span, process_id))
    return {
        "traceID": f"{trace_id:032x}",
        "spans": out_spans,
        "processes": dict(processes.values()),
        "warnings": None,
    }


def _span(span: ReadableSpan, process_id: str) -> JsonObject:
    context = span.context
    references = [] if span.parent is None else [_reference("CHILD_OF", span.parent)]
    references += [_reference("FOLLOWS_FROM", link.context) for link in span.links]
    # Whole microseconds, each time rounded down, and the duration taken
    # between the rounded ends: a log recorded at the span's last nanosecond
    # then never reads a microsecond after the span's end.
    start_us = (span.start_time or 0) // 1000
    end_us = max((span.end_time or 0) // 1000, start_us)
    return {
        "traceID": f"{context.trace_id:032x}",
        "spanID": f"{context.span_id:016x}",
        "flags": int(context.trace_flags),
        "operationName": span.name,
        "references": references,
        "startTime": start_us,
        "duration": end_us - start_us,
        "tags": _span_tags(span),
        "logs": [
            {
                "timestamp": min(max(event.timestamp // 1000, start_us), end_us),
                "fields": [
                    _tag("event", event.name),
                    *(_tag(key, value) for key, value in (event.attributes or {}).items()),
                ],
            }
            for event in span.events
        ],
        "processID": process_id,
        "warnings": None,
    }


def _span_tags(span: ReadableSpan) -> list[JsonObject]:
    tags = [_tag(key, value) for key, value in (span.attributes or {}).items()]
    tags.append(_tag("span.kind", span.kind.name.lower()))
    if (scope := span.instrumentation_scope) is not None:
        tags.append(_tag("otel.scope.name", scope.name))
        if scope.version:
            tags.append(_tag("otel.scope.version", scope.version))
    status = span.status
    if status.status_code is StatusCode.ERROR:
        tags.append(_tag("otel.status_code", "ERROR"))
        if status.description:
            tags.append(_tag("otel.status_description", status.description))
        tags.append(_tag("error", True))
    elif status.status_code is StatusCode.OK:
        tags.append(_tag("otel.status_code", "OK"))
    return tags


def _reference(kind: str, to: SpanContext) -> JsonObject:
    return {"refType": kind, "traceID": f"{to.trace_id:032x}", "spanID": f"{to.span_id:016x}"}


def _tag(key: str, value: object) -> JsonObject:
    # bool before int: True is an int to Python, a bool to Jaeger.
    if isinstance(value, bool):
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float) and math.isfinite(value):
        return {"key": key, "type": "float64", "value": value}
    if isinstance(value, Sequence) and not isinstance(value, str):
        value = json.dumps(list(value), default=str)
    # The rest as text: nan and inf as Python writes them.
    return {"key": key, "type": "string", "value": str(value)}
