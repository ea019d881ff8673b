"""Merging ranks' logs: three real processes, one ordered stream."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

import events
from events import LogError, RunOutcome

from .samples import rank_stream

REPO = Path(__file__).resolve().parents[2]

#: Each process writes the sample stream of its rank. All ranks share the same
#: wall-clock times, so the merge order rests on the (rank, seq) tie-break.
WRITER = """
import sys
from pathlib import Path

import events
from tests.events.samples import rank_stream

directory, run_id, rank = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
path = directory / f"rank-{rank}.jsonl"
with events.JsonlLog(path, run_id=run_id, rank=rank, durability="always") as log:
    for event in rank_stream(run_id, rank):
        log.append(event)
"""


def write_ranks_in_processes(directory: Path, run_id: str, ranks: range) -> list[Path]:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(directory), run_id, str(rank)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in ranks
    ]
    for process in processes:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
        assert out == b""
    return [directory / f"rank-{rank}.jsonl" for rank in ranks]


@pytest.mark.slow
def test_three_processes_merge_into_one_ordered_stream(tmp_path: Path) -> None:
    paths = write_ranks_in_processes(tmp_path, "run-1", range(3))
    contents = [events.read_log(path) for path in paths]
    for rank, content in enumerate(contents):
        assert content.torn_tail is None
        assert content.events == tuple(rank_stream("run-1", rank))
        assert events.validate(content.path) == []

    merged = list(events.merge(contents))
    everything = [event for content in contents for event in content.events]
    assert len(merged) == len(everything) == 21
    assert sorted(merged, key=id) == sorted(everything, key=id)
    keys = [(event.wall_ns, event.rank, event.seq) for event in merged]
    assert keys == sorted(keys)
    # Ties on the wall clock: rank 0, 1, 2 at each instant.
    assert [(event.rank, event.seq) for event in merged[:6]] == [
        (0, 0),
        (1, 0),
        (2, 0),
        (0, 1),
        (1, 1),
        (2, 1),
    ]
    for rank in range(3):
        assert [e.seq for e in merged if e.rank == rank] == list(range(7))

    state = events.fold(events.Timeline(), merged)
    assert sorted(state.ranks) == [0, 1, 2]
    for rank in range(3):
        timeline = state.ranks[rank]
        assert timeline.outcome is RunOutcome.READY
        assert timeline.duration_ns == 600
        assert timeline.steps["platform"].outcome is events.Outcome.OK
    # Merging is a pure function of the logs: the same result from the
    # paths' contents in any order.
    assert list(events.merge(reversed(contents))) == merged


def test_merge_keeps_each_ranks_order_when_its_clock_steps_back() -> None:
    steady = rank_stream("run-1", 0, wall_ns=1_000)
    stepped = rank_stream("run-1", 1, wall_ns=1_000)
    # Rank 1's wall clock jumps back by a second before its fourth event.
    stepped = [
        attrs.evolve(event, wall_ns=event.wall_ns - 1_000 if event.seq >= 3 else event.wall_ns)
        for event in stepped
    ]
    merged = list(events.merge([steady, stepped]))
    assert len(merged) == 14
    for rank in (0, 1):
        assert [e.seq for e in merged if e.rank == rank] == list(range(7))
    events.fold(events.Timeline(), merged)  # a valid order for the fold


def test_merge_breaks_a_tie_on_the_wall_clock_by_rank_before_seq() -> None:
    # Rank 1 starts two ticks after rank 0: its seq 0 and rank 0's seq 2
    # share an instant, and rank 0's comes first.
    merged = list(events.merge([rank_stream("run-1", 1, wall_ns=1_020), rank_stream("run-1", 0)]))
    assert [(event.rank, event.seq) for event in merged[:7]] == [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (0, 3),
        (1, 1),
        (0, 4),
    ]


def test_merge_accepts_plain_event_streams_and_skips_empty_ones(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    merged = list(
        events.merge([iter(rank_stream("run-1", 1)), events.read_log(empty), rank_stream()])
    )
    assert [(e.rank, e.seq) for e in merged[:2]] == [(0, 0), (1, 0)]
    assert len(merged) == 14


def test_merging_two_logs_of_one_rank_is_refused(tmp_path: Path) -> None:
    (path,) = write_logs(tmp_path, "run-1", [0])
    contents = events.read_log(path)
    with pytest.raises(LogError, match="two logs for rank 0") as caught:
        events.merge([contents, contents])
    assert str(path) in str(caught.value)


def test_replaying_one_log_twice_is_refused_as_two_logs_of_its_rank(tmp_path: Path) -> None:
    (path,) = write_logs(tmp_path, "run-1", [0])
    contents = events.read_log(path)
    for twice, owners in (
        ([contents, contents], f"{path} and {path}"),
        ([contents.events, contents.events], "event stream 0 and event stream 1"),
    ):
        with pytest.raises(LogError) as caught:
            events.replay(twice)
        assert str(caught.value) == f"two logs for rank 0 ({owners}); pass one log per rank"


def test_merging_logs_of_different_runs_is_refused(tmp_path: Path) -> None:
    paths = write_logs(tmp_path / "a", "run-a", [0]) + write_logs(tmp_path / "b", "run-b", [1])
    with pytest.raises(LogError) as caught:
        events.merge([events.read_log(path) for path in paths])
    assert str(caught.value) == "logs of different runs cannot be merged: run-a, run-b"


def test_one_log_or_a_path_where_a_list_goes_is_named(tmp_path: Path) -> None:
    # Iterated, a path would be taken apart into characters and one log
    # refused as not iterable, far from what was meant.
    (path,) = write_logs(tmp_path, "run-1", [0])
    contents = events.read_log(path)
    for function, name in ((events.merge, "logs"), (events.replay, "source")):
        with pytest.raises(TypeError) as caught:
            function(contents)  # type: ignore[operator]
        assert str(caught.value) == (
            f"{name} is the log {path}, not a list of logs or events: "
            "pass [events.read_log(path), ...], one per rank"
        )
        for given in (path, str(path)):
            with pytest.raises(TypeError, match=f"^{name} is {re.escape(repr(given))}, not a list"):
                function(given)  # type: ignore[operator]
    assert events.replay([contents]).outcome is RunOutcome.INCOMPLETE


def write_logs(directory: Path, run_id: str, ranks: list[int]) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in ranks:
        path = directory / f"rank-{rank}.jsonl"
        with events.JsonlLog(path, run_id=run_id, rank=rank, durability="never") as log:
            for event in rank_stream(run_id, rank):
                log.append(event)
        paths.append(path)
    return paths
