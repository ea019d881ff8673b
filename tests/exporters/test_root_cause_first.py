"""What an operator reads first points at the failure: the Ranks table's
LAST STEP of a failed rank is the step it failed in, not the last step that
ended after it, and ``explain`` shows the root-cause rank's tree first."""

from __future__ import annotations

import re

import attrs

import events
from events import Event, FrameInfo, RunOutcome
from events.testing import EventStream, exception_info
from exporters import explain_text, report_html, report_text

BOOM = exception_info("RuntimeError", "boom")
LOST = exception_info("ConnectionError", "peer 2 went away")


def _run() -> list[Event]:
    """Rank 2 fails in ``attention/FLASH_ATTN`` and its ``allreduce`` is
    cancelled after it; ranks 0 and 1 fail later in ``allreduce``."""
    streams = []
    for rank in range(3):
        stream = EventStream(rank=rank, world_size=3).run_started()
        stream.started("attention").started("attention/FLASH_ATTN")
        if rank == 2:
            stream.failed("attention/FLASH_ATTN", BOOM).failed("attention", BOOM)
            stream.started("allreduce").cancelled("allreduce", "the startup failed")
            streams.append(
                stream.run_finished(
                    RunOutcome.FAILED, cause=BOOM, failed_step="attention/FLASH_ATTN"
                )
            )
            continue
        stream.succeeded("attention/FLASH_ATTN").succeeded("attention")
        stream.advance(5_000_000)
        stream.started("allreduce").failed("allreduce", LOST)
        streams.append(stream.run_finished(RunOutcome.FAILED, cause=LOST, failed_step="allreduce"))
    return [event for stream in streams for event in stream]


def test_the_ranks_table_shows_the_step_each_failed_rank_failed_in() -> None:
    text = report_text(events.replay(_run()))
    table = text.partition("Ranks:\n")[2].partition("\n\n")[0].splitlines()
    last_steps = {row.split()[0]: row.split()[-1] for row in table[1:]}
    assert last_steps == {"2": "attention/FLASH_ATTN", "0-1": "allreduce"}, text


def test_explain_shows_the_root_cause_ranks_tree_first() -> None:
    result = events.replay(_run())
    cause = result.root_cause
    assert cause is not None
    assert cause.rank == 2

    groups = [line for line in explain_text(result).splitlines() if line.startswith("==")]
    assert groups == ["== rank 2 ==", "== ranks 0-1 =="]
    # Without a root cause to put first, by lowest rank.
    groups = [
        line
        for line in explain_text(attrs.evolve(result, root_cause=None)).splitlines()
        if line.startswith("==")
    ]
    assert groups == ["== ranks 0-1 ==", "== rank 2 =="]


def _report(
    *, injected: tuple[str, ...] = (), lost_rank: bool = False, exit_code: int = 0
) -> dict[str, object]:
    """The report document of a simulated 2-rank run (3 with ``lost_rank``:
    rank 2 ready and recorded by its launcher); rank 0's process exited with
    ``exit_code``."""
    from events import LaunchRecord, RankProcess
    from exporters import report_json

    streams = []
    world = 3 if lost_rank else 2
    for rank in range(world):
        stream = EventStream(rank=rank, world_size=world)
        stream.run_started(simulated="h200x8", injected=injected)
        stream.started("probe").succeeded("probe")
        streams.append(stream.run_finished())
    processes = {0: RankProcess(rank=0, pid=6, exit_code=exit_code)}
    if lost_rank:
        processes[2] = RankProcess(rank=2, pid=7, exit_code=0)
    launch = LaunchRecord(run_id="test-run", world_size=world, processes=processes)
    run = [event for stream in streams for event in stream]
    return report_json(events.replay(run, launch=launch))


def test_diff_says_how_runs_were_not_real_starts_and_which_ranks_one_lacks() -> None:
    from exporters import diff_text, run_differences

    plain, injected = _report(), _report(injected=("1:probe=RuntimeError:boom",))
    assert diff_text(plain, plain).splitlines()[2:] == [
        "both runs: simulated host h200x8",
        "no differences in outcome, state, decisions or messages",
    ]
    assert run_differences(plain, injected) == [
        "injected faults: none -> 1:probe=RuntimeError:boom"
    ]
    wider = _report(lost_rank=True)
    changes = run_differences(plain, wider)
    assert "rank 2: only in the second run" in changes, changes
    # The fields of a rank's process are named one by one, not as a dict.
    assert run_differences(plain, _report(exit_code=3)) == ["rank 0: process.exit_code 0 -> 3"]


def test_diff_says_a_rank_of_one_run_only_once_not_its_decisions_too() -> None:
    from exporters import run_differences

    two = {"ranks": [{"rank": 0}, {"rank": 1}]}
    one = {"ranks": [{"rank": 0}]}
    decided = {(0, "backend@attention"): "sdpa", (1, "backend@attention"): "sdpa"}
    assert run_differences(
        two, one, decisions_a=decided, decisions_b={(0, "backend@attention"): "sdpa"}
    ) == ["rank 1: only in the first run"]


def test_diff_names_a_root_cause_without_an_exception_by_its_description() -> None:
    from events import LaunchRecord
    from exporters import report_json, run_differences

    # Rank 1 of 2 never wrote an event: the root cause is no exception.
    run = EventStream(rank=0, world_size=2).run_started().started("probe").succeeded("probe")
    launch = LaunchRecord(run_id="test-run", world_size=2)
    silent = report_json(events.replay(list(run.run_finished()), launch=launch))
    changes = run_differences(_report(), silent)
    assert (
        "root cause: none -> rank 1 wrote no events (no log): never started, or killed "
        "before its first event"
    ) in changes, changes


def test_the_page_and_the_report_count_time_from_the_same_moment() -> None:
    from events import LaunchRecord, RankProcess
    from events.testing import BASE_WALL_NS
    from exporters import report_html

    stream = EventStream(rank=0, world_size=2).run_started()
    run = stream.started("probe").succeeded("probe").run_finished()
    # Rank 1 died before its first event, 12.5 s after its launcher began
    # (which was 2 s before rank 0's first event).
    died = RankProcess(rank=1, pid=9, exit_code=1, ended_wall_ns=BASE_WALL_NS + 10_500_000_000)
    launch = LaunchRecord(
        run_id="test-run",
        world_size=2,
        started_wall_ns=BASE_WALL_NS - 2_000_000_000,
        processes={1: died},
        source="manifest.json",
    )
    result = events.replay(run, launch=launch)

    assert "at +12.5 s" in report_text(result)
    page = report_html(result)
    assert "at +12.5 s" in page
    # The rank without events is described once: its process is what it is.
    cause = page[page.index('id="root-cause"') :].split("</section>")[0]
    assert cause.count("exited with code 1") == 1, cause
    assert "time since the launch began" in page


def test_explain_and_the_html_lanes_keep_apart_ranks_that_wait_in_different_places() -> None:
    # Both ranks hang in one step, as two workers of a start do when one is
    # stuck before the rendezvous and its peer waits there: alike but for
    # where they wait, so each is shown with its own stack.
    rendezvous = FrameInfo(filename="/venv/torch/distributed/c10d.py", lineno=9, name="barrier")
    wedged = FrameInfo(filename="/app/device.py", lineno=3, name="probe_a_wedged_device")
    streams = []
    for rank, frame in enumerate((rendezvous, wedged)):
        stream = EventStream(rank=rank, world_size=2).run_started()
        streams.append(stream.started("init").stalled("init", 20.0, waiting_in=frame))
    result = events.replay([event for stream in streams for event in stream.events])

    text = explain_text(result)
    assert [line for line in text.splitlines() if line.startswith("==")] == [
        "== rank 0 ==",
        "== rank 1 ==",
    ]
    assert "waiting in barrier (c10d.py:9) after 20.0 s" in text
    assert "waiting in probe_a_wedged_device (device.py:3) after 20.0 s" in text
    # The HTML report's swimlanes the same.
    assert re.findall(r'class="lane" data-ranks="([^"]*)"', report_html(result)) == [
        "rank 0",
        "rank 1",
    ]
