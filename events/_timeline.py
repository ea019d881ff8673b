"""The timeline projection: when and how each step of each rank ran.

The views (the fallback tree, blame, the critical path, the HTML page) read
a run's steps from here, not from its events, so a command can let each
log's events go once it is folded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs
import orjson

from ._builders import builder, field_names
from ._model import (
    DecisionMade,
    Event,
    JsonValue,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepKind,
    StepStalled,
    outcome_of,
)
from ._reducers import (
    DECISION,
    ENDED,
    KINDS,
    RUN_FINISHED,
    RUN_STARTED,
    STALLED,
    STARTED,
    SUCCEEDED,
    Projection,
)

__all__ = ["RankTimeline", "StepTiming", "Timeline", "TimelineState"]


@attrs.frozen(kw_only=True)
class StepTiming:
    """One step of one rank.

    Attributes:
        rank, step, kind: which step.
        start_wall_ns: wall clock at ``step.started``.
        start_mono_ns: monotonic clock at ``step.started``.
        depends_on: the steps it waited for.
        span_id, parent_span_id: its span and its parent's, as its
            ``step.started`` recorded them.
        end_wall_ns, duration_ns: set once the step ended (duration from the
            monotonic clock, immune to wall-clock steps).
        outcome: set once the step ended (the first end: an end is final).
        result: what it returned, if it ended ``ok``.
        end: the event that ended it, if it ended otherwise than ``ok``: its
            reasons, cause, timeout or crash.
        stall: its latest ``step.stalled``: where it was last seen waiting.
    """

    rank: int
    step: str
    kind: StepKind
    start_wall_ns: int
    start_mono_ns: int
    depends_on: tuple[str, ...] = ()
    span_id: str = ""
    parent_span_id: str | None = None
    end_wall_ns: int | None = None
    duration_ns: int | None = None
    outcome: Outcome | None = None
    result: JsonValue = None
    end: Event | None = None
    stall: StepStalled | None = None

    @property
    def finished(self) -> bool:
        """Whether the step has ended."""
        return self.outcome is not None


@attrs.frozen(kw_only=True)
class RankTimeline:
    """One rank's run and its steps, in the order they started.

    Attributes:
        rank: whose.
        started, finished: its ``run.started`` and ``run.finished``, when
            its log has them.
        last: its last event: its last sign of life.
        steps: its steps by name, in the order they started.
        decisions: the decisions it recorded, in order.
    """

    rank: int
    started: RunStarted | None = None
    finished: RunFinished | None = None
    last: Event | None = None
    steps: Mapping[str, StepTiming] = attrs.field(factory=dict)
    decisions: tuple[DecisionMade, ...] = ()

    @property
    def start_wall_ns(self) -> int | None:
        """The wall clock at ``run.started``."""
        return None if self.started is None else self.started.wall_ns

    @property
    def start_mono_ns(self) -> int | None:
        """The monotonic clock at ``run.started``."""
        return None if self.started is None else self.started.mono_ns

    @property
    def end_wall_ns(self) -> int | None:
        """The wall clock at ``run.finished``."""
        return None if self.finished is None else self.finished.wall_ns

    @property
    def duration_ns(self) -> int | None:
        """From ``run.started`` to ``run.finished``, on the monotonic clock."""
        if self.finished is None or self.started is None:
            return None
        return self.finished.mono_ns - self.started.mono_ns

    @property
    def outcome(self) -> RunOutcome | None:
        """How the rank's run ended, if it did."""
        return None if self.finished is None else self.finished.outcome

    def tree(self) -> Iterator[tuple[int, bool, StepTiming]]:
        """Its steps depth first, each under the step whose span is its
        parent (a step whose parent is unknown is at the top), children in
        the order they started: ``(depth, last, timing)``, ``last`` when it
        is the last child of its parent.

        A log is untrusted and its spans may nest thousands deep, share ids
        or form a cycle: the walk takes no recursion, enters each span once,
        and shows every step once, a step no walk from the top reaches at
        depth 0 after the others.
        """
        steps = list(self.steps.values())
        root = self.started.span_id if self.started is not None else None
        known = {timing.span_id for timing in steps}
        children: dict[str | None, list[StepTiming]] = {}
        for timing in steps:
            parent = timing.parent_span_id if timing.parent_span_id in known else root
            children.setdefault(parent, []).append(timing)
        entered = {root}
        shown: set[int] = set()
        pending = [(0, False, timing) for timing in reversed(steps)]
        pending.extend((0, i == 0, t) for i, t in enumerate(reversed(children.get(root, []))))
        while pending:
            depth, last, timing = pending.pop()
            if id(timing) in shown:
                continue
            shown.add(id(timing))
            yield depth, last, timing
            if timing.span_id not in entered:
                entered.add(timing.span_id)
                kids = children.get(timing.span_id, [])
                pending.extend((depth + 1, i == 0, kid) for i, kid in enumerate(reversed(kids)))


@attrs.frozen(kw_only=True)
class TimelineState:
    """Every rank's timeline, by rank."""

    ranks: Mapping[int, RankTimeline] = attrs.field(factory=dict)

    def steps(self) -> tuple[StepTiming, ...]:
        """All step timings, by rank then start order."""
        return tuple(
            timing for rank in sorted(self.ranks) for timing in self.ranks[rank].steps.values()
        )


# A fold builds a timing per step directly, without attrs' keyword parsing
# (see events._builders), from a list of its fields in attrs order.
_STEP_FIELDS = field_names(StepTiming)
_START_MONO, _END_WALL, _DURATION, _OUTCOME, _RESULT, _END, _STALL = map(
    _STEP_FIELDS.index,
    ("start_mono_ns", "end_wall_ns", "duration_ns", "outcome", "result", "end", "stall"),
)
_timing = builder(StepTiming)
_rank = builder(RankTimeline)


class Timeline(Projection[TimelineState]):
    """Projection: :class:`TimelineState` from any stream of events.

    The ranks of a run return the same results from most steps: a timeline
    keeps the first of each equal result (the same JSON) it has seen, up to
    :data:`_SHARED_RESULTS` of them, for as long as it is used, and a later
    timing shares it.
    """

    def __init__(self) -> None:
        self._results: dict[bytes, JsonValue] = {}

    def initial(self) -> TimelineState:
        """No ranks yet."""
        return TimelineState()

    def apply_many(self, state: TimelineState, events: Iterable[Event]) -> TimelineState:
        """The state after every event of ``events`` in turn.

        A rank is recorded from its first ``run.started``, ``step.started``
        or ``run.finished``; its other events before that are left out, as
        is an end or a stall of a step that is not running. When no event is
        recorded, ``state`` itself is returned.
        """
        ranks = state.ranks
        # A changed rank: [started, finished, last, steps, decisions]; a
        # step is a StepTiming (as found in ``state``) or its _STEP_FIELDS.
        working: dict[int, list[Any]] = {}
        kinds = KINDS
        number: int | None = None
        rank: list[Any] = []
        steps: dict[str, Any] = {}
        # Any: the kind table stands for isinstance tests the type checker cannot follow.
        stream: Iterable[Any] = events
        for event in stream:
            kind = kinds[type(event)]
            if event.rank != number:
                number = event.rank
                if (found := working.get(number)) is None:
                    if (previous := ranks.get(number)) is not None:
                        found = [
                            previous.started, previous.finished, previous.last,
                            dict(previous.steps), list(previous.decisions),
                        ]  # fmt: skip
                    elif kind in (STARTED, RUN_STARTED, RUN_FINISHED):
                        found = [None, None, None, {}, []]
                    else:
                        number = None
                        continue
                    working[number] = found
                rank, steps = found, found[3]
            rank[2] = event
            if kind == STARTED:
                steps[event.step] = [
                    number, event.step, event.kind, event.wall_ns, event.mono_ns,
                    event.depends_on, event.span_id, event.parent_span_id,
                    None, None, None, None, None, None,
                ]  # fmt: skip
            elif kind in (SUCCEEDED, ENDED, STALLED):
                if (timing := steps.get(event.step)) is None:
                    continue  # never started
                if type(timing) is not list:
                    timing = steps[event.step] = [getattr(timing, f) for f in _STEP_FIELDS]
                if timing[_OUTCOME] is not None:
                    continue  # ended already: an end is final
                if kind == STALLED:
                    timing[_STALL] = event
                    continue
                timing[_END_WALL] = event.wall_ns
                timing[_DURATION] = event.mono_ns - timing[_START_MONO]
                timing[_OUTCOME] = outcome_of(event)
                if kind == SUCCEEDED:
                    timing[_RESULT] = self._once(event.result)
                else:
                    timing[_END] = event
            elif kind == DECISION:
                rank[4].append(event)
            elif kind == RUN_STARTED:
                rank[0] = event
            elif kind == RUN_FINISHED:
                rank[1] = event
        if not working:
            return state
        merged = dict(ranks)
        for number, (started, finished, last, steps, decisions) in working.items():
            timings = {
                step: _timing(*timing) if type(timing) is list else timing
                for step, timing in steps.items()
            }
            merged[number] = _rank(number, started, finished, last, timings, tuple(decisions))
        return TimelineState(ranks=merged)

    def _once(self, result: JsonValue) -> JsonValue:
        # The equal result (its keys in the same order) seen first.
        if type(result) is not dict and type(result) is not list:
            return result
        try:
            key = orjson.dumps(result)
        except TypeError:  # not JSON (too large a number): not shared
            return result
        if len(self._results) < _SHARED_RESULTS:
            return self._results.setdefault(key, result)
        return self._results.get(key, result)


#: The most distinct results a timeline keeps to share: a run whose ranks
#: return results of their own (a device id in each) is not held twice.
_SHARED_RESULTS = 1024
