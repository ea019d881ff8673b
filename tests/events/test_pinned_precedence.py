"""How a replayed run is judged, each rule pinned by a test that fails when
the rule is changed (reordered, widened or dropped): which outcome a run
gets when its ranks disagree, which rank is the root cause when several
could be, where a failure settles as it goes up the step tree, and which
message speaks for it; which ranks make the world and when one is running,
which step and exception a root cause names, what the launcher's record of
a process adds, and what the timeline keeps of a step.

Every stream here is built with :mod:`events.testing`; nothing runs."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from events import (
    MAX_WORLD_SIZE,
    Collective,
    Event,
    FrameInfo,
    JsonlLog,
    LaunchRecord,
    MessageRule,
    Outcome,
    RankProcess,
    RankStates,
    RunOutcome,
    Slice,
    StepFailed,
    Timeline,
    fold,
    implausible_world,
    read_log,
    replay,
    root_cause,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info

SECOND = 1_000_000_000
BOOM = exception_info("RuntimeError", "boom")
OTHER = exception_info("ValueError", "bad configuration")
STOPPED = exception_info("orchestrator.StartupInterrupted", "received SIGTERM")
TIMEOUT = exception_info("orchestrator.StepTimeoutError", "step x timed out after 30 s")
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


# --- the world and its ranks ---------------------------------------------------------


def test_an_unfinished_rank_seen_alive_is_running_and_so_is_the_run() -> None:
    alive = rank_stream(1, 2)
    alive.started("probe")
    run = replay([ready(0, 2), alive.events], launch=LaunchRecord(running=frozenset({1})))
    assert run.outcome_of(1) is RunOutcome.RUNNING
    assert run.root_cause is None
    assert run.outcome is RunOutcome.RUNNING


def test_a_cutoff_at_the_first_event_keeps_every_rank() -> None:
    run = replay([ready(0, 2), ready(1, 2)], until=0)
    assert run.ranks == (0, 1)
    assert run.no_events == {}
    assert run.outcome is RunOutcome.RUNNING


def test_an_empty_log_names_its_rank_when_no_log_says_the_world() -> None:
    # No run.started: the ranks known of, an empty log's among them, make the world.
    stream = EventStream()
    stream.started("probe").succeeded("probe")
    run = replay([stream.events], launch=LaunchRecord(empty_logs=frozenset({2})))
    assert run.world_size == 3
    assert run.no_events == {1: "no log", 2: "empty log"}


def test_an_empty_log_of_the_rank_just_past_the_world_is_outside_it() -> None:
    launch = LaunchRecord(world_size=2, empty_logs=frozenset({2}))
    run = replay([ready(0, 2), ready(1, 2)], launch=launch)
    assert run.no_events == {}
    assert any("empty logs name rank 2, outside the world size 2" in w for w in run.warnings)
    assert run.outcome is RunOutcome.READY


def test_a_launcher_and_logs_that_disagree_on_the_world_are_said_to() -> None:
    run = replay([ready(0, 2), ready(1, 2)], launch=LaunchRecord(world_size=3))
    assert run.world_size == 3
    assert run.no_events == {2: "no log"}
    assert (
        "the launcher started 3 ranks but the logs say a world of 2; judged against the launcher's"
    ) in run.warnings


def test_logs_that_disagree_on_the_world_are_judged_by_the_largest() -> None:
    # A rank that says the world is larger is believed: the ranks only it
    # knows of are missing, not outside the run.
    run = replay([ready(0, 4), ready(1, 2)])
    assert run.world_size == 4
    assert run.no_events == {2: "no log", 3: "no log"}
    assert run.outcome is RunOutcome.INCOMPLETE


def test_a_launcher_is_not_said_to_disagree_with_logs_that_name_no_world() -> None:
    # No run.started: the logs say no world, which is no disagreement.
    streams = [EventStream(rank=rank, world_size=2) for rank in (0, 1)]
    run = replay(
        [stream.started("probe").succeeded("probe").events for stream in streams],
        launch=LaunchRecord(world_size=2),
    )
    assert run.world_size == 2
    assert not [w for w in run.warnings if "the logs say a world" in w], run.warnings


def test_a_world_of_the_largest_plausible_size_is_read() -> None:
    assert implausible_world(MAX_WORLD_SIZE, "manifest.json", 1) is None
    why = implausible_world(MAX_WORLD_SIZE + 1, "manifest.json", 1)
    assert why is not None
    assert why.startswith(f"manifest.json claims {MAX_WORLD_SIZE + 1:,} ranks")


# --- the rank to look at first ---------------------------------------------------------


def test_a_lone_rank_that_went_on_without_the_group_is_blamed_for_its_own_failure() -> None:
    # With no peer to leave behind, going on alone is no one's root cause.
    stream = rank_stream(0, 1)
    stream.started(GROUP).unavailable(GROUP, Outcome.UNAVAILABLE, cause=NO_TORCH)
    stream.started("probe").failed("probe", BOOM)
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="probe")
    cause = replay([events], slices=(GROUP_SLICE,)).root_cause
    assert cause is not None
    assert (cause.step, cause.exception, cause.left_out) == ("probe", BOOM, None)


def test_a_rank_that_left_the_group_as_a_peer_failed_there_is_the_root_cause() -> None:
    left = rank_stream(0, 2)
    left.started(GROUP).unavailable(GROUP, Outcome.UNAVAILABLE, cause=NO_TORCH)
    waited = rank_stream(1, 2)
    waited.started(GROUP).failed(GROUP, RENDEZVOUS)
    assert left.events[-1].wall_ns == waited.events[-1].wall_ns
    run = replay(
        [
            left.run_finished(),
            waited.run_finished(RunOutcome.FAILED, cause=RENDEZVOUS, failed_step=GROUP),
        ],
        slices=(GROUP_SLICE,),
    )
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.left_out) == (0, "the process group")


INIT = "distributed_init"
IN_RENDEZVOUS = FrameInfo(
    filename="/venv/torch/distributed/distributed_c10d.py", lineno=2169, name="init_process_group"
)
IN_ITS_OWN_CODE = FrameInfo(filename="/srv/plugin.py", lineno=10, name="probe_a_wedged_device")
PEERS = Slice(name="peers", peer_waits=("*/torch/distributed/*",))


def stalled_then_stopped(number: int, where: FrameInfo, *, died: bool) -> list[Event]:
    """Rank ``number`` of two, stalled in ``INIT`` waiting in ``where``, then
    stopped 60 s later: killed unrecorded, or failed by the stop."""
    stream = rank_stream(number, 2)
    stream.started(INIT).stalled(INIT, waiting_in=where)
    if died:
        return stream.events
    stream.advance(60 * SECOND).failed(INIT, STOPPED)
    return stream.run_finished(RunOutcome.FAILED, cause=STOPPED, failed_step=INIT)


@pytest.mark.parametrize(
    ("slices", "blamed"), [((PEERS,), 1), ((), 0)], ids=["peer waits known", "unknown"]
)
def test_a_rank_stalled_waiting_for_its_peers_is_not_the_root_cause_of_the_stuck_one(
    slices: tuple[Slice, ...], blamed: int
) -> None:
    # Rank 0 waits at the rendezvous for rank 1, stuck before it; both are
    # stopped. Rank 0 died there (its last event is earlier), rank 1 failed.
    run = replay(
        [
            stalled_then_stopped(0, IN_RENDEZVOUS, died=True),
            stalled_then_stopped(1, IN_ITS_OWN_CODE, died=False),
        ],
        slices=slices,
    )
    assert run.root_cause is not None
    assert run.root_cause.rank == blamed


def test_when_every_rank_waited_for_its_peers_the_first_is_the_root_cause() -> None:
    run = replay(
        [
            stalled_then_stopped(0, IN_RENDEZVOUS, died=True),
            stalled_then_stopped(1, IN_RENDEZVOUS, died=False),
        ],
        slices=(PEERS,),
    )
    assert run.root_cause is not None
    assert run.root_cause.rank == 0


def stopped_rank_1(*, ended_wall_ns: int | None = None) -> RankProcess:
    return RankProcess(
        rank=1,
        pid=11,
        signal="SIGTERM",
        ended_wall_ns=ended_wall_ns,
        stopped_by_launcher="SIGTERM after rank 0 (pid 10): exited with code 1",
    )


def test_a_peer_whose_log_ended_as_the_first_exit_was_seen_was_stopped_for_it() -> None:
    stopped_log = interrupted(1, 2, at_s=5)
    first_exit = stopped_log[-1].wall_ns
    launch = LaunchRecord(
        world_size=2,
        processes={
            0: RankProcess(rank=0, pid=10, exit_code=1, ended_wall_ns=first_exit),
            1: stopped_rank_1(ended_wall_ns=first_exit + SECOND),
        },
    )
    run = replay([failed(0, 2, at_s=10), stopped_log], launch=launch)
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)


def test_a_stopped_peer_is_never_blamed_when_no_exit_time_is_known() -> None:
    # Only the stopped rank's end was timed: the launcher's stop comes after
    # the first exit whatever the clocks say.
    launch = LaunchRecord(
        world_size=2,
        processes={
            0: RankProcess(rank=0, pid=10, exit_code=1),
            1: stopped_rank_1(ended_wall_ns=BASE_WALL_NS + 6 * SECOND),
        },
    )
    run = replay([failed(0, 2, at_s=10), interrupted(1, 2, at_s=5)], launch=launch)
    assert run.root_cause is not None
    assert (run.root_cause.rank, run.root_cause.outcome) == (0, RunOutcome.FAILED)
    assert run.outcome is RunOutcome.FAILED


# --- the step and exception a root cause names ----------------------------------------


def test_a_rank_that_died_with_two_failures_on_their_way_up_is_blamed_for_the_first() -> None:
    stream = EventStream().run_started()
    stream.started("x").started("y").started("x/a").started("y/b")
    stream.failed("x/a", BOOM).failed("y/b", OTHER)
    cause = replay([stream.events]).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("x/a", BOOM)


def test_a_root_cause_points_at_the_event_where_the_failure_started() -> None:
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM).failed("x", BOOM)
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    (started,) = (e for e in events if e.step == "x/child" and e.TYPE == "step.failed")
    assert (cause.step, cause.seq) == ("x/child", started.seq)


def test_a_root_cause_keeps_its_steps_exception_over_the_one_run_finished_names() -> None:
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM)
    events = stream.run_finished(RunOutcome.FAILED, cause=OTHER, failed_step="x/child")
    cause = replay(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("x/child", BOOM)


def test_a_failure_going_up_under_another_exception_keeps_its_own() -> None:
    wrapped = exception_info("orchestrator.StepError", "x/child failed", cause=BOOM)
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM)
    stream.failed("x", wrapped, origin="x/child")
    events = stream.run_finished(RunOutcome.FAILED, cause=wrapped, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("x/child", BOOM)


def test_a_failure_outside_every_step_is_blamed_on_the_step_run_finished_names() -> None:
    stream = EventStream().run_started()
    stream.started("probe").succeeded("probe")
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="setup")
    cause = replay(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("setup", BOOM)


def test_a_graph_step_whose_name_has_a_slash_is_known_by_its_span() -> None:
    stream = EventStream().run_started()
    stream.started("load/weights", parent="").failed("load/weights", BOOM)
    stream.started("z").failed("z", OTHER)
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="load/weights")
    cause = replay(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("load/weights", BOOM)


def timed_out_after_a_stall() -> list[Event]:
    """Graph step ``x`` is seen waiting, then times out and fails the run."""
    stream = EventStream().run_started()
    stream.started("x").stalled("x", 10.0).timed_out("x", 30.0)
    return stream.run_finished(RunOutcome.FAILED, cause=TIMEOUT, failed_step="x")


def test_a_graph_step_that_timed_out_is_blamed_with_the_timeout_run_finished_names() -> None:
    cause = replay(timed_out_after_a_stall()).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("x", TIMEOUT)


def test_a_failed_step_seen_waiting_says_where_it_waited() -> None:
    events = timed_out_after_a_stall()
    (stall,) = (e for e in events if e.TYPE == "step.stalled")
    cause = replay(events).root_cause
    assert cause is not None
    assert cause.waiting == stall
    assert stall.summary() in cause.describe()


def test_a_rank_that_died_in_two_steps_names_both() -> None:
    stream = EventStream().run_started()
    stream.started("cache").started("cache_dir")
    cause = replay([stream.events]).root_cause
    assert cause is not None
    assert "steps in flight: cache, cache_dir" in cause.describe()


def test_a_rank_that_died_in_one_step_names_it_once() -> None:
    stream = EventStream().run_started()
    stream.started("probe")
    cause = replay([stream.events]).root_cause
    assert cause is not None
    assert cause.describe() == (
        "rank 0, step probe: the process died before the rank finished (no run.finished)"
    )


# --- what the launcher saw of a process ------------------------------------------------


def test_a_rank_whose_process_was_lost_says_so() -> None:
    stream = EventStream().run_started()
    stream.started("probe")
    lost = "Ray actor 9f3c on node 1a2b: ActorDiedError: the actor died"
    launch = LaunchRecord(processes={0: RankProcess(rank=0, pid=10, lost=lost)})
    cause = replay([stream.events], launch=launch).root_cause
    assert cause is not None
    assert f"rank 0 (pid 10) was lost: {lost}" in cause.describe()


def test_a_process_seen_ending_before_the_launch_ends_at_its_start() -> None:
    process = RankProcess(rank=0, pid=1, signal="SIGKILL", ended_wall_ns=BASE_WALL_NS)
    described = process.describe(since_ns=BASE_WALL_NS + SECOND)
    assert described == "rank 0 (pid 1) was killed by SIGKILL at +0.0 s"


def test_a_process_killed_by_a_signal_is_said_killed_whatever_its_exit_status() -> None:
    process = RankProcess(rank=0, pid=1, exit_code=-9, signal="SIGKILL")
    assert process.how() == "was killed by SIGKILL"


def test_a_process_of_a_negative_rank_is_refused() -> None:
    with pytest.raises(ValueError, match="rank"):
        RankProcess(rank=-1)


# --- the timeline -----------------------------------------------------------------------


def test_a_log_that_holds_only_its_end_has_a_timeline() -> None:
    events = EventStream().run_finished(RunOutcome.FAILED, cause=BOOM)
    timeline = fold(Timeline(), events).ranks[0]
    assert timeline.finished == events[0]
    assert timeline.outcome is RunOutcome.FAILED


def test_a_stall_recorded_after_its_step_ended_is_left_out() -> None:
    stream = EventStream().run_started()
    stream.started("x").stalled("x").succeeded("x")
    start, began, stall, ended = stream.events
    events = [start, began, attrs.evolve(ended, seq=2), attrs.evolve(stall, seq=3)]
    timing = fold(Timeline(), events).ranks[0].steps["x"]
    assert timing.outcome is Outcome.OK
    assert timing.stall is None
