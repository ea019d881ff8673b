"""A run is judged as a whole, against its expected ranks (SPEC §6).

A rank with no events, or with no ``run.finished``, makes the run
``incomplete`` and is named before the symptoms its peers saw because of
it; what a launcher recorded (its manifest) says how such a rank ended; a
rank that died with several steps in flight is reported with all of them;
a cutoff is a cutoff, not a crash; and a simulated host or an injected
fault is said first.
"""

from __future__ import annotations

import attrs
import pytest

from events import Event, LaunchRecord, RankProcess, RunOutcome, StepKind, Stop, replay
from events.testing import BASE_WALL_NS as BASE_NS
from events.testing import EventStream, exception_info
from exporters import report_json, report_text

RUN_ID = "run-7f3a"

GROUP_LOST = exception_info(
    "orchestrator._group.GroupError",
    "all_gather across the process group failed: a peer failed, exited, or never reached "
    "this exchange",
    cause=exception_info("RuntimeError", "Connection closed by peer [127.0.0.1]:29500"),
)


def started_rank(rank: int, world_size: int) -> EventStream:
    """A rank of a graph of its own, ``run.started`` written: events 1 ms
    apart, rank ``r`` ``r`` µs after the others."""
    return EventStream(
        run_id=RUN_ID, rank=rank, world_size=world_size, wall_ns=BASE_NS + rank * 1_000
    ).run_started()


def with_kernels(stream: EventStream) -> EventStream:
    """``kernels`` chosen among two candidates, ``fast`` unavailable."""
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    stream.unavailable("kernels/fast", cause=exception_info("OSError", "no libfast.so"))
    stream.succeeded("kernels/slow", {"candidate": "slow"})
    stream.decision("candidates.select", "slow", step="kernels")
    return stream.succeeded("kernels", {"selected": "slow"})


def ready_rank(rank: int, *, world_size: int) -> list[Event]:
    """A rank that started: kernels chosen, then a fallback chain under
    ``warmup`` (``graph`` unavailable, ``eager`` ok): ready."""
    stream = with_kernels(started_rank(rank, world_size))
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": True})
    stream.unavailable("warmup/graph", cause=exception_info("RuntimeError", "no graph capture"))
    stream.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    stream.succeeded("warmup/eager")
    stream.succeeded("warmup")
    return stream.run_finished()


def survivor_of_a_lost_peer(rank: int, world_size: int) -> list[Event]:
    """Waited for a peer in an agreement across the ranks and failed with
    GroupError."""
    stream = with_kernels(started_rank(rank, world_size))
    stream.started("exchange")
    stream.started("exchange/agree", kind=StepKind.STEP)
    stream.failed("exchange/agree", GROUP_LOST)
    stream.failed("exchange", GROUP_LOST)
    return stream.run_finished(RunOutcome.FAILED, cause=GROUP_LOST, failed_step="exchange")


def test_a_rank_without_a_log_makes_the_run_incomplete_and_is_named_first() -> None:
    result = replay([ready_rank(r, world_size=4) for r in (0, 2, 3)])

    assert result.world_size == 4
    assert result.outcome is RunOutcome.INCOMPLETE
    assert result.no_events == {1: "no log"}
    cause = result.root_cause
    assert cause is not None
    assert (cause.rank, cause.no_events, cause.step) == (1, "no log", None)
    lines = report_text(result).splitlines()
    assert lines[0] == (
        "Startup incomplete: 3 ready, 1 without events (run run-7f3a, 3 of 4 ranks)"
    )
    assert lines[1] == (
        "Root cause: rank 1 wrote no events (no log): never started, "
        "or killed before its first event"
    )
    assert "Ranks without events:" in lines
    document = report_json(result)
    assert document["outcome"] == "incomplete"
    assert [(r["rank"], r["outcome"], r["log"]) for r in document["ranks"]] == [
        (0, "ready", "complete"),
        (1, "incomplete", "missing"),
        (2, "ready", "complete"),
        (3, "ready", "complete"),
    ]
    assert document["root_cause"]["no_events"] == "no log"


def test_the_lost_rank_comes_before_the_group_errors_of_its_peers() -> None:
    # Rank 1 wrote nothing; ranks 0, 2 and 3 then failed in the collective
    # that waited for it. Their GroupError is a consequence.
    streams = [survivor_of_a_lost_peer(r, 4) for r in (0, 2, 3)]
    result = replay(streams, launch=LaunchRecord(world_size=4, empty_logs=frozenset({1})))

    assert result.outcome is RunOutcome.INCOMPLETE
    cause = result.root_cause
    assert cause is not None
    assert (cause.rank, cause.no_events) == (1, "empty log")
    text = report_text(result)
    assert text.splitlines()[1].startswith("Root cause: rank 1 wrote no events (empty log)")
    assert "[ranks 0,2-3]" in text  # the survivors' error still shows, grouped


def test_the_manifest_says_how_a_silent_rank_ended() -> None:
    launch = LaunchRecord(
        run_id="run-7f3a",
        world_size=2,
        started_wall_ns=BASE_NS,
        processes={
            0: RankProcess(
                rank=0, pid=1373, ended_wall_ns=BASE_NS + 4_100_000_000, signal="SIGKILL"
            ),
            1: RankProcess(rank=1, pid=1374, ended_wall_ns=BASE_NS + 9_000_000_000, exit_code=0),
        },
        empty_logs=frozenset({0}),
    )
    result = replay([ready_rank(1, world_size=2)], launch=launch)

    lines = report_text(result).splitlines()
    assert (
        lines[1]
        == "Root cause: rank 0 (pid 1373) was killed by SIGKILL at +4.1 s; its log is empty"
    )
    document = report_json(result)
    assert document["ranks"][0]["process"]["signal"] == "SIGKILL"
    assert document["root_cause"]["description"].startswith("rank 0 (pid 1373) was killed")


def test_a_rank_its_launcher_lost_is_reported_with_what_the_launcher_knows() -> None:
    launch = LaunchRecord(
        run_id="run-7f3a",
        world_size=2,
        started_wall_ns=BASE_NS,
        processes={
            0: RankProcess(rank=0, pid=51, ended_wall_ns=BASE_NS + 9_000_000_000),
            1: RankProcess(
                rank=1,
                pid=52,
                ended_wall_ns=BASE_NS + 3_500_000_000,
                lost="Ray actor 9f3c on node 1a2b: ActorDiedError: the actor died unexpectedly",
            ),
        },
    )
    result = replay([ready_rank(0, world_size=2)], launch=launch)

    assert result.root_cause is not None
    assert result.root_cause.rank == 1
    lines = report_text(result).splitlines()
    assert lines[1] == (
        "Root cause: rank 1 (pid 52) was lost at +3.5 s: Ray actor 9f3c on node 1a2b: "
        "ActorDiedError: the actor died unexpectedly; its log is missing"
    )
    document = report_json(result)
    assert document["ranks"][1]["process"]["lost"].startswith("Ray actor 9f3c")


def test_a_manifest_of_another_run_is_refused() -> None:
    from events import LogError

    with pytest.raises(LogError, match="launch record"):
        replay([ready_rank(0, world_size=1)], launch=LaunchRecord(run_id="other", world_size=1))


def test_a_rank_the_launcher_stopped_is_a_consequence_not_the_root_cause() -> None:
    # Rank 1 was stuck (its last event early) and the launcher killed it after
    # rank 0 failed; without the manifest the earliest event would blame rank 1.
    stuck = started_rank(1, 2)
    stuck.started("kernels")
    failing = survivor_of_a_lost_peer(0, 2)
    failing = [attrs.evolve(e, wall_ns=e.wall_ns + 10_000_000_000) for e in failing]
    streams = [failing, stuck.events]
    assert replay(streams).root_cause.rank == 1  # type: ignore[union-attr]

    launch = LaunchRecord(
        world_size=2,
        processes={
            1: RankProcess(
                rank=1,
                pid=11,
                signal="SIGKILL",
                stopped_by_launcher="SIGKILL after rank 0 (pid 10): exited with code 3",
            )
        },
    )
    cause = replay(streams, launch=launch).root_cause
    assert cause is not None
    assert cause.rank == 0


def test_a_rank_stopped_after_its_own_failure_is_still_the_root_cause() -> None:
    # Rank 1 failed first and waited for its peers; rank 0 then failed in an
    # exchange and exited first, so the launcher stopped rank 1 "after rank
    # 0". Rank 1's log had finished before that: the stop changed nothing.
    boom = exception_info("RuntimeError", "unknown cache failure")
    stream = started_rank(1, 2)
    stream.started("cache_dir")
    stream.failed("cache_dir", boom)
    first = stream.run_finished(RunOutcome.FAILED, cause=boom, failed_step="cache_dir")
    peer = survivor_of_a_lost_peer(0, 2)
    peer = [attrs.evolve(e, wall_ns=e.wall_ns + 10_000_000_000) for e in peer]
    ended = peer[-1].wall_ns + 1_000_000
    processes = {
        0: RankProcess(rank=0, pid=10, exit_code=1, ended_wall_ns=ended),
        1: RankProcess(
            rank=1,
            pid=11,
            signal="SIGTERM",
            ended_wall_ns=ended + 1_000_000_000,
            stopped_by_launcher="SIGTERM after rank 0 (pid 10): exited with code 1, 1 s later",
        ),
    }
    cause = replay([peer, first], launch=LaunchRecord(world_size=2, processes=processes)).root_cause
    assert cause is not None
    assert (cause.rank, cause.step) == (1, "cache_dir")

    # Stopped before its log finished, the same rank is a consequence.
    unfinished = first[:-1]
    cause = replay(
        [peer, unfinished], launch=LaunchRecord(world_size=2, processes=processes)
    ).root_cause
    assert cause is not None
    assert cause.rank == 0


def test_a_rank_that_died_with_several_steps_in_flight_lists_them_all() -> None:
    stream = started_rank(0, 1)
    stream.started("cache_dir")
    stream.succeeded("cache_dir", {"cache_dir": "/cache"})
    stream.started("kernels")
    for name in ("fast", "slow"):
        stream.started(f"kernels/{name}", kind=StepKind.CANDIDATE)
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT)
    launch = LaunchRecord(
        world_size=1,
        started_wall_ns=BASE_NS,
        processes={0: RankProcess(rank=0, pid=7, signal="SIGSEGV", ended_wall_ns=BASE_NS + 10**9)},
    )
    result = replay([stream.events], launch=launch)

    cause = result.root_cause
    assert cause is not None
    assert cause.step is None  # several steps: none of them is "the" step
    assert cause.in_flight == ("kernels/fast", "kernels/slow", "warmup/graph")
    lines = report_text(result).splitlines()
    assert lines[1] == (
        "Root cause: rank 0: the process died before the rank finished "
        "(no run.finished in its log: it crashed or was killed)"
    )
    assert lines[2] == "  3 steps were in flight: kernels/fast, kernels/slow, warmup/graph"
    assert lines[3] == "  its launcher saw: rank 0 (pid 7) was killed by SIGSEGV at +1.0 s"
    assert report_json(result)["root_cause"]["in_flight"] == list(cause.in_flight)


def test_an_interrupted_rank_names_the_steps_it_was_in() -> None:
    stop = exception_info("orchestrator._errors.StartupInterrupted", "received SIGTERM")
    stream = started_rank(0, 1)
    stream.started("process_group")
    stream.cancelled("process_group", reason="the run was interrupted: received SIGTERM")
    events = stream.run_finished(RunOutcome.INTERRUPTED, cause=stop, stop=Stop(signal="SIGTERM"))
    result = replay([events])

    assert result.outcome is RunOutcome.INTERRUPTED
    cause = result.root_cause
    assert cause is not None
    assert (cause.step, cause.in_flight) == ("process_group", ("process_group",))
    lines = report_text(result).splitlines()
    assert lines[1] == "Root cause: rank 0, step process_group"
    assert lines[2] == "  StartupInterrupted: received SIGTERM"
    texts = [m["text"] for m in report_json(result)["messages"]]
    assert any(t.startswith("Startup interrupted (received SIGTERM)") for t in texts)


def test_a_cutoff_is_not_a_crash() -> None:
    streams = [ready_rank(r, world_size=2) for r in range(2)]
    result = replay(streams, until=5)

    assert result.outcome is RunOutcome.RUNNING
    assert result.root_cause is None
    lines = report_text(result).splitlines()
    assert lines[0].startswith(
        "Startup running at the cutoff seq 5 (the state then, not how the run ended): 2 running"
    )
    assert lines[1] == "Root cause: none so far (no rank had failed by the cutoff)"
    assert "died" not in report_text(result)
    document = report_json(result)
    assert document["until"] == 5
    assert {r["outcome"] for r in document["ranks"]} == {"running"}


def test_a_simulated_host_and_injected_faults_are_said_first() -> None:
    streams = []
    for rank in range(2):
        events = ready_rank(rank, world_size=2)
        events[0] = attrs.evolve(
            events[0], simulated="my-host", injected=("1:my_kernels=RuntimeError:boom",)
        )
        streams.append(events)
    result = replay(streams)

    lines = report_text(result).splitlines()
    assert lines[1] == (
        "Not a real start: simulated host my-host; injected faults: 1:my_kernels=RuntimeError:boom"
    )
    assert lines[2].startswith("Root cause:")
    document = report_json(result)
    assert (document["simulated"], document["injected"]) == (
        "my-host",
        ["1:my_kernels=RuntimeError:boom"],
    )


def test_every_simulated_host_of_the_ranks_is_said() -> None:
    # Two torchrun nodes started with --simulate h200x8 and --simulate
    # a100x4: the report named h200x8 alone, as if every rank ran on it.
    streams = []
    for rank, host in enumerate(["h200x8", "h200x8", "a100x4"]):
        events = ready_rank(rank, world_size=3)
        events[0] = attrs.evolve(events[0], simulated=host)
        streams.append(events)
    result = replay(streams)

    assert report_text(result).splitlines()[1] == "Not a real start: simulated host h200x8, a100x4"
    assert report_json(result)["simulated"] == "h200x8, a100x4"


def test_a_launch_whose_ranks_wrote_nothing_is_reported_from_its_manifest() -> None:
    # The launcher was stopped while it started the ranks: rank 0 started
    # and got the forwarded SIGINT before its log opened; rank 1 never started.
    launch = LaunchRecord(
        run_id="run-7f3a",
        world_size=2,
        started_wall_ns=BASE_NS,
        processes={
            0: RankProcess(
                rank=0,
                pid=5,
                ended_wall_ns=BASE_NS + 200_000_000,
                signal="SIGINT",
                stopped_by_launcher="SIGINT: the launcher was asked to stop",
            )
        },
        source="run/manifest.json",
    )
    result = replay([], launch=launch)

    assert result.outcome is RunOutcome.INCOMPLETE
    assert result.run_id == "run-7f3a"
    lines = report_text(result).splitlines()
    assert lines[0] == "Startup incomplete: 2 without events (run run-7f3a, 0 of 2 ranks)"
    assert lines[1].startswith("Root cause: rank 0 (pid 5) was killed by SIGINT at +0.2 s")
    assert "  rank 1 was never started: its launcher stopped first; no log" in lines
    assert report_json(result)["ranks"][1]["process"]["pid"] is None
