"""The fast paths of replay give what the straightforward fold gives.

:func:`events.replay` folds each rank's whole stream through each
projection's ``apply_many`` and builds the run from the ranks' results; the
reference here folds the merged run through a :class:`events.Composite`, one
event at a time through each projection's ``apply``, as the projections
define it. For varied runs (any events, several ranks, interleaved), the
states, messages, timeline, root cause, divergences and the report text are
the same, with the kernel's generic meaning and with a slice of rules,
facts, agreements and a message hook (the engine's slice is held against
the fold in the engine's tests).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import events
from events import (
    Agreement,
    Collective,
    Column,
    JsonValue,
    Loss,
    MessageRule,
    Outcome,
    RunFinished,
    RunOutcome,
    Scope,
    Severity,
    Slice,
    StepKind,
    StepSucceeded,
    outcome_of,
)
from events.testing import EventStream, exception_info

from .equivalence import (
    PROPERTY,
    assert_projections_fold_as_they_apply,
    assert_replay_is_the_fold,
    runs,
)


def _facts(facts: Mapping[str, JsonValue], event: events.Event) -> Mapping[str, JsonValue] | None:
    """The slice's facts hook: the last step that ended ok, whether any
    step failed, and what a ``kernels`` step selected."""
    outcome = outcome_of(event)
    if outcome is None:
        return None
    if isinstance(event, StepSucceeded):
        changed: dict[str, JsonValue] = {"last_ok": event.step}
        if event.step == "kernels" and isinstance(event.result, dict):
            changed["kernels"] = event.result.get("selected")
        return changed
    if outcome is Outcome.FAILED:
        return {"failed": True}
    return None


class _NotOkHook:
    """A message hook with memory: it counts the steps that ended other than
    ok and says so when the rank finishes; it speaks for timeouts and
    crashes of steps under ``w``."""

    def initial(self) -> int:
        return 0

    def covers_stop(self, step: str, started: events.StepStarted | None) -> bool:
        return step.startswith("w")

    def before(self, context: Any, memory: int) -> int:
        event = context.event
        if isinstance(event, RunFinished) and memory:
            context.emit(
                "mine.not_ok",
                f"{memory} steps did not end ok",
                step="",
                args=(str(memory),),
                seqs=(event.seq,),
            )
        return memory

    def after(self, context: Any, memory: int) -> int:
        outcome = outcome_of(context.event)
        if outcome is None or outcome is Outcome.OK:
            return memory
        if outcome is Outcome.FAILED and context.originated:
            context.raise_severity(context.event.step, context.severity("mine.not_ok"))
        return memory + 1


#: A slice of the tests' own, with something of every kind a slice declares.
MINE = Slice(
    name="mine",
    steps=("k*", "kernels/*"),
    rules=[
        MessageRule(
            code="mine.unavailable",
            step="*",
            outcomes=("unavailable", "absent", "invalid"),
            severity=Severity.WARNING,
            scope=Scope.LOCAL,
            text="{name} is {outcome}: {reason}",
        ),
        MessageRule(
            code="mine.a_failed",
            step="a*",
            severity=Severity.ERROR,
            text="{step} failed: {error}",
            args=("{step}",),
        ),
        MessageRule(code="mine.os_error", step="*", exception="OSError", text="{error}"),
        MessageRule(code="mine.kernels", step="kernels", outcomes="ok", text="{result[selected]}"),
    ],
    severities={
        "mine.not_ok": (Severity.WARNING, Scope.GLOBAL),
        "mine.divergence": (Severity.ERROR, Scope.GLOBAL),
    },
    facts={"last_ok": None, "kernels": None, "failed": False},
    columns=[
        Column(title="LAST OK", fact="last_ok"),
        Column(title="KERNELS", fact="kernels"),
        Column(title="FAILED", fact="failed", labels={True: "yes", False: "no"}),
    ],
    agreements=[
        Agreement(code="mine.divergence", fact="kernels", what="Kernels differ", advice="pin"),
    ],
    losses=[Loss(fact="failed", what="something failed")],
    collectives=[Collective(step="exchange", what="the exchange")],
    derive_facts=_facts,
    messages=_NotOkHook(),
)


def _slices(sliced: bool) -> tuple[events.Slice, ...]:
    return (MINE,) if sliced else ()


@PROPERTY
@given(run=runs(), sliced=st.booleans())
@pytest.mark.slow
def test_each_projection_folds_a_stream_as_its_apply_does(
    run: list[list[events.Event]], sliced: bool
) -> None:
    assert_projections_fold_as_they_apply(run, _slices(sliced))


@PROPERTY
@given(run=runs(), sliced=st.booleans())
@pytest.mark.slow
def test_replay_is_the_one_event_at_a_time_fold(
    run: list[list[events.Event]], sliced: bool
) -> None:
    assert_replay_is_the_fold(run, _slices(sliced))


@PROPERTY
@given(run=runs(), sliced=st.booleans(), until=st.none() | st.integers(0, 6))
@pytest.mark.slow
def test_ranks_folded_apart_and_sent_on_replay_as_their_events(
    run: list[list[events.Event]], sliced: bool, until: int | None
) -> None:
    # Each rank folded where its log is, pickled as a worker sends it, then
    # judged together: the run its events replay to.
    folder = events.RankFolder(_slices(sliced), until)
    folded = [
        pickle.loads(pickle.dumps(folder.fold(stream)))
        for stream in run
        if any(until is None or event.seq <= until for event in stream)
    ]

    assert events.replay(folded, slices=_slices(sliced), until=until) == events.replay(
        run, slices=_slices(sliced), until=until
    )


def test_a_folded_rank_is_judged_only_as_it_was_folded() -> None:
    stream = _rank(0).run_finished()
    folded = events.RankFolder([MINE], until=3).fold(stream)

    with pytest.raises(ValueError, match=r"folded with slices \['mine'\] to 3, not \[\] to 3"):
        events.replay([folded], until=3)
    with pytest.raises(ValueError, match=r"not \['mine'\] to None"):
        events.replay([folded], slices=[MINE])
    with pytest.raises(events.LogError, match="two logs for rank 0"):
        events.replay([folded, stream[:2]], slices=[MINE], until=3)
    with pytest.raises(ValueError, match=r"events of ranks \[0, 1\]"):
        events.RankFolder().fold([*stream[:1], *_rank(1).run_finished()[:1]])
    with pytest.raises(ValueError, match="no events to fold"):
        events.RankFolder(until=-1).fold(stream)


def _rank(rank: int, *, world_size: int = 64, kernels: str = "fast") -> EventStream:
    """A rank of a graph of its own, ``run.started`` written, up to its
    ``kernels`` choice: ``exchange`` joined, ``kernels/fast`` ok or
    unavailable, ``kernels/slow`` ok."""
    stream = EventStream(
        run_id="run-big", rank=rank, world_size=world_size, local_world_size=8
    ).run_started()
    stream.started("exchange")
    stream.succeeded("exchange")
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    if kernels == "fast":
        stream.succeeded("kernels/fast", {"candidate": "fast"})
    else:
        stream.unavailable("kernels/fast", cause=exception_info("OSError", "no libfast.so"))
    stream.succeeded("kernels/slow", {"candidate": "slow"})
    stream.decision("candidates.select", kernels, step="kernels")
    return stream.succeeded("kernels", {"selected": kernels})


def _ready_rank(rank: int, **options: Any) -> list[events.Event]:
    stream = _rank(rank, **options)
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": True})
    stream.timed_out("warmup/graph", timeout_s=2.0)
    stream.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    stream.succeeded("warmup/eager")
    stream.succeeded("warmup")
    return stream.run_finished()


def _failed_rank(rank: int) -> list[events.Event]:
    """``apply`` fails with a chained cause, and the run with it."""
    boom = exception_info("RuntimeError", "boom", cause=exception_info("my_lib.Error", "full"))
    stream = _rank(rank, kernels="slow")
    stream.started("apply")
    stream.failed("apply", boom)
    return stream.run_finished(RunOutcome.FAILED, cause=boom, failed_step="apply")


def _dead_rank(rank: int) -> list[events.Event]:
    """Killed while its warmup attempts ran: no ``run.finished``."""
    stream = _rank(rank)
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT)
    return stream.events


def _large_runs() -> dict[str, list[list[events.Event]]]:
    """Runs of 64 ranks: all ready (one with other kernels), one failed (and
    one that died), a node of eight missing."""
    ready = [_ready_rank(rank) for rank in range(64)]
    ready[9] = _ready_rank(9, kernels="slow")
    failed = list(ready)
    failed[5] = _failed_rank(5)
    failed[40] = _dead_rank(40)
    return {
        "ready": ready,
        "failed": failed,
        "node-missing": [s for rank, s in enumerate(ready) if not 16 <= rank < 24],
    }


def test_replay_of_large_runs_is_the_one_event_at_a_time_fold() -> None:
    for name, run in _large_runs().items():
        for slices in ((), (MINE,)):
            assert_replay_is_the_fold(run, slices, name=f"{name} {[s.name for s in slices]}")
