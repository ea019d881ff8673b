"""One node's copy of a multi-node run: without a launcher's record, each
node keeps its own logs, so the ranks of a node none of whose logs are here
are another node's, not ranks that never started; they are not the root
cause while a rank here is."""

from __future__ import annotations

import events
from events import Event, LaunchRecord, RunOutcome
from events.testing import EventStream, exception_info
from exporters import report_json, report_text

BOOM = exception_info("RuntimeError", "boom")


def _node(ranks: range, *, failing: int) -> list[Event]:
    """The logs of ``ranks`` of a world of 4 ranks on 2 nodes; ``failing``
    fails in its probe, the others are ready."""
    found: list[Event] = []
    for rank in ranks:
        stream = EventStream(rank=rank, world_size=4, local_world_size=2).run_started()
        stream.started("probe")
        if rank == failing:
            stream.failed("probe", BOOM)
            found += stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="probe")
        else:
            stream.succeeded("probe")
            found += stream.run_finished()
    return found


def test_the_ranks_of_a_node_not_here_are_another_nodes() -> None:
    result = events.replay(_node(range(2, 4), failing=3))

    assert result.no_events == {0: "another node's", 1: "another node's"}
    assert result.root_cause is not None
    assert (result.root_cause.rank, result.root_cause.step) == (3, "probe")
    # Not every rank was read: the run cannot be called failed or ready.
    assert result.outcome is RunOutcome.INCOMPLETE
    text = report_text(result)
    assert "ranks 0-1: not here: another node's (each node keeps its own copy" in text
    assert [rank["log"] for rank in report_json(result)["ranks"]][:2] == ["missing", "missing"]
    assert not any("never started" in warning for warning in result.warnings), result.warnings


def test_a_rank_missing_from_a_node_that_is_here_is_still_the_root_cause() -> None:
    # Rank 2 of node 1 has no log beside rank 3's: it never started, or died.
    result = events.replay([e for e in _node(range(2, 4), failing=3) if e.rank == 3])

    assert result.no_events[2] == "no log"
    assert result.root_cause is not None
    assert result.root_cause.rank == 2


def test_a_launchers_record_says_which_ranks_it_started() -> None:
    # With a manifest, a rank without a log is one its launcher started.
    launch = LaunchRecord(run_id="test-run", world_size=4, source="manifest.json")
    result = events.replay(_node(range(2, 4), failing=3), launch=launch)

    assert result.no_events == {0: "no log", 1: "no log"}
