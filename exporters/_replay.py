"""Replay export: the spans of a stored log, sent to any exporter.

Spans are rebuilt from the events by the same projection the live run uses,
so they carry the original trace and span ids, parents, timestamps,
attributes, events, status, resource and scope: a trace lost with a killed
process, or never sent because the collector was down, can be delivered
later from the logs alone.

Replay also knows what no rank knew live: which rank caused the run's
failure. :func:`with_root_cause` marks it on the ranks' root spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from events import Event, LaunchRecord, RootCause, SeverityPolicy, Slice, step_severity_hook

from ._errors import SpanExportError
from ._live import Refused, captured_messages, quiet_opentelemetry_loggers, refused_at_once
from ._spans import SeverityOf, spans_from_events

__all__ = ["export_events", "with_root_cause"]

#: The ``startup.kind`` of a rank's root span.
_ROOT_KIND = "run"


def export_events(
    events: Iterable[Event],
    exporter: SpanExporter,
    *,
    severity_of: SeverityOf | None = None,
    slices: Sequence[Slice] = (),
    policy: SeverityPolicy | None = None,
    batch_size: int = 512,
    root_cause: RootCause | None = None,
    launch: LaunchRecord | None = None,
) -> int:
    """Rebuild the spans of ``events`` (one rank, or several ranks merged with
    :func:`events.merge`) and send them to ``exporter`` in batches of at most
    ``batch_size``. Spans a stopped rank left open are sent as
    ``incomplete``. The exporter is not shut down: the caller owns it.

    Span status follows the severity of the messages derived from these same
    events with ``slices`` and ``policy`` (:func:`events.step_severity_hook`),
    as it did live, unless ``severity_of`` says otherwise. With the run's
    ``root_cause`` (:attr:`events.Replay.root_cause`), the ranks' root spans
    say which rank caused the failure (:func:`with_root_cause`). With its
    ``launch``, a dead rank's open spans last until its process ended.

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
    spans = with_root_cause(
        spans_from_events(events, severity_of=severity_of, launch=launch), root_cause
    )
    # The OpenTelemetry exporter's own log lines (one per retry) are kept
    # off the user's terminal: the error raised below says it all.
    quiet_opentelemetry_loggers(exporter)
    # A collector that refuses connections fails the export at once; a slow
    # one gets the exporter's own timeout.
    for start in range(0, len(spans), batch_size):
        batch = spans[start : start + batch_size]
        try:
            with captured_messages(refused_at_once):
                result = exporter.export(batch)
        except Refused:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            raise SpanExportError(
                exporter=type(exporter).__name__, exported=start, total=len(spans)
            )
    return len(spans)


def with_root_cause(spans: Iterable[ReadableSpan], cause: RootCause | None) -> list[ReadableSpan]:
    """``spans`` with the run's root cause marked on the ranks' root spans.

    Live, a rank knows only itself; once every rank's log is read, the root
    cause is known (:func:`events.root_cause`). The root span of the rank
    that caused the failure gets ``startup.root_cause=true`` and an ERROR
    status whose description is the root cause; every other rank that did
    not end ready gets ``startup.root_cause=false``,
    ``startup.root_cause_rank`` and a status description that begins
    ``"consequence of rank K"`` and a link (``startup.link="root cause"``,
    a ``FOLLOWS_FROM`` reference in Jaeger) to the root cause's own step
    span, so an operator jumps from any red row to the one that matters.
    Ranks that ended ready, and every span when ``cause`` is ``None``, are
    unchanged.
    """
    spans = list(spans)
    if cause is None:
        return spans
    # The span to jump to from any consequence: the root cause's own step
    # (its rank's root span when no one step is known).
    of_rank = [span for span in spans if (span.attributes or {}).get("startup.rank") == cause.rank]
    target = next(
        (span for span in of_rank if (span.attributes or {}).get("startup.step") == cause.step),
        None,
    ) or next(
        (span for span in of_rank if (span.attributes or {}).get("startup.kind") == _ROOT_KIND),
        None,
    )
    link = None if target is None else Link(target.context, {"startup.link": "root cause"})
    marked: list[ReadableSpan] = []
    for span in spans:
        attributes: dict[str, AttributeValue] = dict(span.attributes or {})
        if attributes.get("startup.kind") != _ROOT_KIND:
            marked.append(span)
            continue
        rank = attributes.get("startup.rank")
        if rank == cause.rank:
            attributes["startup.root_cause"] = True
            description = f"root cause: {_cause_text(cause)}"
        elif attributes.get("startup.outcome") != "ready":
            attributes["startup.root_cause"] = False
            attributes["startup.root_cause_rank"] = cause.rank
            own = span.status.description
            description = f"consequence of rank {cause.rank}" + (f": {own}" if own else "")
            if link is not None:
                span = _evolved(span, attributes, span.status, links=(*span.links, link))
        else:
            marked.append(span)
            continue
        marked.append(_evolved(span, attributes, Status(StatusCode.ERROR, description)))
    return marked


def _cause_text(cause: RootCause) -> str:
    where = "" if cause.step is None else f"step {cause.step}: "
    if cause.left_out is not None:
        why = "" if cause.exception is None else f"{cause.exception.reason}; "
        return f"{where}{why}{cause.left_out_text()}"
    if cause.exception is not None:
        return f"{where}{cause.exception.reason}"
    if cause.no_events is not None:
        return f"rank {cause.rank} wrote no events ({cause.no_events})"
    return f"{where}{cause.outcome.value}"


def _evolved(
    span: ReadableSpan,
    attributes: dict[str, AttributeValue],
    status: Status,
    *,
    links: Sequence[Link] | None = None,
) -> ReadableSpan:
    # A finished span is immutable: the marked one is a copy with the same
    # ids, times, events and resource (built as the projection builds it).
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events,
        links=span.links if links is None else links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
