"""Reducers: pure folds of an event stream into frozen state.

A reducer never mutates the state it is given and never does I/O. The live
run and replay use the very same projections, which is why they cannot
disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

from ._errors import FoldError
from ._model import (
    TERMINAL_STEP_EVENTS,
    DecisionMade,
    Event,
    RunFinished,
    RunStarted,
    StepStalled,
    StepStarted,
    StepSucceeded,
)

__all__ = ["Composite", "Projection", "Reducer", "fold"]

S = TypeVar("S")

#: A pure function from a state and an event to the next state.
Reducer = Callable[[S, Event], S]


class Projection(Protocol[S]):
    """A named view of the log: an initial state and a pure reducer."""

    def initial(self) -> S:
        """The state before any event."""
        ...

    def apply(self, state: S, event: Event) -> S:
        """The state after ``event``; must not modify ``state``. The same as
        ``apply_many(state, (event,))``, which is what a projection that
        subclasses this protocol inherits."""
        return self.apply_many(state, (event,))

    def apply_many(self, state: S, events: Iterable[Event]) -> S:
        """The state after every event of ``events`` in turn (what
        :func:`fold` calls, with the whole stream); must not modify
        ``state``. Intermediate states nobody sees need not be built."""
        ...


def fold(
    projection: Projection[S],
    events: Iterable[Event],
    state: S | None = None,
    *,
    check_order: bool = True,
) -> S:
    """Fold ``events`` through ``projection``, from ``state`` (default: the
    projection's initial state).

    With ``check_order`` every (run, rank) stream in ``events`` must start at
    ``seq`` 0 and go up by one; pass ``check_order=False`` to resume a fold
    from a saved ``state`` mid-stream. The projection's ``apply_many`` is
    handed the whole stream at once.

    Raises:
        FoldError: a stream skips, repeats or reorders events.
    """
    current = projection.initial() if state is None else state
    return projection.apply_many(current, _in_order(events) if check_order else events)


def _in_order(events: Iterable[Event]) -> Iterator[Event]:
    # The stream of the previous event is kept aside, so a run of events of
    # one stream (a whole rank's log) costs a comparison each, not a lookup.
    expected: dict[tuple[str, int], int] = {}
    run_id: str | None = None
    rank = 0
    want = 0
    for event in events:
        if event.rank != rank or event.run_id != run_id:
            if run_id is not None:
                expected[run_id, rank] = want
            run_id, rank = event.run_id, event.rank
            want = expected.get((run_id, rank), 0)
        if event.seq != want:
            raise FoldError(event.run_id, event.rank, want, event.seq)
        want += 1
        yield event


class Composite(Projection[Mapping[str, Any]], Generic[S]):
    """Several projections folded together.

    The state is a mapping from each projection's name to its state::

        both = Composite(timeline=Timeline(), messages=Messages())
        state = fold(both, events)
        state["timeline"], state["messages"]
    """

    def __init__(self, **projections: Projection[Any]) -> None:
        if not projections:
            raise ValueError("Composite needs at least one projection")
        self._projections = dict(projections)

    @property
    def names(self) -> tuple[str, ...]:
        """The projections' names, in the order given."""
        return tuple(self._projections)

    def initial(self) -> Mapping[str, Any]:
        """Each projection's initial state, by name."""
        return {name: p.initial() for name, p in self._projections.items()}

    def apply_many(self, state: Mapping[str, Any], events: Iterable[Event]) -> Mapping[str, Any]:
        """Fold ``events`` through every projection; unchanged states are
        shared."""
        stream = events if isinstance(events, list | tuple) else list(events)
        return {name: p.apply_many(state[name], stream) for name, p in self._projections.items()}


# What a fold does with an event, by its kind (ENDED: any terminal step
# event but success): the projections look an event's class up in one table
# (``KINDS[type(event)]``) instead of testing it with isinstance against each
# class they handle, event after event.
STARTED, SUCCEEDED, ENDED, STALLED, DECISION, RUN_STARTED, RUN_FINISHED, OTHER = range(8)


class _Kinds(dict[type[Event], int]):
    """The kind of each event class, the first base that matches deciding;
    found on a class's first lookup, then kept."""

    def __missing__(self, cls: type[Event]) -> int:
        kind = self[cls] = next((found for base, found in _BASES if issubclass(cls, base)), OTHER)
        return kind


_BASES: tuple[tuple[type[Event] | tuple[type[Event], ...], int], ...] = (
    (StepStarted, STARTED),
    (StepSucceeded, SUCCEEDED),
    (TERMINAL_STEP_EVENTS, ENDED),
    (StepStalled, STALLED),
    (DecisionMade, DECISION),
    (RunStarted, RUN_STARTED),
    (RunFinished, RUN_FINISHED),
)


KINDS = _Kinds()
