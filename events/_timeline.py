"""The timeline projection: when each step of each rank started and ended.

It is the model for every other projection: frozen state, a pure ``apply``
that returns new state and shares what did not change, and no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._model import (
    TERMINAL_STEP_EVENTS,
    Event,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepKind,
    StepStarted,
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


class Timeline:
    """Projection: :class:`TimelineState` from any stream of events."""

    def initial(self) -> TimelineState:
        """No ranks yet."""
        return TimelineState()

    def apply(self, state: TimelineState, event: Event) -> TimelineState:
        """Record starts and ends; other events leave the state as it is."""
        rank = state.ranks.get(event.rank) or RankTimeline(rank=event.rank)
        updated = _apply_rank(rank, event)
        if updated is rank:
            return state
        ranks = dict(state.ranks)
        ranks[event.rank] = updated
        return TimelineState(ranks=ranks)


def _apply_rank(rank: RankTimeline, event: Event) -> RankTimeline:
    if isinstance(event, StepStarted):
        steps = dict(rank.steps)
        steps[event.step] = StepTiming(
            rank=event.rank,
            step=event.step,
            kind=event.kind,
            start_wall_ns=event.wall_ns,
            start_mono_ns=event.mono_ns,
            depends_on=event.depends_on,
        )
        return attrs.evolve(rank, steps=steps)
    if isinstance(event, TERMINAL_STEP_EVENTS):
        started = rank.steps.get(event.step)
        if started is None or started.finished:
            return rank
        steps = dict(rank.steps)
        steps[event.step] = attrs.evolve(
            started,
            end_wall_ns=event.wall_ns,
            duration_ns=event.mono_ns - started.start_mono_ns,
            outcome=outcome_of(event),
        )
        return attrs.evolve(rank, steps=steps)
    if isinstance(event, RunStarted):
        return attrs.evolve(rank, start_wall_ns=event.wall_ns, start_mono_ns=event.mono_ns)
    if isinstance(event, RunFinished):
        duration = None if rank.start_mono_ns is None else event.mono_ns - rank.start_mono_ns
        return attrs.evolve(
            rank, end_wall_ns=event.wall_ns, duration_ns=duration, outcome=event.outcome
        )
    return rank
