"""The fast paths of replay give what the straightforward fold gives, with
the engine's slice: for varied runs (any events, several ranks,
interleaved) and for engine runs of 64 ranks, the states, messages,
timeline, root cause, divergences and the report text are those of the
one-event-at-a-time fold (the kernel's own: ``tests/events/test_replay_equivalence.py``).
"""

from __future__ import annotations

import pytest
from hypothesis import given

import events
from orchestrator.engine import ENGINE
from tests.events.equivalence import (
    PROPERTY,
    assert_projections_fold_as_they_apply,
    assert_replay_is_the_fold,
    runs,
)

from .streams import dead_rank, failed_rank, healthy_rank


@PROPERTY
@given(run=runs())
@pytest.mark.slow
def test_each_projection_folds_a_stream_as_its_apply_does_with_the_engine_slice(
    run: list[list[events.Event]],
) -> None:
    assert_projections_fold_as_they_apply(run, (ENGINE,))


@PROPERTY
@given(run=runs())
@pytest.mark.slow
def test_replay_with_the_engine_slice_is_the_one_event_at_a_time_fold(
    run: list[list[events.Event]],
) -> None:
    assert_replay_is_the_fold(run, (ENGINE,))


def _engine_runs() -> dict[str, list[list[events.Event]]]:
    """Engine runs of 64 ranks: all ready, one failed (and one that died),
    a node of eight missing."""
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
    for name, run in _engine_runs().items():
        assert_replay_is_the_fold(run, (ENGINE,), name=name)
