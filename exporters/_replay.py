"""Replay export: the spans of a stored log, sent to any exporter.

Spans are rebuilt by the projection the live run uses, so a trace lost with
a killed process, or never sent because the collector was down, can be
delivered later from the logs alone, and :func:`run_trace` adds what no rank
knew live: the root cause, and the launch's own span.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from events import (
    Event,
    Messages,
    Replay,
    RootCause,
    RunOutcome,
    Slice,
    launch_span_id,
    step_severity_hook,
)

from ._errors import SpanExportError
from ._live import (
    Refused,
    _summary,
    captured_messages,
    failure_detail,
    quiet_opentelemetry_loggers,
    refused_at_once,
)
from ._spans import _ROOT_KIND, SeverityOf, readable_span, spans_from_events

__all__ = ["export_events", "run_trace"]


def export_events(
    events: Iterable[Event],
    exporter: SpanExporter,
    *,
    replayed: Replay | None = None,
    severity_of: SeverityOf | None = None,
    slices: Sequence[Slice] = (),
    batch_size: int = 512,
) -> int:
    """Rebuild the spans of ``events`` (one rank, or several ranks merged with
    :func:`events.merge`) and send them to ``exporter`` in batches of at most
    ``batch_size``. Spans a stopped rank left open are sent as
    ``incomplete``. The exporter is not shut down: the caller owns it.

    Span status follows the severity of the messages derived from these same
    events with ``slices`` (:func:`events.step_severity_hook`), as it did
    live, unless ``severity_of`` says otherwise. With the run as ``replayed``
    (:func:`events.replay` of the same logs), the spans are :func:`run_trace`'s
    and ``slices`` are ``replayed``'s.

    Returns:
        The number of spans exported.

    Raises:
        SpanExportError: the exporter reported failure for a batch; it says
            how many spans were delivered before.
        ValueError: ``batch_size`` is below 1, or an event's ids are malformed.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    if replayed is not None:
        spans = run_trace(events, replayed, severity_of=severity_of)
    else:
        events = list(events)
        severity = severity_of or step_severity_hook(events, slices=slices)
        spans = spans_from_events(events, severity_of=severity)
    send_spans(spans, exporter, batch_size=batch_size)
    return len(spans)


def send_spans(
    spans: Sequence[ReadableSpan], exporter: SpanExporter, *, batch_size: int = 512
) -> None:
    """Send finished ``spans`` to ``exporter`` in batches of at most
    ``batch_size``. A collector that refuses connections fails at once; a
    slow one gets the exporter's own timeout. The exporter's own log lines
    (one per retry) are kept off the user's terminal: the error says it all.

    Raises:
        SpanExportError: the exporter reported failure for a batch; it says
            how many spans were delivered before.
    """
    quiet_opentelemetry_loggers(exporter)
    for start in range(0, len(spans), batch_size):
        batch = spans[start : start + batch_size]
        try:
            with captured_messages(refused_at_once) as said:
                result = exporter.export(batch)
        except Refused:
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            raise SpanExportError(
                exporter=type(exporter).__name__,
                exported=start,
                total=len(spans),
                detail=failure_detail(exporter, _summary(said, "export failed")),
            )


def run_trace(
    events: Iterable[Event], replayed: Replay, *, severity_of: SeverityOf | None = None
) -> list[ReadableSpan]:
    """Every span of a run's ``events`` (its ranks merged with
    :func:`events.merge`) as an operator reads them, once the run as
    ``replayed`` (:func:`events.replay` of the same logs) is known: rebuilt
    as :func:`spans_from_events` does, span status following the messages
    ``replayed`` derived with its slices (unless ``severity_of`` says
    otherwise), a dead rank's open spans lasting until its process ended,
    and:

    - **The root cause.** Live, a rank knows only itself. The root span of
      the rank that caused the failure gets ``startup.root_cause=true`` and
      an ERROR status whose description is the root cause; every other rank
      that did not end ready gets ``startup.root_cause=false``,
      ``startup.root_cause_rank``, a status description that begins
      ``"consequence of rank K"`` and a link (``startup.link="root cause"``,
      a ``FOLLOWS_FROM`` reference in Jaeger) to the root cause's own step
      span, so an operator jumps from any red row to the one that matters.
    - **One launch, one root.** The ranks of a run of several ranks hang
      their root spans from the launch's own span
      (:func:`events.launch_span_id`); it is added, first: named for the
      launch and its outcome (``launch 8 ranks: failed — rank 5
      attention/FLASH_ATTN``), from the launch's start to its end, a child
      of the launcher's ``TRACEPARENT`` span when it had one, carrying the
      outcome, the root cause, the simulated host and the injected faults
      as attributes and linked to the root cause's step span.

    The launch's span comes first, then the root cause's rank's spans, then
    the others (each rank's in the order they finished). Ranks that ended
    ready, and every span of a run without a root cause, are unchanged;
    spans of a single rank get no launch span.
    """
    severity = severity_of or functools.partial(
        Messages(slices=replayed.slices).span_severity, replayed.message_state
    )
    spans = spans_from_events(events, severity_of=severity, launch=replayed.launch)
    cause = replayed.root_cause
    link = None if cause is None else _root_cause_link(spans, cause)
    marked = spans if cause is None else [_marked(span, cause, link) for span in spans]
    if cause is not None:
        # The root cause's rank first, where an order is kept (a Jaeger
        # file, a console).
        marked.sort(key=lambda span: (span.attributes or {}).get("startup.rank") != cause.rank)
    launch = _launch_span(marked, replayed, link)
    return marked if launch is None else [launch, *marked]


def _root_cause_link(spans: Sequence[ReadableSpan], cause: RootCause) -> Link | None:
    """A link to the root cause's own step span, else to its rank's root span."""
    of_rank = [span for span in spans if (span.attributes or {}).get("startup.rank") == cause.rank]
    for key, value in (("startup.step", cause.step), ("startup.kind", _ROOT_KIND)):
        for span in of_rank:
            if (span.attributes or {}).get(key) == value:
                return Link(span.context, {"startup.link": "root cause"})
    return None


def _marked(span: ReadableSpan, cause: RootCause, link: Link | None) -> ReadableSpan:
    """``span``, marked if it is the root span of a rank that did not end ready."""
    attributes: dict[str, AttributeValue] = dict(span.attributes or {})
    own, links = attributes.get("startup.rank") == cause.rank, span.links
    if attributes.get("startup.kind") != _ROOT_KIND or (
        not own and attributes.get("startup.outcome") == "ready"
    ):
        return span
    if own:
        attributes["startup.root_cause"] = True
        description = f"root cause: {_cause_text(cause)}"
    else:
        attributes["startup.root_cause"] = False
        attributes["startup.root_cause_rank"] = cause.rank
        said = span.status.description
        description = f"consequence of rank {cause.rank}" + (f": {said}" if said else "")
        links = links if link is None else (*links, link)
    # A finished span is immutable: the marked one is a copy with the same
    # ids, times, events and resource (built as the projection builds it).
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=span.events,
        links=links,
        kind=span.kind,
        status=Status(StatusCode.ERROR, description),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _launch_span(
    spans: Sequence[ReadableSpan], replayed: Replay, link: Link | None
) -> ReadableSpan | None:
    """The launch's own span, when the ranks' roots hang from it."""
    roots = [span for span in spans if (span.attributes or {}).get("startup.kind") == _ROOT_KIND]
    if not roots or replayed.run_id is None:
        return None
    trace_id = f"{roots[0].context.trace_id:032x}"
    span_id = launch_span_id(trace_id, replayed.run_id)
    if not any(
        root.parent is not None and f"{root.parent.span_id:016x}" == span_id for root in roots
    ):
        return None
    launch = replayed.launch
    start_ns = min(root.start_time or 0 for root in roots)
    end_ns = max(root.end_time or 0 for root in roots)
    if launch is not None:
        start_ns = min(start_ns, launch.started_wall_ns or start_ns)
        end_ns = max(end_ns, launch.finished_wall_ns or end_ns)
    outcome, cause = replayed.outcome, replayed.root_cause
    name = f"launch {replayed.world_size} ranks: {outcome.value}"
    attributes: dict[str, AttributeValue] = {
        "startup.kind": "launch",
        "startup.run_id": replayed.run_id,
        "startup.world_size": replayed.world_size,
        "startup.outcome": outcome.value,
    }
    if replayed.simulated:
        attributes["startup.simulated"] = replayed.simulated
    if replayed.injected:
        attributes["startup.injected"] = tuple(replayed.injected)
    status = Status(StatusCode.UNSET)
    if cause is not None:
        steps = (cause.step,) if cause.step is not None else cause.in_flight
        name += f" \N{EM DASH} rank {cause.rank}" + (f" {', '.join(steps)}" if steps else "")
        text = cause.describe(since_ns=None if launch is None else launch.started_wall_ns)
        attributes["startup.root_cause_rank"] = cause.rank
        if cause.step is not None:
            attributes["startup.root_cause_step"] = cause.step
        attributes["startup.root_cause"] = text
        if outcome not in (RunOutcome.READY, RunOutcome.RUNNING):
            status = Status(StatusCode.ERROR, f"{outcome.value}: {text}")
    return readable_span(
        name=name,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=None if launch is None else launch.trace_parent,
        parent_is_remote=True,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attributes,
        events=(),
        status=status,
        resource=_launch_resource(roots[0].resource, replayed),
        links=() if link is None else (link,),
    )


def _launch_resource(rank_resource: Resource, replayed: Replay) -> Resource:
    """A launch's resource: its ranks' service (name, version, SDK), as the
    launch itself (``service.instance.id = "{run_id}/launch"``)."""
    kept = {
        key: value
        for key, value in rank_resource.attributes.items()
        if key in (SERVICE_NAME, "service.version")
        or key.startswith(("telemetry.", "process.runtime."))
    }
    return Resource(
        {
            **kept,
            "service.instance.id": f"{replayed.run_id}/launch",
            "startup.run_id": str(replayed.run_id),
            "startup.world_size": replayed.world_size,
        }
    )


def _cause_text(cause: RootCause) -> str:
    where = "" if cause.step is None else f"step {cause.step}: "
    why = None if cause.exception is None else cause.exception.reason
    if cause.left_out is not None:
        return where + ("" if why is None else f"{why}; ") + cause.left_out_text()
    return where + (cause.outcome.value if why is None else why)
