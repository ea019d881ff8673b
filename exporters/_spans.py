"""Spans are a projection of events.

:class:`SpanProjection` folds a stream of events (one rank's, or several
ranks' merged) into finished OpenTelemetry spans, built by hand as
:class:`opentelemetry.sdk.trace.ReadableSpan` objects carrying exactly what
the events recorded: trace id, span id, parent span id, start and end
wall-clock times. Nothing is read from the clock or from a random source, so
the live run (which feeds events one by one as they are appended) and a
replay of the stored log (:func:`spans_from_events`) produce equal spans.

The mapping::

    run.started ... run.finished      root span "startup rank N" of rank N ("startup rank N
                                      (ROLE)" when its identity names a role)
    step.started ... terminal event   span named by the step path
    recorded exception (and every     span event "exception" at the terminal
      member of its cause chain)        event's time
    decision.made                     span event "startup.decision"
    step.stalled                      span event "startup.stalled" on the step's
                                        span: where it waits, for how long,
                                        and its threads' innermost frames

Span status follows severity, and only severity: ``ERROR`` when the
outcome's severity (from the ``severity_of`` hook, by default
:func:`default_severity`) is ERROR or worse, else ``UNSET`` (never ``OK``).
A fallback the startup recovered from (WARNING) stays ``UNSET``: its span
carries the ``exception`` events and ``startup.severity = "WARNING"``, so a
healthy start is not a red service in a trace search; two spans with the
same severity always get the same status.

A rank whose log stops without ``run.finished`` (the process died) gets its
open spans closed at its last event's time with status ERROR and outcome
``incomplete`` when :meth:`SpanProjection.finish` is called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TypeAlias

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event as SpanEvent
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from events import (
    DecisionMade,
    Event,
    ExceptionInfo,
    LaunchRecord,
    Messages,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    Severity,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStalled,
    StepStarted,
    StepTimedOut,
    StepUnavailable,
    outcome_of,
    reason_of,
    signal_name,
)

from ._errors import SpanBuildError
from ._propagation import span_context

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "ROOT_SPAN_NAME",
    "SCOPE_NAME",
    "SeverityOf",
    "SpanProjection",
    "default_severity",
    "instrumentation_scope",
    "rank_resource",
    "spans_from_events",
]

#: ``severity_of(rank, step, outcome_event)``: the severity of a step's
#: outcome, or ``None`` when it has none (the span then stays UNSET and has
#: no ``startup.severity`` attribute).
SeverityOf: TypeAlias = Callable[[int, str, Event], Severity | None]

#: Name of every rank's root span, followed by ``" rank N"``: ranks are told
#: apart in a trace's timeline without opening a span (the names are as
#: many as the world's ranks).
ROOT_SPAN_NAME = "startup"
#: Instrumentation scope name of every span.
SCOPE_NAME = "startup-orchestrator"
#: ``service.name`` when neither ``OTEL_SERVICE_NAME`` nor
#: ``OTEL_RESOURCE_ATTRIBUTES`` names one.
DEFAULT_SERVICE_NAME = "startup-orchestrator"

_INCOMPLETE = RunOutcome.INCOMPLETE.value
_ROOT_KIND = "run"
_INT64 = range(-(2**63), 2**63)
_NAME_SEPARATORS = re.compile(r"[^a-z0-9_.]")
#: Links of a chain rendered in one exception event's stacktrace: a chain
#: as captured (at most 64 links) is rendered whole.
_STACKTRACE_LINKS = 64


def default_severity(rank: int, step: str, outcome_event: Event) -> Severity | None:
    """The severity used when no messages projection is plugged in: the
    kernel's generic messages' (:meth:`events.Messages.span_severity`).

    failed, timed_out, crashed → ERROR; absent, unavailable, invalid → DEBUG;
    ok → INFO; cancelled (and any non-terminal event) → ``None``.
    """
    return _KERNEL_MESSAGES.span_severity(_NO_MESSAGES, rank, step, outcome_event)


_KERNEL_MESSAGES = Messages()
_NO_MESSAGES = _KERNEL_MESSAGES.initial()


@functools.cache
def instrumentation_scope() -> InstrumentationScope:
    """The instrumentation scope of every span: name ``startup-orchestrator``,
    version the installed package version (``"0"`` when not installed)."""
    try:
        version = importlib.metadata.version("startup-orchestrator")
    except importlib.metadata.PackageNotFoundError:
        version = "0"
    return InstrumentationScope(SCOPE_NAME, version)


def rank_resource(started: RunStarted) -> Resource:
    """The OpenTelemetry resource of the rank that wrote ``started``.

    Built like :meth:`Resource.create`: the SDK's defaults, then the
    ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` the rank recorded
    in ``run.started`` (the current environment's for logs that predate that
    record), then the recorded facts (``service.instance.id =
    "{run_id}/rank-{rank}"``, ``host.name``, ``process.pid``, ``startup.run_id``,
    rank identity), which win. ``service.name`` is ``startup-orchestrator``
    unless the environment names one; ``service.version`` is the recorded
    startup-orchestrator version unless the environment names one;
    ``process.runtime.name`` and ``process.runtime.version`` are the
    interpreter's.
    """
    identity = started.identity
    facts: dict[str, AttributeValue] = {}
    version = started.versions.get("startup-orchestrator")
    if version and "service.version" not in (started.resource or {}):
        facts["service.version"] = version
    if python := started.versions.get("python"):
        # The log records the interpreter's version; its implementation is
        # the one replaying it (CPython in practice).
        facts["process.runtime.name"] = sys.implementation.name
        facts["process.runtime.version"] = python
    return _resource(
        started.resource,
        {
            **facts,
            "service.instance.id": f"{started.run_id}/rank-{identity.rank}",
            "host.name": started.host,
            "process.pid": started.pid,
            "startup.run_id": started.run_id,
            "startup.rank": identity.rank,
            "startup.local_rank": identity.local_rank,
            "startup.world_size": identity.world_size,
            "startup.local_world_size": identity.local_world_size,
            "startup.node_rank": identity.node_rank,
        },
    )


def _resource(
    recorded: Mapping[str, str] | None, attributes: Mapping[str, AttributeValue]
) -> Resource:
    if recorded is not None:
        # What the rank ran with, not what the replaying machine has set.
        resource = _SDK_DEFAULTS.merge(Resource({**recorded, **attributes}))
    else:
        resource = Resource.create(attributes)
    # Resource.create falls back to "unknown_service[:executable]" when the
    # environment names no service, and a recorded environment that named
    # none leaves it out; ours is a better default in both cases, but an
    # explicit OTEL_SERVICE_NAME or service.name in OTEL_RESOURCE_ATTRIBUTES
    # must win.
    service = resource.attributes.get(SERVICE_NAME)
    if service is None or str(service).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


#: The SDK's own attributes (telemetry.sdk.*), without anything the current
#: environment adds.
_SDK_DEFAULTS = Resource(
    {
        key: value
        for key, value in Resource.create({}).attributes.items()
        if key.startswith("telemetry.sdk.")
    }
)


@contextlib.contextmanager
def _building(event: Event) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        raise SpanBuildError(
            event_type=event.TYPE, rank=event.rank, seq=event.seq, step=event.step, reason=str(exc)
        ) from exc


@dataclasses.dataclass(slots=True)
class _Rank:
    run_id: str
    rank: int
    common: dict[str, AttributeValue]
    resource: Resource | None = None
    started: RunStarted | None = None
    finished: bool = False
    first_wall_ns: int = 0
    last_wall_ns: int = 0
    open_steps: dict[str, StepStarted] = dataclasses.field(default_factory=dict)
    pending_events: dict[str, list[SpanEvent]] = dataclasses.field(default_factory=dict)
    #: open step's span id -> where it was last seen waiting
    waiting: dict[str, StepStalled] = dataclasses.field(default_factory=dict)


class SpanProjection:
    """Folds events into finished spans, incrementally.

    Feed every event of one or more ranks in log order (a merged stream keeps
    each rank's order); :meth:`feed` returns the spans that event finished
    (a step span on its terminal event, the root span on ``run.finished``).
    :meth:`finish` closes what is still open as ``incomplete``. The same
    events always give equal spans, so live export and replay agree.

    Not thread-safe: one feeder at a time.

    Args:
        severity_of: ``severity_of(rank, step, outcome_event)``, the severity
            of a step's outcome (default :func:`default_severity`).
    """

    def __init__(self, *, severity_of: SeverityOf | None = None) -> None:
        self._severity_of: SeverityOf = severity_of or default_severity
        self._ranks: dict[tuple[str, int], _Rank] = {}

    @property
    def open_spans(self) -> int:
        """How many spans have started and not ended (roots included)."""
        return sum(
            len(state.open_steps) + (state.started is not None and not state.finished)
            for state in self._ranks.values()
        )

    def feed(self, event: Event) -> list[ReadableSpan]:
        """Take the next event; return the spans it finished (often none).

        Raises:
            ValueError: the event's trace or span id is malformed.
            Exception: whatever the ``severity_of`` hook raises.
        """
        state = self._rank_of(event)
        state.last_wall_ns = max(state.last_wall_ns, event.wall_ns)
        spans: list[ReadableSpan] = []
        with _building(event):
            match event:
                case StepStarted():
                    state.open_steps[event.span_id] = event
                case RunStarted(identity=identity):
                    state.started = event
                    state.resource = rank_resource(event)
                    state.common = {
                        "startup.rank": identity.rank,
                        "startup.local_rank": identity.local_rank,
                        "startup.world_size": identity.world_size,
                        "startup.run_id": event.run_id,
                    }
                case RunFinished():
                    state.finished = True
                    spans.append(self._root_span(state, event))
                case DecisionMade():
                    self._record_decision(state, event)
                case StepStalled():
                    self._record_stall(state, event)
                case _ if outcome_of(event) is not None:
                    started = state.open_steps.pop(event.span_id, None)
                    state.waiting.pop(event.span_id, None)
                    spans.append(self._step_span(state, started, event))
        return spans

    def finish(self, *, launch: LaunchRecord | None = None) -> list[ReadableSpan]:
        """Close every span still open, as ``incomplete``: the rank stopped.

        Each ends at its rank's last event time, or when the run's
        ``launch`` saw the rank's process end if that is later, with status
        ERROR. Ranks come in (run id, rank) order, inner spans before outer
        ones. No span is open afterwards: a second call returns none.
        """
        spans: list[ReadableSpan] = []
        for key in sorted(self._ranks):
            state = self._ranks[key]
            ended = None if launch is None else launch.ended_wall_ns(state.rank)
            if ended is not None and not state.finished:
                state.last_wall_ns = max(state.last_wall_ns, ended)
            for started in reversed(tuple(state.open_steps.values())):
                with _building(started):
                    spans.append(self._step_span(state, started, None))
            state.open_steps.clear()
            if state.started is not None and not state.finished:
                state.finished = True
                with _building(state.started):
                    spans.append(self._root_span(state, None))
        return spans

    def _rank_of(self, event: Event) -> _Rank:
        key = (event.run_id, event.rank)
        if (state := self._ranks.get(key)) is None:
            # A stream normally opens with run.started; one that does not (a
            # subscriber attached late) still gets spans, with the identity
            # the envelope alone gives.
            state = self._ranks[key] = _Rank(
                run_id=event.run_id,
                rank=event.rank,
                common={"startup.rank": event.rank, "startup.run_id": event.run_id},
                first_wall_ns=event.wall_ns,
                last_wall_ns=event.wall_ns,
            )
        return state

    @staticmethod
    def _resource_of(state: _Rank) -> Resource:
        if state.resource is None:
            state.resource = _resource(
                None,
                {
                    "service.instance.id": f"{state.run_id}/rank-{state.rank}",
                    "startup.run_id": state.run_id,
                    "startup.rank": state.rank,
                },
            )
        return state.resource

    def _record_decision(self, state: _Rank, decision: DecisionMade) -> None:
        root_id = None if state.started is None else state.started.span_id
        if decision.span_id in state.open_steps or root_id in (None, decision.span_id):
            target = decision.span_id
        elif not state.finished:
            target = root_id
        else:
            return
        attributes: dict[str, AttributeValue] = {"startup.decision.name": decision.name}
        if (value := _attribute_value(decision.value)) is not None:
            attributes["startup.decision.value"] = value
        state.pending_events.setdefault(target, []).append(
            SpanEvent("startup.decision", attributes, decision.wall_ns)
        )

    @staticmethod
    def _record_stall(state: _Rank, stall: StepStalled) -> None:
        if stall.span_id not in state.open_steps:
            return
        attributes: dict[str, AttributeValue] = {
            "startup.stall.why": stall.why.value,
            "startup.stall.elapsed_s": round(stall.elapsed_ns / 1e9, 3),
        }
        if (frame := stall.waiting_in) is not None:
            attributes["startup.stall.waiting_in"] = frame.where()
            attributes["code.function"] = frame.name
            attributes["code.filepath"] = frame.filename
            if frame.lineno is not None:
                attributes["code.lineno"] = frame.lineno
        attributes["startup.stall.stacks"] = "\n".join(
            line
            for thread in stall.threads
            for line in (f"thread {thread.thread!r}, innermost first:", *thread.format())
        )
        state.pending_events.setdefault(stall.span_id, []).append(
            SpanEvent("startup.stalled", attributes, stall.wall_ns)
        )
        state.waiting[stall.span_id] = stall

    def _step_span(
        self, state: _Rank, started: StepStarted | None, end: Event | None
    ) -> ReadableSpan:
        """A step's span, ended by ``end``; ``None``: its rank stopped first."""
        last = end if end is not None else started
        assert last is not None
        head = started if started is not None else last
        if end is not None:
            found = outcome_of(end)
            assert found is not None
            outcome, severity = found.value, self._severity_of(end.rank, end.step, end)
            end_ns = end.wall_ns
            stopped = ""
        else:
            stall = state.waiting.pop(last.span_id, None)
            waiting = "" if stall is None else stall.summary()
            outcome, severity = _INCOMPLETE, Severity.ERROR
            end_ns = state.last_wall_ns
            stopped = (
                f"rank {state.rank} stopped before step {head.step} finished "
                f"(outcome {_INCOMPLETE})" + (f", {waiting}" if waiting else "")
            )
        attributes = dict(state.common)
        attributes["startup.step"] = last.step
        attributes["startup.kind"] = (started.kind if started is not None else StepKind.STEP).value
        attributes["startup.outcome"] = outcome
        if severity is not None:
            attributes["startup.severity"] = severity.name
        if started is not None:
            if started.depends_on:
                attributes["startup.depends_on"] = tuple(started.depends_on)
            # Recorded facts (rank, step, outcome...) win over a step attribute
            # of the same name.
            for key, value in started.attributes.items():
                if (converted := _attribute_value(value)) is not None:
                    attributes.setdefault(f"startup.{key}", converted)
        events = state.pending_events.pop(last.span_id, [])
        reason = _add_outcome(end, attributes, events) or stopped
        return readable_span(
            name=head.step,
            trace_id=last.trace_id,
            span_id=last.span_id,
            parent_span_id=head.parent_span_id,
            parent_is_remote=False,
            start_ns=head.wall_ns,
            end_ns=end_ns,
            attributes=attributes,
            events=events,
            status=_status(severity, reason),
            resource=self._resource_of(state),
        )

    def _root_span(self, state: _Rank, end: RunFinished | None) -> ReadableSpan:
        started = state.started
        head: Event | None = started if started is not None else end
        assert head is not None
        outcome = end.outcome if end is not None else RunOutcome.INCOMPLETE
        severity = Severity.INFO if outcome is RunOutcome.READY else Severity.ERROR
        attributes = dict(state.common)
        if started is not None:
            identity = started.identity
            # host.name and process.pid are on the resource: no copies here.
            # simulated and injected: not a real start, said where the trace is read.
            facts: dict[str, AttributeValue | None] = {
                "startup.local_world_size": identity.local_world_size,
                "startup.node_rank": identity.node_rank,
                "startup.role": identity.role,
                "startup.parent_pid": identity.parent_pid,
                "startup.graph": started.graph or None,
                "startup.simulated": started.simulated or None,
                "startup.injected": tuple(started.injected) or None,
            }
            attributes.update((key, value) for key, value in facts.items() if value is not None)
            for name, version in started.versions.items():
                if version:
                    # As the semantic conventions spell names: startup_orchestrator.
                    key = _NAME_SEPARATORS.sub("_", name.lower())
                    attributes[f"startup.versions.{key}"] = version
        # A root has no step: no startup.step attribute (never an empty one).
        attributes["startup.kind"] = _ROOT_KIND
        attributes["startup.outcome"] = outcome.value
        attributes["startup.severity"] = severity.name
        events = state.pending_events.pop(head.span_id, [])
        if end is not None:
            reason = end.outcome.value
            if end.failed_step is not None:
                attributes["startup.failed_step"] = end.failed_step
                reason = f"step {end.failed_step} failed"
            if end.cause is not None:
                events.extend(_exception_events(end.cause, end.wall_ns))
                reason = end.cause.reason
            end_ns = end.wall_ns
        else:
            end_ns = state.last_wall_ns
            reason = f"rank {state.rank} stopped before the run finished (outcome {_INCOMPLETE})"
        start_ns = started.wall_ns if started is not None else state.first_wall_ns
        return readable_span(
            name=f"{ROOT_SPAN_NAME} rank {state.rank}"
            + (f" ({started.identity.role})" if started and started.identity.role else ""),
            trace_id=head.trace_id,
            span_id=head.span_id,
            parent_span_id=head.parent_span_id,
            # The root's parent is the launcher's span, handed over through
            # TRACEPARENT from another process.
            parent_is_remote=True,
            start_ns=start_ns,
            end_ns=end_ns,
            attributes=attributes,
            events=events,
            status=_status(severity, reason),
            resource=self._resource_of(state),
        )


def spans_from_events(
    events: Iterable[Event],
    *,
    severity_of: SeverityOf | None = None,
    launch: LaunchRecord | None = None,
) -> list[ReadableSpan]:
    """Every span of a stored stream (one rank, or several merged with
    :func:`events.merge`), in the order they finished, then the spans a
    stopped rank left open (as ``incomplete``, lasting until its process
    ended when the run's ``launch`` saw that).

    Raises:
        ValueError: an event's trace or span id is malformed.
    """
    projection = SpanProjection(severity_of=severity_of)
    spans = [span for event in events for span in projection.feed(event)]
    spans.extend(projection.finish(launch=launch))
    return spans


def readable_span(
    *,
    name: str,
    trace_id: str,
    span_id: str,
    parent_span_id: str | None,
    parent_is_remote: bool,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, AttributeValue],
    events: Sequence[SpanEvent],
    status: Status,
    resource: Resource,
    links: Sequence[Link] = (),
) -> ReadableSpan:
    """A finished span with recorded ids and times."""
    # The SDK documents ReadableSpan as built by its tracer; building it by
    # hand is what lets a span carry recorded ids and times. The constructor
    # contract is pinned in pyproject.toml and checked by the test suite.
    # A span never ends before it starts (a wall clock set back under the
    # run), and its events never fall outside it: the recorded clocks round
    # independently, so an exception recorded as the step ended may read a
    # microsecond after the span's end.
    end_ns = max(end_ns, start_ns)
    events = tuple(
        event
        if start_ns <= event.timestamp <= end_ns
        else SpanEvent(event.name, event.attributes, min(max(event.timestamp, start_ns), end_ns))
        for event in events
    )
    return ReadableSpan(
        name=name,
        context=span_context(trace_id, span_id),
        parent=(
            None
            if parent_span_id is None
            else span_context(trace_id, parent_span_id, is_remote=parent_is_remote)
        ),
        resource=resource,
        attributes=attributes,
        events=events,
        links=tuple(links),
        kind=SpanKind.INTERNAL,
        status=status,
        start_time=start_ns,
        end_time=end_ns,
        instrumentation_scope=instrumentation_scope(),
    )


#: Status objects are immutable: every span that is not red shares this one.
_UNSET = Status(StatusCode.UNSET)


def _status(severity: Severity | None, reason: str) -> Status:
    if severity is not None and severity >= Severity.ERROR:
        return Status(StatusCode.ERROR, reason or None)
    return _UNSET


def _add_outcome(
    end: Event | None, attributes: dict[str, AttributeValue], events: list[SpanEvent]
) -> str:
    """Add what ``end`` recorded to its span; return the description the
    span's status gives when the span is red."""
    if isinstance(end, StepUnavailable | StepFailed) and end.cause is not None:
        events.extend(_exception_events(end.cause, end.wall_ns))
    match end:
        case StepUnavailable(reasons=reasons):
            if reasons:
                attributes["startup.reasons"] = tuple(reasons)
            return reason_of(end)
        case StepFailed(origin=origin):
            if origin is not None:
                attributes["startup.origin"] = origin
            return reason_of(end)
        case StepTimedOut(timeout_s=timeout_s, elapsed_ns=elapsed_ns):
            attributes["startup.timeout_s"] = float(timeout_s)
            attributes["startup.elapsed_ns"] = elapsed_ns
            message = (
                f"step {end.step} timed out after {timeout_s:g} s (ran {elapsed_ns / 1e9:.3f} s)"
            )
            events.append(_exception_event("TimeoutError", message, end.wall_ns))
            return f"TimeoutError: {message}"
        case StepCancelled(reason=reason):
            if reason:
                attributes["startup.cancel_reason"] = reason
            return reason or Outcome.CANCELLED.value
        case StepCrashed(exit_code=exit_code, signal=signal_number, stderr_tail=stderr_tail):
            message = f"step {end.step} process died"
            if exit_code is not None:
                attributes["startup.exit_code"] = exit_code
                message = f"step {end.step} process exited with code {exit_code}"
            if signal_number is not None:
                attributes["startup.signal"] = signal_number
                name = signal_name(signal_number)
                named = "" if name == f"signal {signal_number}" else f" ({name})"
                message = f"step {end.step} process killed by signal {signal_number}{named}"
            events.append(
                _exception_event("ProcessCrashed", message, end.wall_ns, "\n".join(stderr_tail))
            )
            return f"ProcessCrashed: {message}"
    return ""


def _exception_events(info: ExceptionInfo, timestamp: int) -> list[SpanEvent]:
    """One ``exception`` event per recorded exception (:func:`_members`).

    The first event's stacktrace is the record's whole traceback as Python
    prints it; every later event's is its own exception's alone: rendering
    each link's causes again would make a long chain's text grow with the
    square of its length.
    """
    return [
        _exception_event(
            member.type,
            member.message,
            timestamp,
            member.format(chain=index == 0, max_links=_STACKTRACE_LINKS),
        )
        for index, member in enumerate(_members(info))
    ]


def _exception_event(
    kind: str, message: str, timestamp: int, stacktrace: str | None = None
) -> SpanEvent:
    attributes: dict[str, AttributeValue] = {"exception.type": kind, "exception.message": message}
    if stacktrace is not None:
        attributes["exception.stacktrace"] = stacktrace
    return SpanEvent("exception", attributes, timestamp)


def _members(info: ExceptionInfo) -> Iterator[ExceptionInfo]:
    """``info``, its chain and the members of its groups with their chains,
    depth first, with an explicit stack (a chain may be thousands deep)."""
    pending = [info]
    while pending:
        node = pending.pop()
        yield node
        # The next link comes after this one's group members and all of theirs.
        if (below := node.cause or node.context) is not None:
            pending.append(below)
        pending += reversed(node.exceptions)


def _attribute_value(value: object) -> AttributeValue | None:
    """A JSON value as an OpenTelemetry attribute value: scalars as they are,
    homogeneous lists of scalars as tuples, anything else as compact JSON;
    ``None`` (which OpenTelemetry cannot hold) is dropped."""
    if value is None:
        return None
    if isinstance(value, bool | str | float):
        return value
    if isinstance(value, int):
        return value if value in _INT64 else str(value)
    if isinstance(value, list | tuple):
        kinds = {type(item) for item in value}
        if len(kinds) == 1 and kinds <= {bool, str, float}:
            return tuple(value)
        if kinds == {int} and all(item in _INT64 for item in value):
            return tuple(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
