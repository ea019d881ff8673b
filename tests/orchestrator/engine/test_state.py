"""Derived engine state per rank, root cause, divergences and replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import (
    Event,
    FoldError,
    LogContents,
    LogError,
    RankStates,
    RunOutcome,
    Severity,
    SeverityPolicy,
    StepKind,
    TornTail,
    find_divergences,
    fold,
    merge,
    replay,
    root_cause,
    step_severity,
)
from orchestrator.engine import (
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    ENGINE,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    EngineState,
)

from .streams import (
    MNNVL_UNSUPPORTED,
    TRTLLM_FAILED,
    ZENTORCH_RUNTIME,
    RankBuilder,
    dead_rank,
    exception,
    failed_rank,
    healthy_rank,
)


def state_of(events: list[Event], rank: int = 0) -> EngineState:
    return fold(RankStates([ENGINE]), events)[rank]


def test_ready_rank() -> None:
    state = state_of(healthy_rank(3), 3)
    assert state.outcome is RunOutcome.READY
    assert state.finished
    assert (state.platform, state.platform_class) == ("cuda", "CudaPlatform")
    assert state.attention_backend == "FLASH_ATTN"
    assert state.flashinfer_comm_available is True
    assert state.fusion_enabled is True
    assert state.allreduce_backend == "trtllm"
    assert state.identity is not None
    assert state.identity.local_rank == 3
    assert state.last_step == "allreduce_workspace"
    assert state.root_cause is None


def test_fusion_disabled_when_the_chain_is_exhausted() -> None:
    builder = RankBuilder(0).run_started().cuda_platform().flashinfer_comm("broken")
    builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", TRTLLM_FAILED)])
    state = state_of(builder.run_finished())
    assert state.outcome is RunOutcome.READY
    assert state.flashinfer_comm_available is False
    assert state.fusion_enabled is False
    assert state.allreduce_backend is None


@pytest.mark.parametrize(
    ("result", "available"),
    [({"available": True}, True), ({}, True), (None, True), ({"available": False}, False)],
)
def test_flashinfer_comm_that_ended_ok_is_available_unless_its_result_says_not(
    result: dict[str, bool] | None, available: bool
) -> None:
    builder = RankBuilder(0).run_started()
    builder.started(FLASHINFER_COMM_STEP).succeeded(FLASHINFER_COMM_STEP, result)
    assert state_of(builder.run_finished()).flashinfer_comm_available is available


@pytest.mark.parametrize(
    ("outcome", "fact"),
    [
        ("ok", "available"),
        ("absent", "not installed"),
        ("broken", "unavailable (TypeError: type 'array.array' is not subscriptable)"),
    ],
)
def test_what_flashinfer_comm_was_on_a_rank_is_what_ranks_compare(outcome: str, fact: str) -> None:
    builder = RankBuilder(0).run_started().flashinfer_comm(outcome)
    assert state_of(builder.run_finished()).facts["flashinfer_comm"] == fact


def test_an_allreduce_step_that_did_not_end_ok_loses_the_fusion() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ALLREDUCE_STEP).unavailable(ALLREDUCE_STEP, reasons=["no workspace"])
    state = state_of(builder.run_finished())
    assert (state.fusion_enabled, state.allreduce_backend) == (False, None)
    assert state.facts["fusion_lost"] is True


def test_agreed_backend_wins_over_the_local_chain() -> None:
    builder = RankBuilder(0).run_started()
    builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", None)], agreed=None)
    state = state_of(builder.run_finished())
    assert state.fusion_enabled is False
    assert state.allreduce_backend is None


def test_failed_rank_root_cause_is_the_failure_that_reached_the_graph() -> None:
    state = state_of(failed_rank(0))
    assert state.outcome is RunOutcome.FAILED
    assert state.platform is None
    cause = state.root_cause
    assert cause is not None
    # The zentorch StepFailed came first but the cpu plugin absorbed it.
    assert cause.step == PLATFORM_STEP
    assert cause.exception is not None
    assert cause.exception.name == "UnspecifiedPlatformError"
    assert cause.exception.root() == ZENTORCH_RUNTIME
    assert cause.outcome is RunOutcome.FAILED


def test_failed_rank_root_cause_is_the_deepest_step() -> None:
    boom = exception("AttributeError", "module 'flash_attn' has no attribute 'flash_attn_func'")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.failed(ATTENTION_STEP, boom)
    events = builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN")
    cause = state_of(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("attention/FLASH_ATTN", boom)
    assert cause.seq == next(e.seq for e in events if e.TYPE == "step.failed")


def test_timed_out_step_that_failed_the_run_is_the_root_cause() -> None:
    timeout = exception("orchestrator._errors.StepTimeoutError", "step 'custom' timed out")
    builder = RankBuilder(0).run_started()
    builder.started("custom")
    builder.timed_out("custom", 1)
    events = builder.run_finished(RunOutcome.FAILED, cause=timeout, failed_step="custom")
    cause = state_of(events).root_cause
    assert cause is not None
    assert cause.step == "custom"
    assert cause.exception == timeout


def test_incomplete_rank_is_in_the_step_it_was_in() -> None:
    events = dead_rank(2)
    state = state_of(events, 2)
    assert state.outcome is RunOutcome.INCOMPLETE
    assert not state.finished
    assert state.last_step == "attention/FLASHINFER"
    cause = state.root_cause
    assert cause is not None
    assert cause.step == "attention/FLASHINFER"
    assert cause.exception is None
    assert cause.outcome is RunOutcome.INCOMPLETE
    assert cause.wall_ns == events[-1].wall_ns
    assert cause.in_flight == ("attention/FLASHINFER",)
    assert "died before the rank finished" in cause.describe()


def test_a_rank_that_died_mid_propagation_names_the_failure() -> None:
    boom = exception("RuntimeError", "boom")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    cause = state_of(builder.events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("attention/FLASH_ATTN", boom)


def test_root_cause_across_ranks_is_the_earliest_failure() -> None:
    # Rank 5 fails first; rank 2 fails later; the rest are ready.
    streams = [healthy_rank(r) for r in (0, 1, 3, 4, 6, 7)]
    streams.append(failed_rank(5, offset_ns=0))
    streams.append(failed_rank(2, offset_ns=50_000_000))
    states = fold(RankStates([ENGINE]), merge(streams))
    cause = root_cause(states)
    assert cause is not None
    assert cause.rank == 5
    assert root_cause({r: states[r] for r in (0, 1)}) is None


def test_a_rank_that_died_first_is_the_root_cause() -> None:
    streams = [failed_rank(1, offset_ns=500_000_000), dead_rank(3)]
    cause = root_cause(fold(RankStates([ENGINE]), merge(streams)))
    assert cause is not None
    assert (cause.rank, cause.exception) == (3, None)


# -- divergences ---------------------------------------------------------------


def test_divergent_allreduce_backends_are_an_error() -> None:
    streams = []
    for rank in range(8):
        builder = RankBuilder(rank).run_started()
        if rank == 4:
            builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", TRTLLM_FAILED)])
        else:
            builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", None)])
        streams.append(builder.run_finished())
    divergences = find_divergences(fold(RankStates([ENGINE]), merge(streams)), slices=[ENGINE])
    assert len(divergences) == 1
    (divergence,) = divergences
    assert divergence.code == "allreduce.divergence"
    assert divergence.severity is Severity.ERROR
    assert divergence.scope.value == "global"
    assert divergence.values == (("trtllm", (0, 1, 2, 3, 5, 6, 7)), (None, (4,)))
    assert divergence.text.startswith(
        "Ranks disagree on the allreduce fusion backend: trtllm on ranks 0-3,5-7; "
        "disabled on rank 4. Collectives hang"
    )


def test_agreeing_ranks_have_no_divergence() -> None:
    states = fold(RankStates([ENGINE]), merge(healthy_rank(r) for r in range(8)))
    assert find_divergences(states, slices=[ENGINE]) == ()


def test_platform_and_attention_divergences() -> None:
    streams = []
    for rank in range(4):
        builder = RankBuilder(rank).run_started()
        builder.started(PLATFORM_STEP)
        if rank == 3:
            builder.platform_ok("cpu", "CpuPlatform")
        else:
            builder.platform_ok("cuda", "CudaPlatform")
        builder.attention_auto(
            {"FLASH_ATTN": None}, selected="FLASH_ATTN" if rank < 2 else "TRITON_ATTN"
        )
        streams.append(builder.run_finished())
    found = {
        d.code: d
        for d in find_divergences(fold(RankStates([ENGINE]), merge(streams)), slices=[ENGINE])
    }
    assert set(found) == {"platform.divergence", "attention.divergence"}
    assert found["platform.divergence"].severity is Severity.ERROR
    assert found["attention.divergence"].severity is Severity.WARNING
    assert found["attention.divergence"].values == (
        ("FLASH_ATTN", (0, 1)),
        ("TRITON_ATTN", (2, 3)),
    )


# -- replay --------------------------------------------------------------------


def test_replay_of_a_healthy_eight_rank_run() -> None:
    result = replay(merge(healthy_rank(r) for r in range(8)), slices=[ENGINE])
    assert result.outcome is RunOutcome.READY
    assert result.run_id == "run-7f3a"
    assert result.world_size == 8
    assert result.ranks == tuple(range(8))
    assert result.root_cause is None
    assert result.divergences == ()
    assert result.warnings == ()
    warning = next(g for g in result.grouped if g.code == "allreduce.attempt_failed")
    assert warning.describe().startswith("WARNING [ranks 0-7] FlashInfer allreduce workspace")
    assert set(result.timeline.ranks) == set(range(8))
    assert step_severity(result.message_state, 6, "allreduce_workspace/mnnvl") is Severity.WARNING


def test_replay_accepts_per_rank_streams_and_log_contents() -> None:
    streams = [healthy_rank(r) for r in range(3)]
    torn = TornTail(path=Path("run/rank-2.jsonl"), line=31, offset=9000, length=17)
    contents = [
        LogContents(path=Path(f"run/rank-{r}.jsonl"), events=tuple(s), torn_tail=None)
        for r, s in enumerate(streams[:2])
    ]
    contents.append(
        LogContents(path=Path("run/rank-2.jsonl"), events=tuple(streams[2]), torn_tail=torn)
    )
    from_contents = replay(contents, slices=[ENGINE])
    from_streams = replay(streams, slices=[ENGINE])
    from_merged = replay(merge(streams), slices=[ENGINE])
    assert from_streams.states == from_merged.states == from_contents.states
    assert from_streams.messages == from_merged.messages == from_contents.messages
    assert from_contents.warnings[0] == torn.describe()
    assert "no events from ranks 3-7 of world size 8" in from_contents.warnings[1]
    assert from_contents.no_events == dict.fromkeys(range(3, 8), "no log")
    assert from_contents.outcome is RunOutcome.INCOMPLETE


def test_replay_rejects_two_logs_of_one_rank_and_gaps() -> None:
    stream = healthy_rank(0)
    twice = [
        LogContents(path=Path("a/rank-0.jsonl"), events=tuple(stream)),
        LogContents(path=Path("b/rank-0.jsonl"), events=tuple(stream)),
    ]
    with pytest.raises(LogError, match="two logs for rank 0"):
        replay(twice, slices=[ENGINE])
    with pytest.raises(FoldError):
        replay([stream[0], stream[2]], slices=[ENGINE])
    other_run = RankBuilder(1, run_id="another").run_started().run_finished()
    with pytest.raises(LogError, match="different runs"):
        replay([stream, other_run], slices=[ENGINE])


@pytest.mark.parametrize(
    ("streams", "outcome"),
    [
        # Judged against the world (SPEC §6): a rank without run.finished
        # makes the run incomplete, whatever the others did.
        (lambda: [healthy_rank(0), failed_rank(1), dead_rank(2)], RunOutcome.INCOMPLETE),
        (
            lambda: [healthy_rank(r) for r in (0, 2, 3, 4, 5, 6, 7)] + [failed_rank(1)],
            RunOutcome.FAILED,
        ),
        (lambda: [healthy_rank(0), dead_rank(2)], RunOutcome.INCOMPLETE),
        (
            lambda: [
                healthy_rank(0, world_size=2),
                RankBuilder(1, world_size=2).run_started().run_finished(RunOutcome.INTERRUPTED),
            ],
            RunOutcome.INTERRUPTED,
        ),
        (lambda: [healthy_rank(0, world_size=2), healthy_rank(1, world_size=2)], RunOutcome.READY),
        # Ranks 2-7 of the world of 8 never wrote anything.
        (lambda: [healthy_rank(0), healthy_rank(1)], RunOutcome.INCOMPLETE),
        (lambda: [], RunOutcome.INCOMPLETE),
    ],
)
def test_run_outcome_rule(streams: object, outcome: RunOutcome) -> None:
    assert callable(streams)
    assert replay(streams(), slices=[ENGINE]).outcome is outcome


def test_replay_with_a_newer_policy() -> None:
    newer = SeverityPolicy(rules=ENGINE.code_rules()).with_rule(
        "allreduce.attempt_failed", severity=Severity.INFO
    )
    result = replay([healthy_rank(0)], slices=[ENGINE, newer.as_slice()])
    assert result.slices[-1] == newer.as_slice()
    assert step_severity(result.message_state, 0, "allreduce_workspace/mnnvl") is Severity.INFO
    # The last slice naming a code decides: the engine's own, put after it.
    first = replay([healthy_rank(0)], slices=[newer.as_slice(), ENGINE])
    assert step_severity(first.message_state, 0, "allreduce_workspace/mnnvl") is Severity.WARNING


def test_replay_of_1024_ranks() -> None:
    streams = [healthy_rank(rank, world_size=1024) for rank in range(1024)]
    result = replay(streams, slices=[ENGINE])
    assert result.world_size == 1024
    assert len(result.states) == 1024
    assert result.outcome is RunOutcome.READY
    ready = next(g for g in result.grouped if g.code == "allreduce.workspace_ready")
    assert ready.rank_text == "ranks 0-1023"
