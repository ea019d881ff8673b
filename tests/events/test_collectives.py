"""A rank that goes on without a collective step is the root cause of its
peers' failures there (RELIABILITY.md, finding 4): the ranks waited for it
at the rendezvous and failed long after it left."""

from __future__ import annotations

from events import (
    Collective,
    Event,
    Outcome,
    RunOutcome,
    Slice,
    replay,
)
from events.testing import EventStream, exception_info
from exporters import report_json, report_text

GROUP = "process_group"
SLICE = Slice(name="group", collectives=(Collective(step=GROUP, what="the process group"),))
NO_TORCH = exception_info("ImportError", "No module named 'torch'")
TIMEOUT = exception_info(
    "orchestrator.GroupError", "the rendezvous timed out after 120 s: ranks 1 never came"
)
SECOND = 1_000_000_000


def _left(rank: int, world_size: int) -> list[Event]:
    """Goes on without the group at once, then ends ready on its own."""
    builder = EventStream(rank=rank, world_size=world_size).run_started()
    builder.started(GROUP).unavailable(GROUP, Outcome.UNAVAILABLE, cause=NO_TORCH)
    builder.started("platform").succeeded("platform", {"plugin": "cuda"})
    return builder.run_finished(RunOutcome.READY)


def _waited(rank: int, world_size: int, *, after_s: int = 120) -> list[Event]:
    """Waits at the rendezvous and fails there."""
    builder = EventStream(rank=rank, world_size=world_size).run_started()
    builder.started(GROUP).advance(after_s * SECOND).failed(GROUP, TIMEOUT)
    return builder.run_finished(RunOutcome.FAILED, cause=TIMEOUT, failed_step=GROUP)


def test_the_rank_that_went_on_without_the_group_is_the_root_cause() -> None:
    run = [_waited(0, 4), _left(1, 4), _waited(2, 4), _waited(3, 4)]
    result = replay(run, slices=(SLICE,))

    assert result.outcome is RunOutcome.FAILED
    cause = result.root_cause
    assert cause is not None
    assert (cause.rank, cause.step, cause.left_out) == (1, GROUP, "the process group")
    assert cause.outcome is RunOutcome.READY  # its own start went on
    assert cause.exception == NO_TORCH
    assert cause.describe() == (
        "rank 1, step process_group: ImportError: No module named 'torch'; rank 1 went on "
        "without the process group, and the ranks that waited for it there failed"
    )
    text = report_text(result).splitlines()
    assert text[1] == "Root cause: rank 1, step process_group"
    assert "  rank 1 went on without the process group, and the ranks that waited for it " in (
        "\n".join(text) + " "
    )
    document = report_json(result)["root_cause"]
    assert document["rank"] == 1
    assert document["left_out"] == "the process group"
    assert document["outcome"] == "ready"


def test_without_the_declaration_a_peer_that_failed_is_the_root_cause() -> None:
    run = [_waited(0, 4), _left(1, 4), _waited(2, 4), _waited(3, 4)]
    cause = replay(run).root_cause
    assert cause is not None
    assert cause.rank == 0
    assert cause.left_out is None


def test_a_failure_before_the_rank_left_stays_the_root_cause() -> None:
    # Rank 2 failed at once, before rank 1 went on alone: rank 2's failure
    # is the first thing that went wrong.
    early = EventStream(rank=2, world_size=4).run_started()
    early.started(GROUP).failed(GROUP, TIMEOUT)
    late_leaver = EventStream(rank=1, world_size=4).run_started().advance(5 * SECOND)
    late_leaver.started(GROUP).unavailable(GROUP, cause=NO_TORCH)
    run = [
        _waited(0, 4),
        late_leaver.run_finished(RunOutcome.READY),
        early.run_finished(RunOutcome.FAILED, cause=TIMEOUT, failed_step=GROUP),
        _waited(3, 4),
    ]
    cause = replay(run, slices=(SLICE,)).root_cause
    assert cause is not None
    assert cause.rank == 2
    assert cause.left_out is None


def test_a_run_that_ended_ready_has_no_root_cause() -> None:
    # Every rank went on alone and ended ready: nobody waited.
    result = replay([_left(0, 2), _left(1, 2)], slices=(SLICE,))
    assert result.outcome is RunOutcome.READY
    assert result.root_cause is None
    # A single rank has no peers to leave.
    alone = replay([_left(0, 1)], slices=(SLICE,))
    assert alone.root_cause is None


def test_the_trace_marks_the_rank_that_left_as_the_root_cause() -> None:
    from events import merge
    from exporters import run_trace

    run = [_waited(0, 4), _left(1, 4), _waited(2, 4), _waited(3, 4)]
    result = replay(run, slices=(SLICE,))
    spans = run_trace(merge(run), result)
    roots = {
        span.attributes["startup.rank"]: span
        for span in spans
        if span.attributes and span.attributes.get("startup.kind") == "run"
    }
    assert roots[1].attributes["startup.root_cause"] is True
    assert "rank 1 went on without the process group" in (roots[1].status.description or "")
    assert roots[0].attributes["startup.root_cause_rank"] == 1
