"""What the replay-equivalence tests share: runs of any events, and a replay
held against the straightforward fold.

:func:`events.replay` folds each rank's whole stream through each
projection's ``apply_many`` and builds the run from the ranks' results; the
reference folds the merged run through a :class:`events.Composite`, one
event at a time through each projection's ``apply``, as the projections
define it. The kernel's ``test_replay_equivalence.py`` here and the engine's
own, with its slice, both hold replay against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import events
from events import Composite, Messages, RankStates, Timeline, find_divergences, merge, replay

from .strategies import streams

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def runs(draw: st.DrawFn) -> list[list[events.Event]]:
    """One to four ranks of one run, each a stream of any events up to its
    first ``run.finished`` (a finished rank writes nothing more: replay
    refuses a log that goes on)."""
    count = draw(st.integers(1, 4))
    ranks = draw(st.lists(st.integers(0, 7), min_size=count, max_size=count, unique=True))
    run: list[list[events.Event]] = []
    for rank in ranks:
        stream = [attrs.evolve(e, run_id="run", rank=rank) for e in draw(streams(max_size=10))]
        end = next((i for i, e in enumerate(stream) if isinstance(e, events.RunFinished)), None)
        run.append(stream if end is None else stream[: end + 1])
    return run


def apply_one_by_one(projection: Any, stream: Sequence[events.Event]) -> Any:
    """``projection`` folded over ``stream`` through its ``apply``, one event
    at a time."""
    state = projection.initial()
    for event in stream:
        state = projection.apply(state, event)
    return state


def assert_projections_fold_as_they_apply(
    run: Sequence[Sequence[events.Event]], slices: tuple[events.Slice, ...]
) -> None:
    """Each projection's fold of the merged ``run`` is its one-by-one apply."""
    merged = list(merge(run))
    projections: tuple[Any, ...] = (RankStates(slices), Messages(slices=slices), Timeline())
    for projection in projections:
        assert events.fold(projection, merged) == apply_one_by_one(projection, merged)


def assert_replay_is_the_fold(
    run: Sequence[Sequence[events.Event]], slices: tuple[events.Slice, ...], name: str = ""
) -> None:
    """Replay of ``run`` under ``slices`` gives the states, messages,
    timeline, divergences, root cause and report (text and JSON) of the
    one-event-at-a-time fold of the merged run (``name`` labels a failure)."""
    from exporters import report_json, report_text

    result = replay([list(stream) for stream in run], slices=slices)
    composite: Composite[Any] = Composite(
        states=RankStates(slices), messages=Messages(slices=slices), timeline=Timeline()
    )
    reference = apply_one_by_one(composite, list(merge(run)))

    assert result.states == reference["states"], name
    assert result.messages == reference["messages"].messages(), name
    assert dict(result.message_state.ranks) == dict(reference["messages"].ranks), name
    assert dict(result.timeline.ranks) == dict(reference["timeline"].ranks), name
    assert result.divergences == find_divergences(reference["states"], slices=slices), name
    straightforward = attrs.evolve(
        result,
        states=reference["states"],
        message_state=reference["messages"],
        messages=reference["messages"].messages(),
        timeline=reference["timeline"],
    )
    assert report_text(result) == report_text(straightforward), name
    assert report_json(result) == report_json(straightforward), name
    if not result.no_events:
        assert result.root_cause == events.root_cause(reference["states"]), name
