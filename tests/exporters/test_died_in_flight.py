"""A step in flight when its rank died lasts until the death: the views,
the spans and the HTML report measure it to when the launcher saw the
process end, not to the rank's last event."""

from __future__ import annotations

from events import FrameInfo, LaunchRecord, RankProcess, RunOutcome, StallReason, merge, replay
from events.testing import EventStream
from exporters import (
    blame_text,
    critical_path_text,
    explain_text,
    report_html,
    report_text,
    run_differences,
    spans_from_events,
)

#: The rank's process ended this long after its last event.
AFTER_S = 30


def _died() -> tuple[EventStream, LaunchRecord]:
    stream = EventStream(run_id="died", rank=0, tick_ns=1_000_000)
    stream.run_started()
    stream.started("attention")
    stream.stalled("attention", 2.0)
    died = stream.events[-1].wall_ns + AFTER_S * 1_000_000_000
    launch = LaunchRecord(
        run_id="died",
        world_size=1,
        processes={0: RankProcess(rank=0, pid=7, ended_wall_ns=died, signal=9)},
    )
    return stream, launch


def test_blame_explain_and_the_critical_path_count_until_the_process_ended() -> None:
    stream, launch = _died()
    # attention started 1 ms before its last event (the stall), the rank
    # 1 ms before that; the process ended 30 s after the last event.
    result = replay(stream.events, launch=launch)
    assert blame_text(result).splitlines()[0] == (
        "30.001s attention (rank 0, still running when its log ends)"
    )
    explained = explain_text(result).splitlines()
    step = explained.index("└─ attention: still running when the log ends [>= 30.001s]")
    # Where it was last seen waiting, under it.
    assert explained[step + 1] == "      waiting in wait_for_fabric (fabric.py:42) after 2.0 s"
    assert critical_path_text(result).startswith("run incomplete +30.002s")
    # Without the launcher's record: until the last sign of life.
    assert blame_text(replay(stream.events)).splitlines()[0] == (
        "1.0ms attention (rank 0, still running when its log ends)"
    )


def test_the_critical_path_of_a_run_with_a_dead_rank_is_incomplete() -> None:
    # Rank 0 ends ready after 50 ms, the slowest; rank 1 died 2 ms in.
    slow = EventStream(run_id="died", rank=0, world_size=2).run_started()
    slow.started("load").advance(50_000_000).succeeded("load")
    dead = EventStream(run_id="died", rank=1, world_size=2).run_started()
    dead.started("load")
    result = replay(list(merge([slow.run_finished(), dead.events])))

    assert critical_path_text(result).splitlines()[:2] == [
        "run incomplete +53.0ms (rank 0, the slowest)",
        "  rank 1 did not finish: steps in flight there count until the process ended, else "
        "the last sign of life",
    ]


def test_the_dead_ranks_spans_and_report_lane_end_at_its_death() -> None:
    stream, launch = _died()
    died = launch.ended_wall_ns(0)
    assert died is not None
    attention, root = spans_from_events(stream.events, launch=launch)
    assert attention.name == "attention"
    assert (attention.end_time, root.end_time) == (died, died)
    assert spans_from_events(stream.events)[0].end_time == stream.events[-1].wall_ns

    page = report_html(replay(stream.events, launch=launch))
    step = page[page.index('data-step="attention"') :].split("</details>")[0]
    assert 'data-outcome="incomplete"' in step
    # The page's time axis runs to the death, and the step's bar with it.
    assert 'style="--l:0.00%;--w:100.00%' in step
    assert "duration &gt;= 30.00 s" in step


def test_diff_counts_no_stall_message_as_a_difference() -> None:
    def document(where: str) -> dict[str, object]:
        stalled = {
            "severity": "info",
            "code": "step.stalled",
            "ranks": [0],
            "text": f"Step process_group is still running after 10.0 s, waiting in {where}.",
        }
        return {"outcome": "ready", "messages": [stalled], "root_cause": None}

    assert run_differences(document("impl (library.py:505)"), document("inner (_ops.py:150)")) == []
    failed = document("impl (library.py:505)") | {"outcome": "failed"}
    assert run_differences(document("x (y.py:1)"), failed) == ["outcome: ready -> failed"]


def test_a_rank_stopped_in_several_steps_shows_where_the_longest_waiting_one_was() -> None:
    stream = EventStream(run_id="stopped", rank=0, tick_ns=1_000_000)
    stream.run_started()
    stream.started("attention")
    stream.started("agree")
    stream.stalled("agree", 0.5, waiting_in=FrameInfo(filename="store.py", lineno=9, name="get"))
    stream.stalled("attention", 3.0, why=StallReason.ABANDONED)
    stream.cancelled("attention")
    stream.cancelled("agree")
    events = stream.run_finished(RunOutcome.INTERRUPTED)

    state = replay(events)
    cause = state.root_cause
    assert cause is not None
    assert cause.step is None
    assert cause.waiting is not None
    assert cause.waiting.step == "attention"
    text = report_text(state)
    # The step is named: the root cause itself names none of the two.
    assert "  attention: waiting in wait_for_fabric (fabric.py:42) after 3.0 s, abandoned" in text
    assert "2 steps were in flight: attention, agree" in text
