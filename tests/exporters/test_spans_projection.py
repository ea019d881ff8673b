"""The spans projection: names, ids, parents, times, attributes, events, status."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable

import attrs
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from events import (
    DecisionMade,
    Event,
    ExceptionInfo,
    Outcome,
    RunOutcome,
    Severity,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
)
from events.testing import EventStream
from exporters import (
    DEFAULT_SERVICE_NAME,
    ROOT_SPAN_NAME,
    SCOPE_NAME,
    SpanProjection,
    default_severity,
    instrumentation_scope,
    spans_from_events,
)
from tests.exporters.event_streams import (
    LAUNCHER_SPAN_ID,
    MNNVL_CAUSE,
    RUN_ID,
    SPANS_PER_RANK,
    TRACE_ID,
    WORLD_SIZE,
    ZENTORCH_CAUSE,
    reference_rank,
    reference_stream,
    severity_with_warning_attempts,
    started_rank,
)


def by_name(spans: list[ReadableSpan], rank: int = 0) -> dict[str, ReadableSpan]:
    """Rank ``rank``'s spans by name, its root span as ``ROOT_SPAN_NAME``
    (checked to be named after the rank)."""
    named = {
        span.name: span
        for span in spans
        if span.attributes is not None and span.attributes["startup.rank"] == rank
    }
    root = named.pop(root_name(rank), None)
    if root is not None:
        named[ROOT_SPAN_NAME] = root
    return named


def root_name(rank: int) -> str:
    return f"{ROOT_SPAN_NAME} rank {rank}"


def fed(events: Iterable[Event]) -> list[ReadableSpan]:
    """The spans finished while feeding ``events`` (open ones are left open)."""
    projection = SpanProjection()
    return [span for event in events for span in projection.feed(event)]


def hex_span_id(span: ReadableSpan) -> str:
    return f"{span.context.span_id:016x}"


def hex_parent_id(span: ReadableSpan) -> str | None:
    return None if span.parent is None else f"{span.parent.span_id:016x}"


def test_every_rank_lands_in_one_trace_with_the_recorded_ids_and_times() -> None:
    stream = reference_stream()
    spans = spans_from_events(stream)

    assert len(spans) == WORLD_SIZE * SPANS_PER_RANK
    assert {span.context.trace_id for span in spans} == {int(TRACE_ID, 16)}
    assert len({span.context.span_id for span in spans}) == len(spans)
    started = {event.span_id: event for event in stream if event.TYPE == "step.started"}
    ended = {
        event.span_id: event
        for event in stream
        if event.TYPE not in ("step.started", "run.started", "decision.made")
    }
    roots = {event.span_id: event for event in stream if event.TYPE == "run.started"}
    for span in spans:
        span_id = hex_span_id(span)
        opened = started.get(span_id) or roots[span_id]
        assert span.start_time == opened.wall_ns
        assert span.end_time == ended[span_id].wall_ns
        assert hex_parent_id(span) == opened.parent_span_id
        assert span.context.is_remote is False
        assert span.context.trace_flags.sampled


def test_spans_nest_as_the_graph_nests() -> None:
    spans = by_name(spans_from_events(reference_rank(3).events), rank=3)
    root = spans[ROOT_SPAN_NAME]

    def parent_of(name: str) -> str:
        parent = hex_parent_id(spans[name])
        return next(n for n, span in spans.items() if hex_span_id(span) == parent)

    assert hex_parent_id(root) == LAUNCHER_SPAN_ID
    assert root.parent is not None
    assert root.parent.is_remote  # the launcher's span came through TRACEPARENT
    assert parent_of("platform") == ROOT_SPAN_NAME
    assert parent_of("platform/cpu") == "platform"
    assert parent_of("platform/cpu/zentorch") == "platform/cpu"
    assert parent_of("allreduce/workspace") == ROOT_SPAN_NAME
    assert parent_of("allreduce/workspace/mnnvl") == "allreduce/workspace"
    assert parent_of("allreduce/workspace/trtllm") == "allreduce/workspace"
    # A step's parent ran in the same process: only the root's came from afar.
    for name, span in spans.items():
        if name != ROOT_SPAN_NAME:
            assert span.parent is not None
            assert span.parent.is_remote is False, name


def test_attributes_carry_rank_identity_step_kind_outcome_severity_and_step_facts() -> None:
    spans = by_name(spans_from_events(reference_rank(5).events), rank=5)

    mnnvl = dict(spans["allreduce/workspace/mnnvl"].attributes or {})
    assert mnnvl == {
        "startup.rank": 5,
        "startup.local_rank": 1,
        "startup.world_size": WORLD_SIZE,
        "startup.run_id": RUN_ID,
        "startup.step": "allreduce/workspace/mnnvl",
        "startup.kind": "attempt",
        "startup.outcome": "unavailable",
        "startup.severity": "DEBUG",
        "startup.backend": "mnnvl",
        "startup.priority": 0,
        "startup.reasons": (MNNVL_CAUSE.reason,),
    }
    cpu = spans["platform/cpu"].attributes or {}
    assert cpu["startup.candidate"] == "cpu"
    assert cpu["startup.kind"] == "candidate"
    assert cpu["startup.outcome"] == "ok"
    assert cpu["startup.severity"] == "INFO"
    workspace = spans["allreduce/workspace"].attributes or {}
    assert workspace["startup.depends_on"] == ("platform",)

    root = dict(spans[ROOT_SPAN_NAME].attributes or {})
    assert root["startup.kind"] == "run"
    assert root["startup.outcome"] == "ready"
    assert root["startup.severity"] == "INFO"
    assert "startup.step" not in root  # a root has no step: no empty attribute
    assert root["startup.node_rank"] == 1
    assert root["startup.local_world_size"] == 4
    # host and pid are the resource's host.name and process.pid, not copied
    assert "startup.host" not in root
    assert "startup.pid" not in root
    resource = spans[ROOT_SPAN_NAME].resource.attributes
    assert resource["host.name"] == "node-1"
    assert resource["process.pid"] == 4005
    assert root["startup.graph"] == "engine"
    assert root["startup.versions.torch"] == "2.6.0"


def test_attributes_follow_the_semantic_conventions() -> None:
    builder = EventStream(
        run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID, launcher_span_id=LAUNCHER_SPAN_ID
    ).run_started(versions={"python": "3.11.7", "startup-orchestrator": "0.4.0", "torch": ""})
    builder.started("probe")
    builder.end(StepSucceeded, "probe")
    spans = fed(builder.run_finished())
    [root] = [
        span for span in spans if span.attributes and span.attributes["startup.kind"] == "run"
    ]
    attributes = dict(root.attributes or {})
    assert attributes["startup.versions.startup_orchestrator"] == "0.4.0"
    assert attributes["startup.versions.python"] == "3.11.7"
    assert "startup.versions.torch" not in attributes  # never an empty attribute
    for span in spans:
        for name, value in {**(span.attributes or {}), **span.resource.attributes}.items():
            assert "-" not in name, name
            assert value not in ("", ()), name
    resource = root.resource.attributes
    assert resource["service.version"] == "0.4.0"
    assert resource["process.runtime.name"] == "cpython"
    assert resource["process.runtime.version"] == "3.11.7"


def test_recorded_facts_win_over_step_attributes_of_the_same_name() -> None:
    builder = started_rank(0)
    builder.started("probe", attributes={"rank": 99, "outcome": "fake", "note": "kept"})
    builder.end(StepSucceeded, "probe")
    (span,) = fed(builder.events)

    assert span.attributes is not None
    assert span.attributes["startup.rank"] == 0
    assert span.attributes["startup.outcome"] == "ok"
    assert span.attributes["startup.note"] == "kept"


def test_step_attribute_values_become_valid_opentelemetry_values() -> None:
    builder = started_rank(0)
    builder.started(
        "probe",
        attributes={
            "names": ["a", "b"],
            "flags": [True, False],
            "ratios": [0.5, 1.5],
            "counts": [1, 2],
            "mixed": [1, "a"],
            "nested": {"b": 1, "a": [None]},
            "huge": 2**70,
            "missing": None,
            "empty": [],
        },
    )
    builder.end(StepSucceeded, "probe")
    (span,) = fed(builder.events)
    attributes = span.attributes or {}

    assert attributes["startup.names"] == ("a", "b")
    assert attributes["startup.flags"] == (True, False)
    assert attributes["startup.ratios"] == (0.5, 1.5)
    assert attributes["startup.counts"] == (1, 2)
    assert attributes["startup.mixed"] == '[1,"a"]'
    assert attributes["startup.nested"] == '{"a":[null],"b":1}'
    assert attributes["startup.huge"] == str(2**70)
    assert attributes["startup.empty"] == "[]"
    assert "startup.missing" not in attributes


def test_every_exception_of_the_cause_chain_is_an_exception_event() -> None:
    builder = reference_rank(0)
    zentorch_end = next(
        event
        for event in builder.events
        if event.step == "platform/cpu/zentorch" and event.TYPE == "step.unavailable"
    )
    spans = by_name(spans_from_events(builder.events))
    zentorch = spans["platform/cpu/zentorch"]

    chain = ZENTORCH_CAUSE.chain()
    assert (
        [event.name for event in zentorch.events] == ["exception"] * len(chain) == ["exception"] * 2
    )
    for event, member in zip(zentorch.events, chain, strict=True):
        assert event.timestamp == zentorch_end.wall_ns
        assert dict(event.attributes or {}) == {
            "exception.type": member.type,
            "exception.message": member.message,
            "exception.stacktrace": member.format(),
        }
    assert [dict(e.attributes or {})["exception.type"] for e in zentorch.events] == [
        "OSError",
        "FileNotFoundError",
    ]


def test_group_members_and_their_causes_are_exception_events_too() -> None:
    inner = ExceptionInfo(type="KeyError", message="'cuda'", reason="KeyError: 'cuda'")
    first = ExceptionInfo(type="ValueError", message="bad", reason="ValueError: bad", cause=inner)
    second = ExceptionInfo(type="TypeError", message="worse", reason="TypeError: worse")
    group = ExceptionInfo(
        type="ExceptionGroup",
        message="probes failed (2 sub-exceptions)",
        reason="ExceptionGroup: probes failed (2 sub-exceptions)",
        exceptions=(first, second),
    )
    builder = started_rank(0)
    builder.started("probe")
    builder.end(StepFailed, "probe", cause=group)
    (span,) = fed(builder.events)

    types = [dict(event.attributes or {})["exception.type"] for event in span.events]
    assert types == ["ExceptionGroup", "ValueError", "KeyError", "TypeError"]


def test_status_follows_severity_and_is_never_ok() -> None:
    spans = spans_from_events(reference_stream(), severity_of=severity_with_warning_attempts)
    for rank in range(WORLD_SIZE):
        named = by_name(spans, rank)
        mnnvl = named["allreduce/workspace/mnnvl"]
        # A recovered fallback (WARNING) is not red: its severity and its
        # exception event say what happened.
        assert mnnvl.status.status_code is StatusCode.UNSET
        assert (mnnvl.attributes or {})["startup.severity"] == "WARNING"
        assert [event.name for event in mnnvl.events] == ["exception"]
        for name in (
            "allreduce/workspace",
            "allreduce/workspace/trtllm",
            "platform",
            "platform/cpu",
            "platform/cpu/zentorch",  # unavailable at DEBUG
            ROOT_SPAN_NAME,
        ):
            assert named[name].status.status_code is StatusCode.UNSET, name
            assert named[name].status.description is None
    assert all(span.status.status_code is not StatusCode.OK for span in spans)


def _severity_by_step(severities: dict[str, Severity | None]) -> object:
    def severity_of(rank: int, step: str, end: Event) -> Severity | None:
        return severities.get(step)

    return severity_of


def test_spans_with_the_same_severity_get_the_same_status() -> None:
    """ERROR only for ERROR (and worse); WARNING and below stay UNSET, whatever
    the outcome or the exception the span carries."""
    severities: dict[str, Severity | None] = {
        "platform/cpu": Severity.WARNING,
        "allreduce/workspace/mnnvl": Severity.WARNING,
        "platform/cpu/zentorch": Severity.ERROR,
        "allreduce/workspace/trtllm": Severity.DEBUG,
    }
    spans = spans_from_events(
        reference_stream(),
        severity_of=_severity_by_step(severities),  # type: ignore[arg-type]
    )
    for rank in range(WORLD_SIZE):
        named = by_name(spans, rank)
        for step, severity in severities.items():
            span = named[step]
            expected = StatusCode.ERROR if severity is Severity.ERROR else StatusCode.UNSET
            assert span.status.status_code is expected, (rank, step)
            assert (span.attributes or {})["startup.severity"] == severity.name
        zentorch = named["platform/cpu/zentorch"]
        assert zentorch.status.description


def test_without_a_hook_unavailable_attempts_stay_unset() -> None:
    spans = by_name(spans_from_events(reference_rank(0).events))
    assert spans["allreduce/workspace/mnnvl"].status.status_code is StatusCode.UNSET


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Outcome.OK, Severity.INFO),
        (Outcome.ABSENT, Severity.DEBUG),
        (Outcome.UNAVAILABLE, Severity.DEBUG),
        (Outcome.INVALID, Severity.DEBUG),
        (Outcome.FAILED, Severity.ERROR),
        (Outcome.TIMED_OUT, Severity.ERROR),
        (Outcome.CRASHED, Severity.ERROR),
        (Outcome.CANCELLED, None),
    ],
)
def test_default_severity(outcome: Outcome, expected: Severity | None) -> None:
    builder = started_rank(0)
    builder.started("probe")
    cause = ExceptionInfo(type="RuntimeError", message="x", reason="RuntimeError: x")
    match outcome:
        case Outcome.OK:
            builder.end(StepSucceeded, "probe")
        case Outcome.ABSENT | Outcome.UNAVAILABLE | Outcome.INVALID:
            builder.end(StepUnavailable, "probe", outcome=outcome)
        case Outcome.FAILED:
            builder.end(StepFailed, "probe", cause=cause)
        case Outcome.TIMED_OUT:
            builder.end(StepTimedOut, "probe", timeout_s=1.0, elapsed_ns=10**9)
        case Outcome.CRASHED:
            builder.end(StepCrashed, "probe", exit_code=1)
        case Outcome.CANCELLED:
            builder.end(StepCancelled, "probe")
    assert default_severity(0, "probe", builder.events[-1]) is expected
    assert default_severity(0, "probe", builder.events[0]) is None


def test_failed_step_is_red_with_its_reason_and_exceptions() -> None:
    cause = ExceptionInfo(
        type="RuntimeError",
        message="unknown zentorch failure",
        reason="RuntimeError: unknown zentorch failure",
        context=ExceptionInfo(type="OSError", message="boom", reason="OSError: boom"),
    )
    builder = started_rank(0)
    builder.started("platform")
    builder.end(StepFailed, "platform", cause=cause, origin="platform")
    builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="platform")
    step, root = spans_from_events(builder.events)

    assert step.status.status_code is StatusCode.ERROR
    assert step.status.description == "RuntimeError: unknown zentorch failure"
    assert (step.attributes or {})["startup.origin"] == "platform"
    assert [dict(e.attributes or {})["exception.type"] for e in step.events] == [
        "RuntimeError",
        "OSError",
    ]
    assert root.name == "startup rank 0"
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "RuntimeError: unknown zentorch failure"
    assert (root.attributes or {})["startup.outcome"] == "failed"
    assert (root.attributes or {})["startup.failed_step"] == "platform"
    assert [dict(e.attributes or {})["exception.type"] for e in root.events] == [
        "RuntimeError",
        "OSError",
    ]


@pytest.mark.parametrize(
    ("failed_step", "description"),
    [("platform", "step platform failed"), (None, "failed")],
)
def test_a_failed_run_without_a_recorded_cause_says_what_failed(
    failed_step: str | None, description: str
) -> None:
    builder = started_rank(0)
    builder.started("platform")
    builder.end(StepCancelled, "platform")
    [_, root] = spans_from_events(builder.run_finished(RunOutcome.FAILED, failed_step=failed_step))

    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == description
    assert root.events == ()


@pytest.mark.parametrize(
    ("timeout_s", "elapsed_ns", "message"),
    [
        (2.5, 2_500_000_000, "timed out after 2.5 s (ran 2.500 s)"),
        # As the messages and the report write a timeout: 2 s, not 2.0 s.
        (2.0, 2_000_412_000, "timed out after 2 s (ran 2.000 s)"),
    ],
)
def test_timeout_is_a_timeout_error_event(timeout_s: float, elapsed_ns: int, message: str) -> None:
    builder = started_rank(0)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.end(StepTimedOut, "attention/FLASH_ATTN", timeout_s=timeout_s, elapsed_ns=elapsed_ns)
    (span,) = fed(builder.events)

    assert span.status.status_code is StatusCode.ERROR
    (event,) = span.events
    attributes = dict(event.attributes or {})
    assert event.name == "exception"
    assert attributes["exception.type"] == "TimeoutError"
    assert attributes["exception.message"] == f"step attention/FLASH_ATTN {message}"
    assert span.status.description == f"TimeoutError: {attributes['exception.message']}"
    assert (span.attributes or {})["startup.timeout_s"] == timeout_s
    assert (span.attributes or {})["startup.outcome"] == "timed_out"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"signal": 9}, "killed by signal 9 (SIGKILL)"),
        ({"signal": 200}, "killed by signal 200"),
        ({"exit_code": 3}, "exited with code 3"),
        ({}, "process died"),
    ],
)
def test_crash_is_a_process_crashed_event_with_the_stderr_tail(
    fields: dict[str, int], expected: str
) -> None:
    builder = started_rank(0)
    builder.started("platform/cuda")
    builder.end(
        StepCrashed, "platform/cuda", stderr_tail=("Fatal Python error", "Segmentation"), **fields
    )
    (span,) = fed(builder.events)

    (event,) = span.events
    attributes = dict(event.attributes or {})
    assert attributes["exception.type"] == "ProcessCrashed"
    assert expected in attributes["exception.message"]
    assert attributes["exception.stacktrace"] == "Fatal Python error\nSegmentation"
    assert span.status.status_code is StatusCode.ERROR
    for name, value in fields.items():
        assert (span.attributes or {})[f"startup.{name}"] == value


def test_cancelled_step_has_no_severity_and_stays_unset() -> None:
    builder = started_rank(0)
    builder.started("attention/TRITON_ATTN", kind=StepKind.CANDIDATE)
    builder.end(StepCancelled, "attention/TRITON_ATTN", reason="sibling FLASH_ATTN failed")
    (span,) = fed(builder.events)

    attributes = span.attributes or {}
    assert "startup.severity" not in attributes
    assert attributes["startup.outcome"] == "cancelled"
    assert attributes["startup.cancel_reason"] == "sibling FLASH_ATTN failed"
    assert span.status.status_code is StatusCode.UNSET
    assert span.events == ()


@pytest.mark.parametrize(
    ("reason", "description"),
    [("sibling FLASH_ATTN failed", "sibling FLASH_ATTN failed"), ("", "cancelled")],
)
def test_a_cancelled_step_a_hook_calls_an_error_is_red_with_its_reason(
    reason: str, description: str
) -> None:
    builder = started_rank(0)
    builder.started("attention/TRITON_ATTN", kind=StepKind.CANDIDATE)
    builder.end(StepCancelled, "attention/TRITON_ATTN", reason=reason)
    projection = SpanProjection(severity_of=lambda rank, step, end: Severity.ERROR)
    (span,) = [span for event in builder.events for span in projection.feed(event)]

    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == description


def test_severity_hook_gets_rank_step_and_outcome_event() -> None:
    calls: list[tuple[int, str, str]] = []

    def hook(rank: int, step: str, event: object) -> Severity | None:
        calls.append((rank, step, type(event).__name__))
        return Severity.ERROR if step == "platform" else None

    spans = by_name(spans_from_events(reference_rank(2).events, severity_of=hook), rank=2)

    assert (2, "platform/cpu/zentorch", "StepUnavailable") in calls
    assert (2, "platform", "StepSucceeded") in calls
    assert len(calls) == SPANS_PER_RANK - 1  # every step, not the root
    assert spans["platform"].status.status_code is StatusCode.ERROR
    assert "startup.severity" not in (spans["platform/cpu"].attributes or {})


def test_a_rank_that_stopped_closes_its_open_spans_as_incomplete() -> None:
    builder = started_rank(1)
    builder.started("platform")
    builder.started("platform/cuda")
    builder.started("platform/cuda/probe")
    builder.end(StepSucceeded, "platform/cuda/probe")
    last = builder.events[-1].wall_ns
    projection = SpanProjection()

    finished = [span for event in builder.events for span in projection.feed(event)]
    assert [span.name for span in finished] == ["platform/cuda/probe"]
    assert projection.open_spans == 3

    cuda, platform, root = projection.finish()
    assert projection.open_spans == 0
    assert [cuda.name, platform.name, root.name] == ["platform/cuda", "platform", root_name(1)]
    for span in (cuda, platform, root):
        assert span.end_time == last
        assert span.status.status_code is StatusCode.ERROR
        assert "stopped" in (span.status.description or "")
        assert "incomplete" in (span.status.description or "")
        assert (span.attributes or {})["startup.outcome"] == "incomplete"
        assert (span.attributes or {})["startup.severity"] == "ERROR"
    assert projection.finish() == []


def test_a_stall_is_a_span_event_and_a_hung_span_says_where_it_waited() -> None:
    builder = started_rank(1)
    builder.started("attention")
    builder.stalled("attention", 10.0)
    builder.stalled("attention", 20.0)
    last = builder.events[-1].wall_ns
    projection = SpanProjection()
    assert [span for event in builder.events for span in projection.feed(event)] == []

    hung, _root = projection.finish()
    first, second = hung.events
    assert first.name == "startup.stalled"
    assert dict(second.attributes or {}) == {
        "startup.stall.why": "stalled",
        "startup.stall.elapsed_s": 20.0,
        "startup.stall.waiting_in": "wait_for_fabric (fabric.py:42)",
        "code.function": "wait_for_fabric",
        "code.filepath": "fabric.py",
        "code.lineno": 42,
        "startup.stall.stacks": (
            "thread 'step attention', innermost first:\nwait_for_fabric (fabric.py:42)"
        ),
    }
    # It lasts until its rank's last sign of life, and says where it waited.
    assert hung.end_time == last
    assert (hung.status.description or "").endswith(
        "(outcome incomplete), waiting in wait_for_fabric (fabric.py:42) after 20.0 s"
    )


def test_a_stall_says_how_long_it_waited_to_the_millisecond() -> None:
    builder = started_rank(1)
    builder.started("attention")
    builder.stalled("attention", 12.3456)
    projection = SpanProjection()
    for event in builder.events:
        projection.feed(event)

    hung, _root = projection.finish()
    (stall,) = hung.events
    assert (stall.attributes or {})["startup.stall.elapsed_s"] == 12.346


def test_spans_are_returned_as_each_step_ends() -> None:
    builder = reference_rank(0)
    projection = SpanProjection()
    emitted: list[tuple[str, str]] = []
    for event in builder.events:
        for span in projection.feed(event):
            emitted.append((event.TYPE, span.name))

    assert emitted == [
        ("step.unavailable", "platform/cpu/zentorch"),
        ("step.succeeded", "platform/cpu"),
        ("step.succeeded", "platform"),
        ("step.unavailable", "allreduce/workspace/mnnvl"),
        ("step.succeeded", "allreduce/workspace/trtllm"),
        ("step.succeeded", "allreduce/workspace"),
        ("run.finished", root_name(0)),
    ]
    assert projection.finish() == []


def test_decisions_are_span_events_of_their_span() -> None:
    spans = by_name(spans_from_events(reference_rank(0).events))

    (decision,) = spans["allreduce/workspace"].events
    assert decision.name == "startup.decision"
    assert dict(decision.attributes or {}) == {
        "startup.decision.name": "allreduce.backend",
        "startup.decision.value": "trtllm",
    }
    (ready,) = spans[ROOT_SPAN_NAME].events
    assert dict(ready.attributes or {})["startup.decision.value"] is True


def test_a_decision_recorded_after_its_step_ended_goes_on_the_root_span() -> None:
    builder = started_rank(0)
    builder.started("probe")
    builder.decision("probe.backend", "early", step="probe")
    builder.succeeded("probe")
    run_started, probe_started, decided, probe_ended = builder.events
    assert isinstance(decided, DecisionMade)
    late = attrs.evolve(decided, seq=3, wall_ns=probe_ended.wall_ns + 1_000, value="late")
    finished = builder.run_finished()[-1]
    probe, root = fed(
        [run_started, probe_started, attrs.evolve(probe_ended, seq=2), late, finished]
    )

    assert probe.name == "probe"
    assert probe.events == ()
    (decision,) = root.events
    assert decision.name == "startup.decision"
    assert decision.timestamp == late.wall_ns
    assert dict(decision.attributes or {}) == {
        "startup.decision.name": "probe.backend",
        "startup.decision.value": "late",
    }


def test_resource_names_the_rank_and_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    (span, *_) = spans_from_events(reference_rank(6).events)

    assert dict(span.resource.attributes) | {"telemetry.sdk.version": "-"} == {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "opentelemetry",
        "telemetry.sdk.version": "-",
        "service.name": DEFAULT_SERVICE_NAME,
        "service.instance.id": f"{RUN_ID}/rank-6",
        "host.name": "node-1",
        "process.pid": 4006,
        "startup.run_id": RUN_ID,
        "startup.rank": 6,
        "startup.local_rank": 2,
        "startup.world_size": WORLD_SIZE,
        "startup.local_world_size": 4,
        "startup.node_rank": 1,
    }


def test_resource_honours_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "vllm-startup")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci,host.name=spoofed")
    (span, *_) = spans_from_events(reference_rank(0).events)
    attributes = span.resource.attributes

    assert attributes["service.name"] == "vllm-startup"
    assert attributes["deployment.environment"] == "ci"
    assert attributes["host.name"] == "node-0"  # the recorded fact wins

    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes")
    (span, *_) = spans_from_events(reference_rank(0).events)
    assert span.resource.attributes["service.name"] == "from-attributes"


def test_a_service_version_the_rank_ran_with_wins_over_the_recorded_version() -> None:
    builder = EventStream(run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID).run_started(
        versions={"startup-orchestrator": "0.4.0"},
        resource={"service.name": "my-engine", "service.version": "2.1"},
    )
    [root] = fed(builder.run_finished())

    assert root.resource.attributes["service.name"] == "my-engine"
    assert root.resource.attributes["service.version"] == "2.1"
    assert (root.attributes or {})["startup.versions.startup_orchestrator"] == "0.4.0"


def test_scope_is_the_package() -> None:
    (span, *_) = spans_from_events(reference_rank(0).events)

    assert span.instrumentation_scope == instrumentation_scope()
    assert span.instrumentation_scope is not None
    assert span.instrumentation_scope.name == SCOPE_NAME
    assert span.instrumentation_scope.version == importlib.metadata.version("startup-orchestrator")


def test_a_stream_joined_late_still_gives_spans() -> None:
    events = reference_rank(4).events
    late = [event for event in events if event.TYPE != "run.started"]
    spans = by_name(spans_from_events(late), rank=4)

    assert set(spans) == {
        name for name in by_name(spans_from_events(events), rank=4) if name != ROOT_SPAN_NAME
    } | {ROOT_SPAN_NAME}
    zentorch = spans["platform/cpu/zentorch"]
    assert (zentorch.attributes or {})["startup.run_id"] == RUN_ID
    assert zentorch.resource.attributes["service.instance.id"] == f"{RUN_ID}/rank-4"


def test_a_terminal_event_without_its_start_still_gives_a_span() -> None:
    builder = started_rank(0)
    builder.started("probe")
    events = [event for event in builder.events if not isinstance(event, StepStarted)]
    builder.end(StepSucceeded, "probe")
    (span,) = fed([*events, builder.events[-1]])

    assert span.name == "probe"
    assert span.start_time == span.end_time == builder.events[-1].wall_ns


def test_malformed_ids_are_a_clear_error() -> None:
    builder = EventStream(trace_id="not-a-trace-id" + "0" * 18).run_started()
    builder.started("probe")
    builder.end(StepSucceeded, "probe")

    with pytest.raises(ValueError, match=r"step\.succeeded \(rank 0, seq 2, step 'probe'\)"):
        spans_from_events(builder.events)


def test_a_root_span_says_its_start_was_not_real() -> None:
    builder = EventStream(run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID).run_started(
        simulated="h200x8", injected=("0:attention/FLASH_ATTN=RuntimeError:boom",)
    )
    builder.started("probe")
    builder.end(StepSucceeded, "probe")
    [root] = [span for span in fed(builder.run_finished()) if span.parent is None]
    attributes = root.attributes or {}
    assert attributes["startup.simulated"] == "h200x8"
    assert attributes["startup.injected"] == ("0:attention/FLASH_ATTN=RuntimeError:boom",)

    real = EventStream(run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID).run_started()
    [root] = [span for span in fed(real.run_finished()) if span.parent is None]
    assert "startup.simulated" not in (root.attributes or {})
    assert "startup.injected" not in (root.attributes or {})


def test_a_root_span_names_the_role_of_its_process() -> None:
    builder = EventStream(run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID)
    builder.identity = attrs.evolve(builder.identity, role="engine core", parent_pid=4321)
    [root] = fed(builder.run_started().run_finished())

    assert root.name == "startup rank 0 (engine core)"
    assert (root.attributes or {})["startup.role"] == "engine core"
    assert (root.attributes or {})["startup.parent_pid"] == 4321

    plain = EventStream(run_id=RUN_ID, rank=0, world_size=1, trace_id=TRACE_ID).run_started()
    [root] = fed(plain.run_finished())
    assert root.name == "startup rank 0"
    assert "startup.role" not in (root.attributes or {})
    assert "startup.parent_pid" not in (root.attributes or {})


def test_a_wall_clock_stepped_back_never_puts_an_event_outside_its_span() -> None:
    cause = ExceptionInfo(type="RuntimeError", message="boom", reason="RuntimeError: boom")
    builder = started_rank(0)
    builder.started("probe")
    builder.advance(-50_000_000)  # the wall clock is set back under the run
    builder.decision("probe.backend", "a", step="probe")
    builder.advance(100_000_000)
    builder.succeeded("probe")
    builder.started("late")
    builder.advance(-50_000_000)
    builder.succeeded("late")
    builder.advance(-1_000_000_000)
    probe, late, root = fed(builder.run_finished(RunOutcome.FAILED, cause=cause))

    (decision,) = probe.events
    assert decision.timestamp == probe.start_time
    # A span never ends before it starts; its events lie within it.
    assert late.start_time is not None
    assert late.end_time == late.start_time
    assert root.start_time is not None
    assert root.end_time == root.start_time
    assert [event.timestamp for event in root.events] == [root.start_time]
