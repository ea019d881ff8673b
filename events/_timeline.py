"""The timeline projection: when each step of each rank started and ended.

It is the model for every other projection: frozen state, one pure fold
(``apply_many``) that works on plain private dicts and builds the frozen
state once, at the end, sharing what did not change, and no I/O. ``apply``
is that fold of one event.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._builders import builder
from ._model import (
    TERMINAL_STEP_EVENTS,
    Event,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepKind,
    StepStarted,
    StepUnavailable,
    outcome_of,
)

__all__ = ["RankTimeline", "StepTiming", "Timeline", "TimelineState"]


@attrs.frozen(kw_only=True)
class StepTiming:
    """One step of one rank.

    Attributes:
        rank, step, kind: which step.
        start_wall_ns: wall clock at ``step.started``.
        start_mono_ns: monotonic clock at ``step.started``.
        end_wall_ns, duration_ns: set once the step ended (duration from the
            monotonic clock, immune to wall-clock steps).
        outcome: set once the step ended.
        depends_on: the steps it waited for.
    """

    rank: int
    step: str
    kind: StepKind
    start_wall_ns: int
    start_mono_ns: int
    depends_on: tuple[str, ...] = ()
    end_wall_ns: int | None = None
    duration_ns: int | None = None
    outcome: Outcome | None = None

    @property
    def finished(self) -> bool:
        """Whether the step has ended."""
        return self.outcome is not None


@attrs.frozen(kw_only=True)
class RankTimeline:
    """The steps of one rank, in the order they started."""

    rank: int
    start_wall_ns: int | None = None
    start_mono_ns: int | None = None
    end_wall_ns: int | None = None
    duration_ns: int | None = None
    outcome: RunOutcome | None = None
    steps: Mapping[str, StepTiming] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class TimelineState:
    """Every rank's timeline, by rank."""

    ranks: Mapping[int, RankTimeline] = attrs.field(factory=dict)

    def steps(self) -> tuple[StepTiming, ...]:
        """All step timings, by rank then start order."""
        return tuple(
            timing for rank in sorted(self.ranks) for timing in self.ranks[rank].steps.values()
        )


# A fold builds a timing per step: directly, without attrs' keyword parsing
# (see events._builders). The argument order is spelled out, so a change to
# the classes fails at import.
_timing = builder(
    StepTiming,
    (
        "rank",
        "step",
        "kind",
        "start_wall_ns",
        "start_mono_ns",
        "depends_on",
        "end_wall_ns",
        "duration_ns",
        "outcome",
    ),
)
_rank = builder(
    RankTimeline,
    ("rank", "start_wall_ns", "start_mono_ns", "end_wall_ns", "duration_ns", "outcome", "steps"),
)
_state = builder(TimelineState, ("ranks",))


class Timeline:
    """Projection: :class:`TimelineState` from any stream of events."""

    def initial(self) -> TimelineState:
        """No ranks yet."""
        return TimelineState()

    def apply(self, state: TimelineState, event: Event) -> TimelineState:
        """Record a start or an end; other events leave the state as it is
        (:meth:`apply_many` of one event)."""
        return self.apply_many(state, (event,))

    def apply_many(self, state: TimelineState, events: Iterable[Event]) -> TimelineState:
        """The state after every event of ``events`` in turn.

        No intermediate state is built: each rank that changes is worked on
        in plain dicts and lists, and its frozen timeline is built once, at
        the end. When no event is one the timeline records, ``state`` itself
        is returned.
        """
        ranks = state.ranks
        # A changed rank: [start_wall_ns, start_mono_ns, end_wall_ns,
        # duration_ns, outcome, steps]; a step is a StepTiming (as found in
        # ``state``) or the tuple of its fields, in _timing's order.
        working: dict[int, list[Any]] = {}
        kinds = _KINDS
        started_kind, terminal_kind, run_started_kind = _STARTED, _TERMINAL, _RUN_STARTED
        number: int | None = None
        rank: list[Any] = []
        steps: dict[str, Any] = {}
        # The kind table stands for the isinstance tests apply() makes; with
        # it, the type checker cannot tell an event's class, hence Any.
        stream: Iterable[Any] = events
        for event in stream:
            try:
                kind, outcome = kinds[type(event)]
            except KeyError:
                kind, outcome = _kind_of(event)
            if kind == _OTHER:
                continue
            if event.rank != number:
                number = event.rank
                found = working.get(number)
                if found is None:
                    previous = ranks.get(number)
                    if previous is None:
                        if kind == terminal_kind:
                            number = None
                            continue
                        found = [None, None, None, None, None, {}]
                    else:
                        found = [
                            previous.start_wall_ns, previous.start_mono_ns, previous.end_wall_ns,
                            previous.duration_ns, previous.outcome, dict(previous.steps),
                        ]  # fmt: skip
                    working[number] = found
                rank, steps = found, found[5]
            if kind == started_kind:
                steps[event.step] = (
                    number, event.step, event.kind, event.wall_ns, event.mono_ns,
                    event.depends_on, None, None, None,
                )  # fmt: skip
            elif kind == terminal_kind:
                step = event.step
                started = steps.get(step)
                if started is None:
                    continue  # never started
                if type(started) is not tuple:
                    started = _fields(started)
                if started[8] is not None:
                    continue  # ended already: terminal states are final
                start_mono = started[4]
                steps[step] = (
                    started[0], step, started[2], started[3], start_mono, started[5],
                    event.wall_ns, event.mono_ns - start_mono,
                    outcome_of(event) if outcome is None else outcome,
                )  # fmt: skip
            elif kind == run_started_kind:
                rank[0], rank[1] = event.wall_ns, event.mono_ns
            else:
                start = rank[1]
                rank[2] = event.wall_ns
                rank[3] = None if start is None else event.mono_ns - start
                rank[4] = event.outcome
        if not working:
            return state
        merged = dict(ranks)
        for number, (start_wall, start_mono, end_wall, duration, outcome, steps) in working.items():
            timings = {
                step: _timing(*timing) if type(timing) is tuple else timing
                for step, timing in steps.items()
            }
            merged[number] = _rank(
                number, start_wall, start_mono, end_wall, duration, outcome, timings
            )
        return _state(merged)


# What the fold does with an event, by its class: the kind, and for a
# terminal event class whose events all end a step the same way, the outcome.
_STARTED, _TERMINAL, _RUN_STARTED, _RUN_FINISHED, _OTHER = range(5)
_KINDS: dict[type[Event], tuple[int, Outcome | None]] = {}


def _kind_of(event: Event) -> tuple[int, Outcome | None]:
    outcome = None
    if isinstance(event, StepStarted):
        kind = _STARTED
    elif isinstance(event, TERMINAL_STEP_EVENTS):
        kind = _TERMINAL
        if not isinstance(event, StepUnavailable):
            outcome = outcome_of(event)
    elif isinstance(event, RunStarted):
        kind = _RUN_STARTED
    elif isinstance(event, RunFinished):
        kind = _RUN_FINISHED
    else:
        kind = _OTHER
    _KINDS[type(event)] = kind, outcome
    return kind, outcome


def _fields(timing: StepTiming) -> tuple[Any, ...]:
    """``timing``'s fields, in :func:`_timing`'s order."""
    return (
        timing.rank, timing.step, timing.kind, timing.start_wall_ns, timing.start_mono_ns,
        timing.depends_on, timing.end_wall_ns, timing.duration_ns, timing.outcome,
    )  # fmt: skip
