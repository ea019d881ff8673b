"""Replay export: the spans of a stored log, sent to any exporter.

Spans are rebuilt from the events by the same projection the live run uses,
so they carry the original trace and span ids, parents, timestamps,
attributes, events, status, resource and scope: a trace lost with a killed
process, or never sent because the collector was down, can be delivered
later from the logs alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from events import Event, SeverityPolicy, Slice, step_severity_hook

from ._errors import SpanExportError
from ._live import captured_messages, quiet_opentelemetry_loggers
from ._spans import SeverityOf, spans_from_events

__all__ = ["export_events"]


def export_events(
    events: Iterable[Event],
    exporter: SpanExporter,
    *,
    severity_of: SeverityOf | None = None,
    slices: Sequence[Slice] = (),
    policy: SeverityPolicy | None = None,
    batch_size: int = 512,
) -> int:
    """Rebuild the spans of ``events`` (one rank, or several ranks merged with
    :func:`events.merge`) and send them to ``exporter`` in batches of at most
    ``batch_size``. Spans a stopped rank left open are sent as
    ``incomplete``. The exporter is not shut down: the caller owns it.

    Span status follows the severity of the messages derived from these same
    events with ``slices`` and ``policy`` (:func:`events.step_severity_hook`),
    as it did live, unless ``severity_of`` says otherwise.

    Returns:
        The number of spans exported.

    Raises:
        SpanExportError: the exporter reported failure for a batch; it says
            how many spans were delivered before.
        ValueError: ``batch_size`` is below 1, or an event's ids are malformed.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if severity_of is None:
        events = list(events)
        severity_of = step_severity_hook(events, slices=slices, policy=policy)
    spans = spans_from_events(events, severity_of=severity_of)
    # The OpenTelemetry exporter's own log lines (one per retry) are kept
    # off the user's terminal: the error raised below says it all.
    quiet_opentelemetry_loggers(exporter)
    for start in range(0, len(spans), batch_size):
        batch = spans[start : start + batch_size]
        with captured_messages():
            result = exporter.export(batch)
        if result is not SpanExportResult.SUCCESS:
            raise SpanExportError(
                exporter=type(exporter).__name__, exported=start, total=len(spans)
            )
    return len(spans)
