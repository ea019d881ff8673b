"""Consumers of startup events: OpenTelemetry spans and their exporters.

Spans are a projection of the event log, built identically while the run is
live and when a stored log is replayed::

    from events import MemoryLog
    from exporters import LiveSpans, exporter_from_environment

    exporter = exporter_from_environment()      # OTEL_EXPORTER_OTLP_* ...
    if exporter is not None:
        live = LiveSpans(exporter)
        log.subscribe(live)
        ...
        live.shutdown(timeout_s=5.0)

    # later, anywhere, from the logs alone (replayed: the root cause marked,
    # and a launch's own span, the one root of its ranks' roots):
    from events import merge, read_log, replay
    from exporters import JaegerJsonExporter, export_events

    logs = [read_log(p) for p in paths]
    export_events(merge(logs), JaegerJsonExporter("trace.json"), replayed=replay(logs))

This package depends on :mod:`events` and OpenTelemetry only.
"""

import typing

from events._surface import Surface as _Surface

# Every public name is declared once, here: the type checkers' re-exports,
# and at run time (events/_surface.py) the table of what loads on first
# use (PEP 562), with __all__ and dir(), so importing the package for one
# thing (the command line's --help) does not import everything.
if typing.TYPE_CHECKING:
    from ._environment import OTLP_PROTOCOLS as OTLP_PROTOCOLS
    from ._environment import combine_exporters as combine_exporters
    from ._environment import console_exporter as console_exporter
    from ._environment import exporter_from_environment as exporter_from_environment
    from ._environment import otlp_exporter as otlp_exporter
    from ._environment import otlp_grpc_exporter as otlp_grpc_exporter
    from ._environment import otlp_http_exporter as otlp_http_exporter
    from ._errors import ExportersError as ExportersError
    from ._errors import SpanBuildError as SpanBuildError
    from ._errors import SpanExportError as SpanExportError
    from ._errors import TracingSettingError as TracingSettingError
    from ._html import report_html as report_html
    from ._jaeger import JaegerJsonExporter as JaegerJsonExporter
    from ._jaeger import jaeger_document as jaeger_document
    from ._live import TRACING_LOGGER_NAME as TRACING_LOGGER_NAME
    from ._live import LiveSpans as LiveSpans
    from ._logging import MESSAGE_LOGGER_PREFIX as MESSAGE_LOGGER_PREFIX
    from ._logging import LoggingBridge as LoggingBridge
    from ._logging import launcher_messages as launcher_messages
    from ._propagation import TraceParent as TraceParent
    from ._propagation import activate_span as activate_span
    from ._propagation import context_with_span as context_with_span
    from ._propagation import format_traceparent as format_traceparent
    from ._propagation import parse_traceparent as parse_traceparent
    from ._replay import export_events as export_events
    from ._replay import run_trace as run_trace
    from ._report import REPORT_VERSION as REPORT_VERSION
    from ._report import report_header as report_header
    from ._report import report_json as report_json
    from ._report import report_text as report_text
    from ._spans import DEFAULT_SERVICE_NAME as DEFAULT_SERVICE_NAME
    from ._spans import ROOT_SPAN_NAME as ROOT_SPAN_NAME
    from ._spans import SCOPE_NAME as SCOPE_NAME
    from ._spans import SeverityOf as SeverityOf
    from ._spans import SpanProjection as SpanProjection
    from ._spans import default_severity as default_severity
    from ._spans import instrumentation_scope as instrumentation_scope
    from ._spans import rank_resource as rank_resource
    from ._spans import spans_from_events as spans_from_events
    from ._terminal import terminal_text as terminal_text
    from ._tracing import Tracing as Tracing
    from ._views import blame_text as blame_text
    from ._views import critical_path_text as critical_path_text
    from ._views import decisions_of as decisions_of
    from ._views import diff_text as diff_text
    from ._views import explain_text as explain_text
    from ._views import run_differences as run_differences

_SURFACE = _Surface(globals())
