"""Processes a rank started and watched: a rank that dies is described by
what its parent saw, and ranks that name their roles are named by them."""

from __future__ import annotations

import signal

import attrs
import pytest

from events import RankProcess, RunOutcome, replay, signal_name
from events.testing import BASE_WALL_NS, EventStream
from exporters import report_json, report_text

ENGINE_CORE_PID = 4242


def launch(*, watcher_host: str = "node-0") -> list[object]:
    """A recorded engine start of two processes: the main process (rank 0)
    watched its engine core (rank 1), which was killed while it started its
    workers."""
    main = EventStream(rank=0, world_size=1)
    main.identity = attrs.evolve(main.identity, role="main")
    main.run_started(host=watcher_host, pid=4000)
    main.started("startup").started("startup/engine")
    main.started("processes").started("processes/EngineCore", attributes={"pid": ENGINE_CORE_PID})
    core = EventStream(rank=1, world_size=2, wall_ns=BASE_WALL_NS + 5_000_000)
    core.identity = attrs.evolve(core.identity, role="engine core", parent_pid=4000)
    core.run_started(host="node-0", pid=ENGINE_CORE_PID)
    core.started("startup").started("startup/workers")
    main.advance(3_000_000_000).crashed("processes/EngineCore", signal=9)
    return [*main.events, *core.events]


def test_a_rank_its_parent_saw_killed_is_described_with_what_it_saw() -> None:
    result = replay(launch())

    assert result.outcome is RunOutcome.INCOMPLETE
    cause = result.root_cause
    assert cause is not None
    assert (cause.rank, cause.step) == (1, "startup/workers")
    assert cause.process is not None
    assert (cause.process.pid, cause.process.signal) == (ENGINE_CORE_PID, "SIGKILL")
    assert cause.process.observer == "rank 0, main"
    report = report_text(result).splitlines()
    assert report[1] == (
        f"Root cause: rank 1 (engine core, pid {ENGINE_CORE_PID}), step startup/workers: "
        "was killed by SIGKILL at +3.0 s (seen by rank 0, main)"
    )
    document = report_json(result)
    core = document["ranks"][1]
    assert core["role"] == "engine core"
    assert core["process"]["observer"] == "rank 0, main"
    assert core["process"]["signal"] == "SIGKILL"


def test_ranks_that_name_their_roles_are_listed_by_role() -> None:
    table = report_text(replay(launch())).split("Ranks:")[1].splitlines()

    assert table[1].split()[:2] == ["RANKS", "ROLE"]
    assert table[2].split()[:3] == ["0", "main", "incomplete"]
    assert table[3].split()[:4] == ["1", "engine", "core", "incomplete"]


def test_a_pid_on_another_host_is_another_process() -> None:
    result = replay(launch(watcher_host="node-1"))

    assert result.root_cause is not None
    assert result.root_cause.process is None
    assert "seen by" not in report_text(result)


def test_a_launch_of_alike_ranks_has_no_role_column() -> None:
    stream = EventStream()
    events = stream.run_started().started("step").succeeded("step").run_finished()

    report = report_text(replay(events))
    assert "ROLE" not in report
    assert "role" not in report_json(replay(events))["ranks"][0]


def test_a_signal_is_named_as_the_platform_names_it_or_by_its_number() -> None:
    assert signal_name(int(signal.SIGKILL)) == "SIGKILL"
    assert signal_name(int(signal.SIGSEGV)) == "SIGSEGV"
    assert signal_name(99) == "signal 99"


STOPPED = "SIGTERM: rank 0 died"


@pytest.mark.parametrize(
    ("process", "described"),
    [
        (
            RankProcess(rank=2, pid=7, node_rank=1, host="node-1", exit_code=1),
            "rank 2 (pid 7, node 1, host node-1) exited with code 1",
        ),
        (RankProcess(rank=2, pid=7, host="", exit_code=1), "rank 2 (pid 7) exited with code 1"),
        (
            RankProcess(rank=2, pid=7, signal="SIGTERM", stopped_by_launcher=STOPPED),
            "rank 2 (pid 7) was killed by SIGTERM (the launcher sent SIGTERM: rank 0 died)",
        ),
        (
            RankProcess(rank=2, pid=7, collected=True),
            "rank 2 (pid 7): its log is in the run directory",
        ),
        (
            RankProcess(rank=2, pid=7, collected=False),
            "rank 2 (pid 7): its log is not in the run directory",
        ),
        (RankProcess(rank=2), "rank 2 was never started: its launcher stopped first"),
    ],
)
def test_a_rank_process_is_described_by_what_its_launcher_knows(
    process: RankProcess, described: str
) -> None:
    assert process.describe() == described
