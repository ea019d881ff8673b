"""The verdict's precedence rules, each pinned by a test that fails when
the rule is changed (a mutation that reorders, widens or drops it): which
outcome a run gets when its ranks disagree, which rank is the root cause
when several could be, where a failure settles as it goes up the step tree,
and which message speaks for it.

Every stream here is built with :mod:`events.testing`; nothing runs."""

from __future__ import annotations

from pathlib import Path

from events import (
    Collective,
    Event,
    JsonlLog,
    LaunchRecord,
    MessageRule,
    Outcome,
    RankProcess,
    RankStates,
    RunOutcome,
    Slice,
    StepFailed,
    fold,
    read_log,
    replay,
    root_cause,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info

SECOND = 1_000_000_000
BOOM = exception_info("RuntimeError", "boom")
STOPPED = exception_info("orchestrator.StartupInterrupted", "received SIGTERM")
NO_TORCH = exception_info("ImportError", "No module named 'torch'")
RENDEZVOUS = exception_info("orchestrator.GroupError", "the rendezvous timed out")
GROUP = "process_group"
GROUP_SLICE = Slice(name="group", collectives=(Collective(step=GROUP, what="the process group"),))


def rank_stream(number: int, world: int, *, at_s: float = 0) -> EventStream:
    """Rank ``number`` of a world of ``world``, started ``at_s`` after the base."""
    return EventStream(
        rank=number, world_size=world, wall_ns=BASE_WALL_NS + int(at_s * SECOND)
    ).run_started()


def ready(number: int, world: int) -> list[Event]:
    stream = rank_stream(number, world)
    stream.started("probe").succeeded("probe")
    return stream.run_finished()


def failed(number: int, world: int, *, at_s: float = 0) -> list[Event]:
    stream = rank_stream(number, world, at_s=at_s)
    stream.started("probe").failed("probe", BOOM)
    return stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="probe")


def interrupted(number: int, world: int, *, at_s: float = 0) -> list[Event]:
    stream = rank_stream(number, world, at_s=at_s)
    stream.started("probe").cancelled("probe")
    return stream.run_finished(RunOutcome.INTERRUPTED, cause=STOPPED)


def left_the_group(number: int, world: int) -> list[Event]:
    """Goes on without the process group at once and ends ready."""
    stream = rank_stream(number, world)
    stream.started(GROUP).unavailable(GROUP, Outcome.UNAVAILABLE, cause=NO_TORCH)
    return stream.run_finished()


def failed_at_the_group(number: int, world: int, *, after_s: float = 120) -> list[Event]:
    """Waits at the rendezvous and fails there, ``after_s`` later."""
    stream = rank_stream(number, world)
    stream.started(GROUP).advance(int(after_s * SECOND)).failed(GROUP, RENDEZVOUS)
    return stream.run_finished(RunOutcome.FAILED, cause=RENDEZVOUS, failed_step=GROUP)


# --- 1. incomplete, then the root cause's own outcome, then ready ------------------------


def test_a_rank_that_died_after_another_failed_makes_the_run_incomplete() -> None:
    # Rank 0's failure is the root cause (it came first), yet rank 1's story
    # has no end: incomplete beats the root cause's own outcome.
    dying = rank_stream(1, 2)
    dying.started("probe").advance(30 * SECOND).started("probe/load")
    run = replay([failed(0, 2), dying.events])
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)
    assert run.outcome is RunOutcome.INCOMPLETE


def test_a_rank_the_launcher_never_started_makes_a_failed_run_incomplete() -> None:
    # The launcher stopped before starting rank 2: the failure of rank 0 is
    # what to look at first, but the run is judged incomplete.
    launch = LaunchRecord(
        world_size=3,
        source="manifest.json",
        processes={
            0: RankProcess(rank=0, pid=10, exit_code=1),
            1: RankProcess(rank=1, pid=11, exit_code=0),
        },
    )
    run = replay([failed(0, 3), ready(1, 3)], launch=launch)
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)
    assert run.no_events == {2: "no log"}
    assert run.outcome is RunOutcome.INCOMPLETE


def test_a_missing_rank_beside_a_failed_one_makes_the_run_incomplete() -> None:
    run = replay([failed(0, 3), ready(1, 3)])
    assert run.outcome is RunOutcome.INCOMPLETE


def test_a_failed_root_cause_among_ready_ranks_is_a_failed_run() -> None:
    run = replay([ready(0, 3), failed(1, 3, at_s=5), ready(2, 3)])
    assert run.root_cause is not None
    assert run.root_cause.rank == 1
    assert run.outcome is RunOutcome.FAILED


def test_a_ready_root_cause_still_makes_its_peers_failure_a_failed_run() -> None:
    # The root cause is the rank that went on without the group: its own
    # outcome is ready, so the run's outcome is its ranks' worst: failed
    # (the ranks that waited), not interrupted (a rank stopped after), nor
    # ready.
    run = replay(
        [left_the_group(0, 3), failed_at_the_group(1, 3), interrupted(2, 3, at_s=200)],
        slices=(GROUP_SLICE,),
    )
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.READY)
    assert run.root_cause.left_out == "the process group"
    assert run.outcome is RunOutcome.FAILED


def test_a_failure_beats_a_rank_still_running_at_the_cutoff() -> None:
    # At seq 3 rank 0 has gone on without the group, rank 1 has failed
    # there, and rank 2 is still running: a rank had already failed.
    slow = rank_stream(2, 3)
    slow.started("probe").started("probe/a").succeeded("probe/a").succeeded("probe")
    events = [left_the_group(0, 3), failed_at_the_group(1, 3), slow.run_finished()]
    run = replay(events, slices=(GROUP_SLICE,), until=3)
    assert run.outcome_of(2) is RunOutcome.RUNNING
    assert run.root_cause is not None
    assert run.root_cause.rank == 0
    assert run.outcome is RunOutcome.FAILED


# --- 2. failed against interrupted: the root cause decides ------------------------------


def test_an_interrupted_root_cause_beats_the_failures_it_caused() -> None:
    run = replay([interrupted(0, 3), failed(1, 3, at_s=2), failed(2, 3, at_s=3)])
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.INTERRUPTED)
    assert run.outcome is RunOutcome.INTERRUPTED


def test_a_failed_root_cause_beats_the_peers_stopped_after_it() -> None:
    run = replay([failed(0, 3), interrupted(1, 3, at_s=2), interrupted(2, 3, at_s=3)])
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)
    assert run.outcome is RunOutcome.FAILED


def test_a_peer_the_launcher_stopped_after_the_first_exit_never_takes_the_blame() -> None:
    # Rank 0's clock runs ahead of the launcher's and rank 1's: its failure
    # reads later than rank 1's interruption. The launcher saw rank 0 exit,
    # then stopped rank 1, whose log ended after that exit: a consequence.
    launch = LaunchRecord(
        world_size=2,
        processes={
            0: RankProcess(rank=0, pid=10, exit_code=1, ended_wall_ns=BASE_WALL_NS + 3 * SECOND),
            1: RankProcess(
                rank=1,
                pid=11,
                signal="SIGTERM",
                ended_wall_ns=BASE_WALL_NS + 6 * SECOND,
                stopped_by_launcher="SIGTERM after rank 0 (pid 10): exited with code 1",
            ),
        },
    )
    run = replay([failed(0, 2, at_s=10), interrupted(1, 2, at_s=5)], launch=launch)
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)
    assert run.outcome is RunOutcome.FAILED


# --- 3. a tie on the wall clock: the lowest rank -----------------------------------------


def test_a_stop_and_a_failure_at_the_same_moment_name_the_lowest_rank() -> None:
    # The tie decides the rank, and with it the run's outcome.
    stopped = rank_stream(1, 3)
    stopped.started("probe")  # stopped in it, at the moment rank 2 failed
    stopped_events = stopped.run_finished(RunOutcome.INTERRUPTED, cause=STOPPED)
    run = replay([failed(2, 3), stopped_events, ready(0, 3)])
    causes = [state.root_cause for state in run.states.values() if state.root_cause is not None]
    assert sorted(cause.rank for cause in causes) == [1, 2]
    assert len({cause.wall_ns for cause in causes}) == 1
    assert run.root_cause is not None
    assert run.root_cause.rank == 1
    assert run.outcome is RunOutcome.INTERRUPTED


def test_root_cause_of_states_breaks_a_tie_by_the_lowest_rank() -> None:
    states = fold(RankStates(), [*failed(2, 3), *ready(0, 3), *failed(1, 3)])
    assert states[1].root_cause is not None
    assert states[2].root_cause is not None
    assert states[1].root_cause.wall_ns == states[2].root_cause.wall_ns
    cause = root_cause(states)
    assert cause is not None
    assert cause.rank == 1
    cause = root_cause([states[2], states[1]])
    assert cause is not None
    assert cause.rank == 1


def test_ranks_that_left_the_group_at_the_same_moment_name_the_lowest() -> None:
    run = replay(
        [
            failed_at_the_group(0, 4),
            left_the_group(3, 4),
            left_the_group(2, 4),
            failed_at_the_group(1, 4),
        ],
        slices=(GROUP_SLICE,),
    )
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.left_out) == (2, "the process group")


# --- 4. a failure read back from a log goes up as itself ---------------------------------


def test_a_failure_going_up_through_a_real_log_stays_on_its_innermost_step(
    tmp_path: Path,
) -> None:
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM).failed("x", BOOM)
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")
    path = tmp_path / "rank-0.jsonl"
    with JsonlLog(path, run_id=stream.run_id, rank=0, durability="never") as log:
        for event in events:
            log.append(event)
    read = read_log(path).events
    child, parent = (e for e in read if isinstance(e, StepFailed))
    # Equal decoded copies, not one object: what every replay of a log sees.
    assert child.cause == parent.cause
    assert child.cause is not parent.cause

    run = replay([read])
    assert run.root_cause is not None
    assert run.root_cause.step == "x/child"
    assert [(m.code, m.step) for m in run.messages if m.code == "step.failed"] == [
        ("step.failed", "x/child")
    ]


# --- 5. a step's children are below it by path, not by name prefix ----------------------


def test_a_sibling_whose_name_is_a_prefix_of_the_failed_step_does_not_absorb_it() -> None:
    # x/cache ends well after x/cache_dir failed; x/cache_dir is not below
    # x/cache, so x/cache's success does not absorb its failure.
    stream = EventStream().run_started()
    stream.started("x").started("x/cache").started("x/cache_dir")
    stream.failed("x/cache_dir", BOOM).succeeded("x/cache").failed("x", BOOM)
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")
    run = replay(events)
    assert run.root_cause is not None
    assert run.root_cause.step == "x/cache_dir"
    assert [m.step for m in run.messages if m.code == "step.failed"] == ["x/cache_dir"]


def test_a_rank_that_died_in_a_step_and_its_prefix_named_sibling_was_in_both() -> None:
    stream = EventStream().run_started()
    stream.started("cache").started("cache_dir")
    run = replay([stream.events])
    cause = run.root_cause
    assert cause is not None
    assert cause.in_flight == ("cache", "cache_dir")
    assert cause.step is None  # two steps in flight: neither is "the" step


# --- 6. a parent's failure is a child's timeout going up only when it says so ------------


def test_a_parent_failing_otherwise_after_a_child_timed_out_is_reported_as_its_own() -> None:
    other = exception_info("ValueError", "bad configuration")
    stream = EventStream().run_started()
    stream.started("x").started("x/slow").timed_out("x/slow", 1.0).failed("x", other)
    events = stream.run_finished(RunOutcome.FAILED, cause=other, failed_step="x")
    run = replay(events)
    assert run.root_cause is not None
    assert (run.root_cause.step, run.root_cause.exception) == ("x", other)
    spoken = [(m.code, m.step) for m in run.messages if m.code.startswith("step.")]
    assert spoken == [("step.timed_out", "x/slow"), ("step.failed", "x")]


def test_a_parent_failing_otherwise_after_a_child_crashed_is_its_own_failure() -> None:
    other = exception_info("ValueError", "bad configuration")
    stream = EventStream().run_started()
    stream.started("x").started("x/isolated").crashed("x/isolated", signal=9).failed("x", other)
    events = stream.run_finished(RunOutcome.FAILED, cause=other, failed_step="x")
    run = replay(events)
    assert run.root_cause is not None
    assert (run.root_cause.step, run.root_cause.exception) == ("x", other)


# --- 7, 8. which message speaks for a failure ---------------------------------------------


def nested_failure() -> list[Event]:
    """``x/child`` fails with :data:`BOOM`, which goes up through ``x``."""
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM).failed("x", BOOM)
    return stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")


def spoken(events: list[Event], *rules: MessageRule) -> list[tuple[str, str]]:
    run = replay(events, slices=[Slice(name="mine", rules=rules)])
    return [(message.code, message.step) for message in run.messages]


def test_a_failed_rule_naming_the_step_speaks_only_where_the_failure_started() -> None:
    # The text names the step, so a message on each enclosing step would be
    # a distinct message, not one the once-per-rank rule folds away.
    rule = MessageRule(code="mine.boom", step="*", text="Step {step} broke: {error}")
    said = spoken(nested_failure(), rule)
    assert [step for code, step in said if code == "mine.boom"] == ["x/child"]
    assert not any(code == "step.failed" for code, _step in said)


def test_a_rule_for_another_outcome_naming_the_exception_leaves_the_failure_to_the_kernel() -> None:
    rule = MessageRule(
        code="mine.missing",
        step="x/*",
        outcomes=("unavailable", "absent"),
        exception="RuntimeError",
        text="Missing: {reason}",
    )
    said = spoken(nested_failure(), rule)
    assert ("step.failed", "x/child") in said
    assert not any(code == "mine.missing" for code, _step in said)
