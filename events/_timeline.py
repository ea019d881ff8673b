"""The timeline projection: when each step of each rank started and ended.

It is the model for every other projection: frozen state, a pure ``apply``
that returns new state and shares what did not change, and no I/O. The
ranks and each rank's steps are kept in persistent maps, so recording a step
costs the same in a rank of ten steps as in one of ten thousand, in a fold
of one rank as in a merged fold of a thousand.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ._builders import builder, replacer
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
from ._persistent_map import PersistentMap

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
    """The steps of one rank, in the order they started.

    :class:`Timeline` keeps ``steps`` in a read-only mapping that shares its
    storage with the rank's earlier states; any mapping may be given.
    """

    rank: int
    start_wall_ns: int | None = None
    start_mono_ns: int | None = None
    end_wall_ns: int | None = None
    duration_ns: int | None = None
    outcome: RunOutcome | None = None
    steps: Mapping[str, StepTiming] = attrs.field(factory=PersistentMap)


@attrs.frozen(kw_only=True)
class TimelineState:
    """Every rank's timeline, by rank."""

    ranks: Mapping[int, RankTimeline] = attrs.field(factory=PersistentMap)

    def steps(self) -> tuple[StepTiming, ...]:
        """All step timings, by rank then start order."""
        return tuple(
            timing for rank in sorted(self.ranks) for timing in self.ranks[rank].steps.values()
        )


# apply() runs once per event of every replay: the state it returns is built
# directly, without attrs' keyword parsing (see events._builders). The
# argument order is spelled out, so a change to the classes fails at import.
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
_with_steps = replacer(RankTimeline, "steps")
_state = builder(TimelineState, ("ranks",))


class Timeline:
    """Projection: :class:`TimelineState` from any stream of events."""

    def initial(self) -> TimelineState:
        """No ranks yet."""
        return TimelineState()

    def apply(self, state: TimelineState, event: Event) -> TimelineState:
        """Record starts and ends; other events leave the state as it is."""
        ranks = state.ranks
        if type(ranks) is not PersistentMap:
            ranks = PersistentMap(ranks)
        rank = ranks.get(event.rank)
        if isinstance(event, StepStarted):
            timing = _timing(
                event.rank, event.step, event.kind, event.wall_ns, event.mono_ns,
                event.depends_on, None, None, None,
            )  # fmt: skip
            if rank is None:
                steps = PersistentMap(((event.step, timing),))
                rank = _rank(event.rank, None, None, None, None, None, steps)
            else:
                rank = _with_steps(rank, _persistent(rank.steps).set(event.step, timing))
        elif isinstance(event, TERMINAL_STEP_EVENTS):
            if rank is None:
                return state
            steps = _persistent(rank.steps)
            started = steps.get(event.step)
            if started is None or started.outcome is not None:
                return state  # never started, or ended already: terminal states are final
            timing = _timing(
                started.rank, started.step, started.kind, started.start_wall_ns,
                started.start_mono_ns, started.depends_on, event.wall_ns,
                event.mono_ns - started.start_mono_ns, outcome_of(event),
            )  # fmt: skip
            rank = _with_steps(rank, steps.set(event.step, timing))
        elif isinstance(event, RunStarted):
            if rank is None:
                rank = RankTimeline(rank=event.rank)
            rank = _rank(
                rank.rank, event.wall_ns, event.mono_ns, rank.end_wall_ns, rank.duration_ns,
                rank.outcome, rank.steps,
            )  # fmt: skip
        elif isinstance(event, RunFinished):
            if rank is None:
                rank = RankTimeline(rank=event.rank)
            start = rank.start_mono_ns
            rank = _rank(
                rank.rank, rank.start_wall_ns, start, event.wall_ns,
                None if start is None else event.mono_ns - start, event.outcome, rank.steps,
            )  # fmt: skip
        else:
            return state
        return _state(ranks.set(event.rank, rank))


def _persistent(steps: Mapping[str, StepTiming]) -> PersistentMap[str, StepTiming]:
    return steps if type(steps) is PersistentMap else PersistentMap(steps)
