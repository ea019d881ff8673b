"""fold, Composite and the Timeline projection."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import events
from events import (
    Composite,
    FoldError,
    Outcome,
    RankTimeline,
    RunOutcome,
    StepKind,
    StepTiming,
    Timeline,
    TimelineState,
)
from events.testing import EventStream

from .samples import PERMISSION_DENIED, rank_stream


class Count:
    """Counts events per type: a second, trivial projection."""

    def initial(self) -> dict[str, int]:
        return {}

    def apply(self, state: dict[str, int], event: events.Event) -> dict[str, int]:
        return {**state, event.TYPE: state.get(event.TYPE, 0) + 1}

    def apply_many(self, state: dict[str, int], stream: Iterable[events.Event]) -> dict[str, int]:
        for event in stream:
            state = self.apply(state, event)
        return state


def once(stream: list[events.Event]) -> Iterator[events.Event]:
    """An iterator that can be consumed once, like a live stream."""
    yield from stream


# --- fold --------------------------------------------------------------------------------


def test_fold_of_nothing_is_the_initial_state() -> None:
    assert events.fold(Timeline(), []) == TimelineState()
    assert events.fold(Count(), [], {"x": 1}) == {"x": 1}


@pytest.mark.parametrize(
    ("order", "expected", "found"),
    [
        ([0, 1, 3], 2, 3),  # gap
        ([0, 2, 1], 1, 2),  # reorder
        ([0, 1, 1], 2, 1),  # repeat
        ([1, 2], 0, 1),  # does not start at 0
    ],
)
def test_fold_rejects_out_of_order_streams(order: list[int], expected: int, found: int) -> None:
    stream = rank_stream("run-1", 2)
    with pytest.raises(FoldError) as caught:
        events.fold(Count(), [stream[seq] for seq in order])
    error = caught.value
    assert (error.run_id, error.rank, error.expected, error.found) == ("run-1", 2, expected, found)
    assert str(error) == (
        f"run 'run-1' rank 2: expected seq {expected}, got {found}; "
        "fold each rank's events in log order (events.merge does)"
    )


def test_fold_checks_each_stream_separately() -> None:
    a = rank_stream("run-1", 0)
    b = rank_stream("run-1", 1)
    interleaved = [event for pair in zip(a, b, strict=True) for event in pair]
    assert events.fold(Count(), interleaved)["step.started"] == 4
    with pytest.raises(FoldError) as caught:
        events.fold(Count(), [a[0], b[0], b[2]])
    assert (caught.value.rank, caught.value.expected, caught.value.found) == (1, 1, 2)


def test_fold_resumes_from_a_saved_state() -> None:
    stream = rank_stream()
    middle = events.fold(Timeline(), stream[:3])
    resumed = events.fold(Timeline(), stream[3:], middle, check_order=False)
    assert resumed == events.fold(Timeline(), stream)
    with pytest.raises(FoldError):
        events.fold(Timeline(), stream[3:], middle)


def test_fold_does_not_modify_earlier_states() -> None:
    stream = rank_stream()
    states = [events.fold(Timeline(), stream[:n]) for n in range(len(stream) + 1)]
    again = [events.fold(Timeline(), stream[:n]) for n in range(len(stream) + 1)]
    assert states == again
    assert states[2].ranks[0].steps.keys() == {"platform"}


# --- Composite ---------------------------------------------------------------------------


def test_composite_folds_several_projections_in_one_pass() -> None:
    stream = rank_stream()
    both = Composite(timeline=Timeline(), count=Count())
    assert both.names == ("timeline", "count")
    state = events.fold(both, once(stream))
    assert set(state) == {"timeline", "count"}
    assert state["timeline"] == events.fold(Timeline(), stream)
    assert state["count"] == {
        "run.started": 1,
        "step.started": 2,
        "step.succeeded": 1,
        "step.unavailable": 1,
        "decision.made": 1,
        "run.finished": 1,
    }
    assert both.initial() == {"timeline": TimelineState(), "count": {}}


def test_composite_needs_a_projection() -> None:
    with pytest.raises(ValueError, match="at least one projection"):
        Composite()


# --- Timeline ----------------------------------------------------------------------------


def test_timeline_records_each_step() -> None:
    stream = rank_stream("run-1", 0, wall_ns=1_000)
    started, platform, flash, _ok, unavailable, decision, finished = stream
    state = events.fold(Timeline(), stream)
    rank = state.ranks[0]
    assert rank == RankTimeline(
        rank=0,
        started=started,
        finished=finished,
        last=finished,
        decisions=(decision,),
        steps={
            "platform": StepTiming(
                rank=0,
                step="platform",
                kind=StepKind.STEP,
                start_wall_ns=1_010,
                start_mono_ns=100,
                span_id=platform.span_id,
                parent_span_id=started.span_id,
                end_wall_ns=1_030,
                duration_ns=200,
                outcome=Outcome.OK,
                result={"n": 1},
            ),
            "attention/flashinfer": StepTiming(
                rank=0,
                step="attention/flashinfer",
                kind=StepKind.CANDIDATE,
                start_wall_ns=1_020,
                start_mono_ns=200,
                depends_on=("platform",),
                span_id=flash.span_id,
                parent_span_id=started.span_id,
                end_wall_ns=1_040,
                duration_ns=200,
                outcome=Outcome.UNAVAILABLE,
                end=unavailable,
            ),
        },
    )
    # The rank's times and outcome, read from its run events.
    assert (rank.start_wall_ns, rank.end_wall_ns, rank.duration_ns) == (1_000, 1_060, 600)
    assert rank.outcome is RunOutcome.READY
    assert [timing.step for timing in state.steps()] == ["platform", "attention/flashinfer"]
    assert all(timing.finished for timing in state.steps())


def _tree(timeline: RankTimeline) -> list[tuple[int, bool, str]]:
    return [(depth, last, timing.step) for depth, last, timing in timeline.tree()]


def test_a_ranks_steps_as_a_tree_nest_by_span_in_start_order() -> None:
    stream = EventStream().run_started()
    stream.started("platform").started("platform/cuda").started("platform/rocm")
    stream.started("attention", parent="")
    events_ = stream.run_finished()
    state = events.fold(Timeline(), events_)
    assert _tree(state.ranks[0]) == [
        (0, False, "platform"),
        (1, False, "platform/cuda"),
        (1, True, "platform/rocm"),
        (0, True, "attention"),
    ]


def test_a_tree_of_spans_that_make_no_tree_shows_every_step_once() -> None:
    stream = EventStream().run_started()
    stream.started("a").started("a/b")
    records = stream.run_finished()
    a, b = (e for e in records if isinstance(e, events.StepStarted))
    # a's parent is b, b's is a: neither is reached from the top.
    cycle = [attrs.evolve(a, parent_span_id=b.span_id) if e is a else e for e in records]
    state = events.fold(Timeline(), cycle)
    assert _tree(state.ranks[0]) == [(0, False, "a"), (1, True, "a/b")]
    # A parent no step of the log has: at the top.
    lost = [attrs.evolve(b, parent_span_id="f" * 16) if e is b else e for e in records]
    assert _tree(events.fold(Timeline(), lost).ranks[0]) == [
        (0, False, "a"),
        (0, True, "a/b"),
    ]


def test_the_ranks_of_a_timeline_share_equal_results() -> None:
    timeline = Timeline()
    state = events.fold(timeline, [*rank_stream(rank=0), *rank_stream(rank=1)], check_order=False)
    first, second = (state.ranks[rank].steps["platform"].result for rank in (0, 1))
    assert first == second == {"n": 1}
    assert first is second
    # Equal, but with its keys in another order: a result of its own.
    other = events.StepSucceeded(**envelope(7, step="platform", rank=2), result={"b": 1, "a": 2})
    again = events.StepSucceeded(**envelope(7, step="platform", rank=3), result={"a": 2, "b": 1})
    for result in (other, again):
        start = events.StepStarted(**envelope(6, step="platform", rank=result.rank))
        state = timeline.apply_many(state, [start, result])
    assert list(state.ranks[3].steps["platform"].result) == ["a", "b"]


def test_timeline_while_running() -> None:
    stream = rank_stream()
    state = events.fold(Timeline(), stream[:3])
    rank = state.ranks[0]
    assert rank.outcome is None
    assert rank.end_wall_ns is None
    assert rank.duration_ns is None
    flash = rank.steps["attention/flashinfer"]
    assert flash.finished is False
    assert (flash.end_wall_ns, flash.duration_ns, flash.outcome) == (None, None, None)


def test_a_stall_is_a_ranks_last_sign_of_life() -> None:
    stream = EventStream().run_started().started("load").advance(10**9).stalled("load")
    *_, stall = stream.events
    rank = events.fold(Timeline(), stream.events).ranks[0]
    assert rank.last == stall
    assert rank.steps["load"].stall == stall
    assert rank.steps["load"].finished is False


def envelope(seq: int, step: str = "s", rank: int = 0) -> dict[str, object]:
    return {
        "run_id": "r",
        "rank": rank,
        "seq": seq,
        "wall_ns": seq,
        "mono_ns": 10 * seq,
        "step": step,
    }


@pytest.mark.parametrize(
    ("terminal", "outcome"),
    [
        (events.StepSucceeded(**envelope(1)), Outcome.OK),
        (
            events.StepUnavailable(**envelope(1), outcome=Outcome.ABSENT),
            Outcome.ABSENT,
        ),
        (events.StepUnavailable(**envelope(1), outcome=Outcome.INVALID), Outcome.INVALID),
        (events.StepFailed(**envelope(1), cause=PERMISSION_DENIED), Outcome.FAILED),
        (events.StepTimedOut(**envelope(1), timeout_s=1.5, elapsed_ns=9), Outcome.TIMED_OUT),
        (events.StepCancelled(**envelope(1), reason="sibling failed"), Outcome.CANCELLED),
        (events.StepCrashed(**envelope(1), exit_code=-11, signal=11), Outcome.CRASHED),
    ],
)
def test_timeline_outcome_of_every_terminal_event(terminal: events.Event, outcome: Outcome) -> None:
    assert events.outcome_of(terminal) is outcome
    state = events.fold(Timeline(), [events.StepStarted(**envelope(0)), terminal])
    timing = state.ranks[0].steps["s"]
    assert timing.outcome is outcome
    assert timing.duration_ns == 10
    assert timing.end_wall_ns == 1


def test_terminal_states_are_final_and_orphans_ignored() -> None:
    stream = [
        events.StepStarted(**envelope(0)),
        events.StepSucceeded(**envelope(1)),
        events.StepFailed(**envelope(2), cause=PERMISSION_DENIED),
        events.StepCancelled(**envelope(3, step="never-started")),
    ]
    state = events.fold(Timeline(), stream)
    steps = state.ranks[0].steps
    assert steps.keys() == {"s"}
    assert steps["s"].outcome is Outcome.OK
    assert steps["s"].duration_ns == 10


def test_a_rank_is_recorded_from_its_run_finished_but_not_from_a_decision() -> None:
    *_, decision, finished = rank_stream("run-1", 0)
    decision = attrs.evolve(decision, seq=0)
    finished = attrs.evolve(finished, seq=1)
    state = events.fold(Timeline(), [decision, finished])
    assert state.ranks == {0: RankTimeline(rank=0, finished=finished, last=finished)}
    assert events.fold(Timeline(), [decision]).ranks == {}


def test_timeline_run_outcomes_per_rank() -> None:
    failed = [
        *rank_stream("run-1", 1)[:-1],
        events.RunFinished(
            run_id="run-1",
            rank=1,
            seq=6,
            wall_ns=5_000,
            mono_ns=900,
            outcome=RunOutcome.FAILED,
            cause=PERMISSION_DENIED,
            failed_step="attention/flashinfer",
        ),
    ]
    unfinished = rank_stream("run-1", 2)[:3]
    state = events.fold(Timeline(), events.merge([rank_stream("run-1", 0), failed, unfinished]))
    assert state.ranks[0].outcome is RunOutcome.READY
    assert state.ranks[1].outcome is RunOutcome.FAILED
    assert state.ranks[1].duration_ns == 900
    assert state.ranks[1].end_wall_ns == 5_000
    assert state.ranks[2].outcome is None
    assert [timing.rank for timing in state.steps()] == [0, 0, 1, 1, 2, 2]


def test_unhandled_events_share_the_state() -> None:
    start = events.fold(Timeline(), rank_stream()[:5])
    decision = rank_stream(rank=1)[5]  # of a rank not yet seen
    assert Timeline().apply(start, decision) is start
    # A rank whose first event the timeline ignores is not added.
    lone = attrs.evolve(decision, rank=9)
    assert Timeline().apply(start, lone) is start


def test_outcome_of_non_terminal_events() -> None:
    for event in rank_stream():
        if not isinstance(event, events.TERMINAL_STEP_EVENTS):
            assert events.outcome_of(event) is None


def test_timeline_of_many_steps_keeps_every_earlier_state() -> None:
    # Past a hundred or so steps a rank's steps leave the copied dict for a
    # shared journal; every state must still see exactly its own steps.
    count = 400
    stream: list[events.Event] = [
        events.StepStarted(**envelope(seq, step=f"s{seq}")) for seq in range(count)
    ]
    stream += [
        events.StepSucceeded(**envelope(count + position, step=f"s{index}"))
        for position, index in enumerate(range(0, count, 2))
    ]
    timeline = Timeline()
    states = [timeline.initial()]
    for event in stream:
        states.append(timeline.apply(states[-1], event))
    for seen, state in enumerate(states):
        steps = state.ranks[0].steps if seen else {}
        started = min(seen, count)
        ended = max(seen - count, 0)
        assert list(steps) == [f"s{index}" for index in range(started)]
        assert sum(timing.finished for timing in steps.values()) == ended
    final = states[-1].ranks[0].steps
    assert final["s2"].outcome is Outcome.OK
    assert final["s2"].duration_ns == 10 * (count + 1) - 10 * 2
    assert final["s3"].outcome is None
    # A branch from an early state leaves the later ones as they were.
    branch = timeline.apply(states[10], events.StepSucceeded(**envelope(10, step="s3")))
    assert branch.ranks[0].steps["s3"].finished
    assert not states[11].ranks[0].steps["s3"].finished
    assert not states[-1].ranks[0].steps["s3"].finished


def test_apply_leaves_a_state_of_plain_dicts_alone() -> None:
    started = StepTiming(rank=0, step="a", kind=StepKind.STEP, start_wall_ns=0, start_mono_ns=0)
    steps = {"a": started}
    ranks = {0: RankTimeline(rank=0, steps=steps)}
    state = TimelineState(ranks=ranks)
    timeline = Timeline()
    after = timeline.apply(state, events.StepSucceeded(**envelope(1, step="a")))
    after = timeline.apply(after, events.StepStarted(**envelope(2, step="b")))
    assert steps == {"a": started}
    assert ranks == {0: RankTimeline(rank=0, steps={"a": started})}
    assert after.ranks[0].steps.keys() == {"a", "b"}
    assert after.ranks[0].steps["a"].outcome is Outcome.OK
    assert after == TimelineState(
        ranks={0: RankTimeline(rank=0, last=after.ranks[0].last, steps=dict(after.ranks[0].steps))}
    )


# --- Timeline.apply_many: the fold's path ------------------------------------------------

#: What a drawn stream is made of: small sets of ranks and steps, so that
#: steps start again, end twice or end without starting.
_OPS = st.lists(
    st.tuples(
        st.sampled_from(["started", "succeeded", "failed", "run.started", "run.finished", "other"]),
        st.integers(0, 2),
        st.sampled_from(["a", "b", "c"]),
    ),
    max_size=40,
)


def _stream(ops: list[tuple[str, int, str]]) -> list[events.Event]:
    seqs: dict[int, int] = {}
    out: list[events.Event] = []
    for index, (kind, rank, step) in enumerate(ops):
        seq = seqs[rank] = seqs.get(rank, -1) + 1
        common = {"run_id": "r", "rank": rank, "seq": seq, "wall_ns": index, "mono_ns": 3 * index}
        if kind == "started":
            out.append(events.StepStarted(**common, step=step, depends_on=(step,)))
        elif kind == "succeeded":
            out.append(events.StepSucceeded(**common, step=step))
        elif kind == "failed":
            out.append(events.StepFailed(**common, step=step, cause=PERMISSION_DENIED))
        elif kind == "run.started":
            identity = events.RankIdentity(rank=rank)
            out.append(events.RunStarted(**common, identity=identity, host="h", pid=1))
        elif kind == "run.finished":
            out.append(events.RunFinished(**common, outcome=RunOutcome.READY))
        else:
            out.append(events.DecisionMade(**common, name="n"))
    return out


def _one_by_one(state: TimelineState, stream: list[events.Event]) -> TimelineState:
    timeline = Timeline()
    for event in stream:
        state = timeline.apply(state, event)
    return state


@settings(max_examples=100, deadline=None, derandomize=True)
@given(ops=_OPS, cut=st.integers(0, 40))
def test_fold_builds_the_state_apply_builds(ops: list[tuple[str, int, str]], cut: int) -> None:
    stream = _stream(ops)
    expected = _one_by_one(TimelineState(), stream)
    assert events.fold(Timeline(), stream) == expected
    assert events.fold(Timeline(), once(stream)) == expected
    # Resumed from a saved state, as built by either path.
    middle = _one_by_one(TimelineState(), stream[:cut])
    assert events.fold(Timeline(), stream[:cut]) == middle
    assert events.fold(Timeline(), stream[cut:], middle, check_order=False) == expected
    for timing in expected.steps():
        assert type(timing) is StepTiming


def test_fold_of_ignored_events_returns_the_state_itself() -> None:
    start = events.fold(Timeline(), rank_stream()[:5])
    # A decision of a rank that has not started: nothing to record it on.
    decision = rank_stream(rank=1)[5]
    assert events.fold(Timeline(), [decision], start, check_order=False) is start


def test_fold_leaves_a_state_of_plain_dicts_alone() -> None:
    started = StepTiming(rank=0, step="a", kind=StepKind.STEP, start_wall_ns=0, start_mono_ns=0)
    steps = {"a": started}
    state = TimelineState(ranks={0: RankTimeline(rank=0, steps=steps)})
    stream = [
        events.StepSucceeded(**envelope(1, step="a")),
        events.StepStarted(**envelope(2, step="b")),
    ]
    after = events.fold(Timeline(), stream, state, check_order=False)
    assert steps == {"a": started}
    assert after == _one_by_one(state, stream)
    assert after.ranks[0].steps["a"].outcome is Outcome.OK


def test_fold_through_apply_many_checks_the_order() -> None:
    stream = rank_stream()
    with pytest.raises(FoldError):
        events.fold(Timeline(), [stream[0], stream[2]])


def test_a_timeline_shares_a_bounded_number_of_results() -> None:
    from events._timeline import _SHARED_RESULTS

    timeline = Timeline()
    stream: list[events.Event] = []
    # Each rank returns a result of its own: each is kept once, to the bound.
    for rank in range(_SHARED_RESULTS + 10):
        start = events.StepStarted(**envelope(0, step="s", rank=rank))
        ok = events.StepSucceeded(**envelope(1, step="s", rank=rank), result={"device": rank})
        stream += [start, ok]
    state = events.fold(timeline, stream, check_order=False)
    assert len(timeline._results) == _SHARED_RESULTS
    assert state.ranks[_SHARED_RESULTS + 5].steps["s"].result == {"device": _SHARED_RESULTS + 5}
    # One seen before the bound is still shared.
    again = events.StepSucceeded(**envelope(1, step="s", rank=9999), result={"device": 3})
    state = timeline.apply_many(
        state, [events.StepStarted(**envelope(0, step="s", rank=9999)), again]
    )
    assert state.ranks[9999].steps["s"].result is state.ranks[3].steps["s"].result
