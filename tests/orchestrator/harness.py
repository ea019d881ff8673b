"""What the runtime tests share: picking events out of a log and checking the
contract every run's log must satisfy."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from events import (
    TERMINAL_STEP_EVENTS,
    Event,
    EventLog,
    MemoryLog,
    RunFinished,
    RunStarted,
    StepKind,
    StepStarted,
)
from orchestrator._runner import derive_trace_id

E = TypeVar("E", bound=Event)

#: Upper bound for any single run in these tests; a run that takes longer is
#: hung, and failing beats blocking the suite.
DEADLINE_S = 20.0


def new_log(run_id: str = "run-test") -> MemoryLog:
    """An empty in-memory log for rank 0."""
    return MemoryLog(run_id, 0)


def of_type(log: EventLog | Iterable[Event], cls: type[E], step: str | None = None) -> list[E]:
    """The events of type ``cls`` (of ``step``, if given), in log order."""
    events = log.read() if isinstance(log, EventLog) else log
    return [e for e in events if isinstance(e, cls) and (step is None or e.step == step)]


def only(log: EventLog | Iterable[Event], cls: type[E], step: str | None = None) -> E:
    """The single event of type ``cls`` (of ``step``); fails if there are 0 or more."""
    found = of_type(log, cls, step)
    assert len(found) == 1, f"expected one {cls.__name__} for {step!r}, found {found}"
    return found[0]


def terminal(log: EventLog, step: str) -> Event:
    """The terminal event of ``step`` (exactly one must exist)."""
    found = [e for e in log.read() if isinstance(e, TERMINAL_STEP_EVENTS) and e.step == step]
    assert len(found) == 1, f"expected one terminal event for {step!r}, found {found}"
    return found[0]


def started_steps(log: EventLog) -> list[str]:
    """The steps that started, in log order."""
    return [e.step for e in of_type(log, StepStarted)]


def assert_log_contract(log: EventLog, *, trace_id: str | None = None) -> None:
    """Check what every finished run's log guarantees.

    * ``seq`` is gapless from 0; the log opens with ``run.started`` and closes
      with exactly one ``run.finished``; every event is of this stream;
    * every ``step.started`` has exactly one terminal event after it with the
      same step and span id, and no terminal event lacks a start;
    * span ids are unique; a top-level step's span is a child of the run's
      root span; a candidate's or attempt's span (and any child step's) is a
      child of the span of the step whose path it extends;
    * every event carries the run's trace id: ``trace_id`` if given, else the
      one derived from the run id.
    """
    events = list(log.read())
    assert [e.seq for e in events] == list(range(len(events)))
    assert all(e.run_id == log.run_id and e.rank == log.rank for e in events)
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    assert sum(isinstance(e, RunFinished) for e in events) == 1
    root = events[0].span_id
    assert events[-1].span_id == root
    expected_trace = trace_id or derive_trace_id(log.run_id)
    assert {e.trace_id for e in events} == {expected_trace}

    starts: dict[str, StepStarted] = {}
    ends: dict[str, list[Event]] = {}
    for event in events:
        if isinstance(event, StepStarted):
            assert event.span_id not in starts, f"span id reused: {event}"
            assert event.span_id != root
            starts[event.span_id] = event
            ends[event.span_id] = []
        elif isinstance(event, TERMINAL_STEP_EVENTS):
            assert event.span_id in starts, f"terminal event without a start: {event}"
            start = starts[event.span_id]
            assert event.step == start.step
            assert event.parent_span_id == start.parent_span_id
            ends[event.span_id].append(event)
    for span_id, start in starts.items():
        assert len(ends[span_id]) == 1, f"{start.step}: terminal events {ends[span_id]}"
        parent = start.parent_span_id
        if parent == root:
            assert start.kind is StepKind.STEP, f"{start.step} is a {start.kind} under the root"
            continue
        assert parent in starts, f"{start.step}: parent span {parent} is not a step's span"
        assert start.step.startswith(starts[parent].step + "/"), (
            f"{start.step} is not nested under {starts[parent].step}"
        )
