"""The fast paths of replay give what the straightforward fold gives.

:func:`events.replay` folds each rank's whole stream through each
projection's ``apply_many`` and builds the run from the ranks' results; the
reference here folds the merged run through a :class:`events.Composite`, one
event at a time through each projection's ``apply``, as the projections
define it. For varied runs (any events, several ranks, interleaved), the
states, messages, timeline, root cause, divergences and the report text are
the same, with the kernel's generic meaning and with the engine's slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
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


def _slices(engine: bool) -> tuple[events.Slice, ...]:
    if not engine:
        return ()
    from orchestrator.engine import ENGINE

    return (ENGINE,)


def _apply_one_by_one(projection: Any, stream: Sequence[events.Event]) -> Any:
    state = projection.initial()
    for event in stream:
        state = projection.apply(state, event)
    return state


@PROPERTY
@given(run=runs(), engine=st.booleans())
@pytest.mark.slow
def test_each_projection_folds_a_stream_as_its_apply_does(
    run: list[list[events.Event]], engine: bool
) -> None:
    slices = _slices(engine)
    merged = list(merge(run))
    for projection in (RankStates(slices), Messages(slices=slices), Timeline()):
        assert events.fold(projection, merged) == _apply_one_by_one(projection, merged)


@PROPERTY
@given(run=runs(), engine=st.booleans())
@pytest.mark.slow
def test_replay_is_the_one_event_at_a_time_fold(
    run: list[list[events.Event]], engine: bool
) -> None:
    from exporters import report_json, report_text

    slices = _slices(engine)
    result = replay(run, slices=slices)
    composite: Composite[Any] = Composite(
        states=RankStates(slices), messages=Messages(slices=slices), timeline=Timeline()
    )
    reference = _apply_one_by_one(composite, list(merge(run)))

    assert result.states == reference["states"]
    assert result.messages == reference["messages"].messages()
    assert dict(result.message_state.ranks) == dict(reference["messages"].ranks)
    assert dict(result.timeline.ranks) == dict(reference["timeline"].ranks)
    assert result.divergences == find_divergences(reference["states"], slices=slices)
    straightforward = attrs.evolve(
        result,
        states=reference["states"],
        message_state=reference["messages"],
        messages=reference["messages"].messages(),
        timeline=reference["timeline"],
    )
    assert report_text(result) == report_text(straightforward)
    assert report_json(result) == report_json(straightforward)
    if not result.no_events:
        assert result.root_cause == events.root_cause(reference["states"])


def _engine_runs() -> dict[str, list[list[events.Event]]]:
    """Engine runs of 64 ranks: all ready, one failed (and one that died),
    a node of eight missing."""
    from tests.orchestrator.engine.streams import dead_rank, failed_rank, healthy_rank

    healthy = [healthy_rank(rank, world_size=64) for rank in range(64)]
    failed = list(healthy)
    failed[5] = failed_rank(5, offset_ns=3)
    failed[40] = dead_rank(40, offset_ns=9, world_size=64)
    return {
        "ready": healthy,
        "failed": failed,
        "node-missing": [s for rank, s in enumerate(healthy) if not 16 <= rank < 24],
    }


def test_replay_of_engine_runs_is_the_one_event_at_a_time_fold() -> None:
    from exporters import report_json, report_text
    from orchestrator.engine import ENGINE

    for name, run in _engine_runs().items():
        result = replay(run, slices=(ENGINE,))
        composite: Composite[Any] = Composite(
            states=RankStates((ENGINE,)), messages=Messages(slices=(ENGINE,)), timeline=Timeline()
        )
        reference = _apply_one_by_one(composite, list(merge(run)))
        assert result.states == reference["states"], name
        assert result.messages == reference["messages"].messages(), name
        assert dict(result.timeline.ranks) == dict(reference["timeline"].ranks), name
        straightforward = attrs.evolve(
            result,
            states=reference["states"],
            message_state=reference["messages"],
            messages=reference["messages"].messages(),
            timeline=reference["timeline"],
        )
        assert report_text(result) == report_text(straightforward), name
        assert report_json(result) == report_json(straightforward), name
