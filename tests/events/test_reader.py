"""Reading logs back: torn tails, typed errors with line numbers, validate()."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import orjson
import pytest

import events
from events import (
    DecodeError,
    ForeignEventError,
    LogCorruptError,
    LogError,
    LogProblem,
    ProblemKind,
    SequenceGapError,
    TornTail,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from events.testing import EventStream, exception_info

from .samples import rank_stream


def lines_of(stream: list[events.Event]) -> list[bytes]:
    return [events.encode(event) for event in stream]


def write(path: Path, lines: list[bytes], tail: bytes = b"") -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)
    return path


def with_field(line: bytes, **changes: object) -> bytes:
    record = orjson.loads(line)
    record.update(changes)
    return orjson.dumps(record)


# --- torn tail ---------------------------------------------------------------------------


@pytest.mark.parametrize("length", [7, 5], ids=["ends-with-run-finished", "ends-with-cause"])
def test_torn_tail_at_every_offset_of_the_last_line(tmp_path: Path, length: int) -> None:
    stream = rank_stream()[:length]
    data = b"".join(line + b"\n" for line in lines_of(stream))
    last_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    path = tmp_path / "rank-0.jsonl"
    for cut in range(last_start, len(data) + 1):
        path.write_bytes(data[:cut])
        contents = events.read_log(path)
        assert contents.path == path
        if cut == len(data):
            assert contents.events == tuple(stream)
            assert contents.torn_tail is None
            assert contents.warnings == ()
        elif cut == last_start:
            assert contents.events == tuple(stream[:-1])
            assert contents.torn_tail is None
        else:
            assert contents.events == tuple(stream[:-1]), cut
            assert contents.torn_tail == TornTail(
                path=path, line=length, offset=last_start, length=cut - last_start
            )
            assert contents.warnings == (
                f"{path}:{length}: torn last line ({cut - last_start} bytes without a newline, "
                "from a writer that stopped mid-write) was ignored",
            )
            assert [(p.line, p.kind, p.fatal) for p in events.validate(path)] == [
                (length, ProblemKind.TORN_TAIL, False),
                (0, ProblemKind.NOT_FINISHED, False),
            ]


def test_a_whole_record_without_its_newline_is_still_torn(tmp_path: Path) -> None:
    # The writer puts the newline in the same write: without it the write
    # did not finish, however valid the bytes look.
    stream = rank_stream()
    lines = lines_of(stream)
    path = write(tmp_path / "r.jsonl", lines[:-1], tail=lines[-1])
    contents = events.read_log(path)
    assert contents.events == tuple(stream[:-1])
    assert contents.torn_tail is not None
    assert contents.torn_tail.length == len(lines[-1])


def test_empty_file_reads_as_no_events(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    contents = events.read_log(path)
    assert contents.events == ()
    assert contents.torn_tail is None


# --- typed errors naming file and line ---------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [b"#not json", b"", b'{"v":1,"type":"step.sta', b"[]", b"\xff\xfe"],
    ids=["text", "blank", "cut-record", "array", "binary"],
)
def test_garbage_mid_file(tmp_path: Path, garbage: bytes) -> None:
    lines = lines_of(rank_stream())
    lines[2] = garbage
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(path)
    error = caught.value
    assert type(error) is LogCorruptError
    assert error.path == path
    assert error.line == 3
    assert isinstance(error.__cause__, DecodeError)
    assert error.reason == error.__cause__.reason
    assert str(error) == f"{path}:3: {error.reason}"


def test_garbage_on_the_last_complete_line_is_not_a_torn_tail(tmp_path: Path) -> None:
    lines = lines_of(rank_stream())
    lines[-1] = b"oops"
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(path)
    assert caught.value.line == 7


def test_sequence_gap(tmp_path: Path) -> None:
    lines = lines_of(rank_stream())
    del lines[2]
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(SequenceGapError) as caught:
        events.read_log(path)
    error = caught.value
    assert (error.path, error.line, error.expected, error.found) == (path, 3, 2, 3)
    assert str(error) == (
        f"{path}:3: sequence gap: expected seq 2, found 3 (the log skips events; "
        "it was edited or two writers shared the file)"
    )


def test_sequence_repeat(tmp_path: Path) -> None:
    lines = lines_of(rank_stream())
    lines.insert(3, lines[2])
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(SequenceGapError) as caught:
        events.read_log(path)
    assert (caught.value.line, caught.value.expected, caught.value.found) == (4, 3, 2)
    assert "repeats" in caught.value.reason


def test_log_not_starting_at_zero(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", lines_of(rank_stream())[1:])
    with pytest.raises(SequenceGapError) as caught:
        events.read_log(path)
    assert (caught.value.line, caught.value.expected, caught.value.found) == (1, 0, 1)


@pytest.mark.parametrize(("run_id", "rank"), [("run-2", 0), ("run-1", 2)])
def test_foreign_event(tmp_path: Path, run_id: str, rank: int) -> None:
    lines = lines_of(rank_stream("run-1", 0))
    lines[3] = events.encode(rank_stream(run_id, rank)[3])
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(ForeignEventError) as caught:
        events.read_log(path)
    error = caught.value
    assert (error.path, error.line) == (path, 4)
    assert error.expected == ("run-1", 0)
    assert error.found == (run_id, rank)
    assert error.reason == (
        f"record of run {run_id!r} rank {rank} in the log of run 'run-1' rank 0"
    )


def test_unknown_version(tmp_path: Path) -> None:
    lines = lines_of(rank_stream())
    lines[1] = with_field(lines[1], v=7)
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(path)
    error = caught.value
    assert type(error) is LogCorruptError
    assert error.line == 2
    assert isinstance(error.__cause__, UnsupportedVersionError)
    assert error.__cause__.version == 7
    assert str(error) == (
        f"{path}:2: unsupported schema version 7; upgrade startup-orchestrator to read it"
    )


def test_unknown_type(tmp_path: Path) -> None:
    lines = lines_of(rank_stream())
    lines[4] = with_field(lines[4], type="step.vanished")
    path = write(tmp_path / "r.jsonl", lines)
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(path)
    assert caught.value.line == 5
    assert isinstance(caught.value.__cause__, UnknownEventTypeError)


def test_unreadable_paths(tmp_path: Path) -> None:
    with pytest.raises(LogError) as caught:
        events.read_log(tmp_path / "missing.jsonl")
    assert not isinstance(caught.value, LogCorruptError)
    assert isinstance(caught.value.__cause__, FileNotFoundError)
    with pytest.raises(LogCorruptError) as directory:
        events.read_log(tmp_path)
    assert directory.value.line == 0


@pytest.mark.parametrize(
    ("compress", "tool"),
    [(gzip.compress, "gzip"), (bz2.compress, "bzip2"), (lzma.compress, "xz")],
)
def test_a_compressed_log_is_named_as_such(
    tmp_path: Path, compress: Callable[[bytes], bytes], tool: str
) -> None:
    # As a log attached to a bug report often is: not "not valid JSON".
    log = tmp_path / "rank-0.jsonl.gz"
    log.write_bytes(compress(b"".join(line + b"\n" for line in lines_of(rank_stream()))))
    expected = f"{log}:0: is {tool}-compressed: decompress it first ({tool} -d)"
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(log)
    assert str(caught.value) == expected
    (problem,) = events.validate(log)
    assert str(problem) == expected


# --- validate ----------------------------------------------------------------------------


def test_validate_lists_every_problem(tmp_path: Path) -> None:
    stream = rank_stream("run-1", 0)
    lines = lines_of(stream)
    foreign = attrs.evolve(stream[1], run_id="run-2", seq=7, step="s7")
    damaged = [
        lines[0],
        b"#not json",  # line 2: stood where seq 1 was
        lines[2],
        with_field(lines[3], v=9),  # line 4
        with_field(lines[4], type="step.exploded"),  # line 5
        lines[6],  # line 6: seq 5 is missing
        events.encode(foreign),  # line 7
    ]
    path = write(tmp_path / "r.jsonl", damaged, tail=b'{"v":1,"ty')
    problems = events.validate(path)
    assert [(p.line, p.kind, p.fatal) for p in problems] == [
        (2, ProblemKind.BAD_RECORD, True),
        (4, ProblemKind.UNSUPPORTED_VERSION, True),
        (5, ProblemKind.UNKNOWN_TYPE, True),
        (6, ProblemKind.SEQUENCE_GAP, True),
        (7, ProblemKind.FOREIGN_EVENT, True),
        (8, ProblemKind.TORN_TAIL, False),
        (0, ProblemKind.NOT_FINISHED, False),
    ]
    assert all(problem.path == path for problem in problems)
    by_line = {problem.line: problem for problem in problems}
    assert by_line[6].message == (
        "sequence gap: expected seq 5, found 6 (the log skips events; "
        "it was edited or two writers shared the file)"
    )
    assert by_line[7].message == "record of run 'run-2' rank 0 in the log of run 'run-1' rank 0"
    assert by_line[8].message == "torn last line (10 bytes without a newline)"
    assert by_line[0].message == (
        "no run.finished event: the rank stopped after seq 7 (step.started s7)"
    )
    assert str(by_line[4]) == (
        f"{path}:4: unsupported schema version 9; upgrade startup-orchestrator to read it"
    )
    # read_log stops at the first fatal problem.
    with pytest.raises(LogCorruptError) as caught:
        events.read_log(path)
    assert caught.value.line == 2


def test_validate_a_clean_log(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", lines_of(rank_stream()))
    assert events.validate(path) == []


def test_validate_an_unfinished_log(tmp_path: Path) -> None:
    path = write(tmp_path / "r.jsonl", lines_of(rank_stream()[:4]))
    assert events.validate(path) == [
        LogProblem(
            path=path,
            line=0,
            kind=ProblemKind.NOT_FINISHED,
            message="no run.finished event: the rank stopped after seq 3 (step.succeeded platform)",
            fatal=False,
        )
    ]
    events.read_log(path)  # readable, as not fatal


def test_validate_a_log_that_does_not_start_with_run_started(tmp_path: Path) -> None:
    stream = rank_stream()[1:]
    renumbered = [attrs.evolve(event, seq=seq) for seq, event in enumerate(stream)]
    path = write(tmp_path / "r.jsonl", lines_of(renumbered))
    assert events.validate(path) == [
        LogProblem(
            path=path,
            line=1,
            kind=ProblemKind.NOT_STARTED,
            message="first event is step.started, not run.started",
            fatal=False,
        )
    ]
    assert len(events.read_log(path).events) == 6


def test_validate_an_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"")
    assert [(p.line, p.kind, p.fatal) for p in events.validate(path)] == [
        (1, ProblemKind.NOT_STARTED, False)
    ]


def test_validate_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.jsonl"
    (problem,) = events.validate(path)
    assert (problem.path, problem.line, problem.kind, problem.fatal) == (
        path,
        0,
        ProblemKind.UNREADABLE,
        True,
    )
    assert problem.message == "cannot read log: No such file or directory"
    assert str(problem) == f"{path}:0: cannot read log: No such file or directory"


def test_validate_names_a_file_it_cannot_read_once(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.jsonl"
    os.mkfifo(fifo)
    (problem,) = events.validate(fifo)
    assert problem.kind is ProblemKind.UNREADABLE
    assert str(problem) == f"{fifo}:0: is a FIFO, not a regular file; it was not read"
    (problem,) = events.validate(tmp_path)
    assert str(problem) == f"{tmp_path}:0: is a directory, not a log file"


def test_validate_names_every_event_after_run_finished(tmp_path: Path) -> None:
    stream = EventStream().run_started()
    stream.started("a").succeeded("a").run_finished()
    stream.started("late").succeeded("late")
    problems = events.validate(write(tmp_path / "r.jsonl", lines_of(stream.events)))
    assert [(p.line, p.kind, p.fatal) for p in problems] == [
        (5, ProblemKind.AFTER_FINISHED, True),
        (6, ProblemKind.AFTER_FINISHED, True),
    ]
    assert problems[1].message == (
        "step.succeeded (seq 5) after run.finished: a finished rank writes nothing more"
    )


def test_validate_accepts_a_step_that_ends_on_the_instant_it_starts(tmp_path: Path) -> None:
    # A step quicker than the monotonic clock's resolution ends when it
    # started: that is not an end before the start.
    stream = EventStream(tick_ns=0).run_started()
    stream.started("a").succeeded("a")
    assert events.validate(write(tmp_path / "r.jsonl", lines_of(stream.run_finished()))) == []


# --- the steps' tree -------------------------------------------------------------


def _written(tmp_path: Path, records: list[dict[str, object]]) -> Path:
    path = tmp_path / "rank-0.jsonl"
    path.write_bytes(b"".join(orjson.dumps(record) + b"\n" for record in records))
    return path


def _records(stream: EventStream) -> list[dict[str, object]]:
    return [orjson.loads(events.encode(event)) for event in stream.run_finished()]


def _two_steps(**started: dict[str, object]) -> list[dict[str, object]]:
    stream = EventStream().run_started()
    for step in ("a", "b"):
        stream.started(step)
    for step in ("b", "a"):
        stream.succeeded(step)
    records = _records(stream)
    for record in records:
        if record["type"] == "step.started":
            record.update(started.get(str(record["step"]), {}))
    return records


def _step_tree(tmp_path: Path, records: list[dict[str, object]]) -> list[tuple[int, str]]:
    problems = events.validate(_written(tmp_path, records))
    assert all(p.kind is ProblemKind.STEP_TREE and not p.fatal for p in problems), problems
    # Readable all the same: the views show such steps.
    assert len(events.read_log(tmp_path / "rank-0.jsonl").events) == len(records)
    return [(p.line, p.message) for p in problems]


def test_validate_names_a_span_that_is_its_own_parent(tmp_path: Path) -> None:
    records = _two_steps()
    a = next(r for r in records if r.get("step") == "a")
    a["parent_span_id"] = a["span_id"]
    assert _step_tree(tmp_path, records) == [(2, "the span of step a is its own parent")]


def test_validate_names_spans_that_are_each_others_parents(tmp_path: Path) -> None:
    records = _two_steps()
    a, b = (next(r for r in records if r.get("step") == s) for s in "ab")
    a["parent_span_id"], b["parent_span_id"] = b["span_id"], a["span_id"]
    assert _step_tree(tmp_path, records) == [
        (2, "the spans of steps a, b are each other's parents")
    ]


def test_validate_names_a_span_two_steps_share(tmp_path: Path) -> None:
    records = _two_steps()
    a, b = (next(r for r in records if r.get("step") == s) for s in "ab")
    b["span_id"] = a["span_id"]
    ((line, message),) = _step_tree(tmp_path, records)
    assert (line, message) == (3, f"step b reuses span {a['span_id']} of step a")


def test_validate_names_a_step_path_that_starts_again(tmp_path: Path) -> None:
    # A path names one step of a run (the runner refuses a child started
    # again); a crafted log may repeat one, under a span of its own.
    stream = EventStream().run_started()
    stream.started("a").succeeded("a").started("a").succeeded("a")
    assert _step_tree(tmp_path, _records(stream)) == [
        (4, "step a starts again (it started on line 2); a path names one step of a run")
    ]


def test_validate_names_a_step_that_ends_before_it_starts(tmp_path: Path) -> None:
    records = _two_steps()
    end = next(r for r in records if r["type"] == "step.succeeded" and r["step"] == "a")
    end["mono_ns"] = -2_000_000_000
    assert _step_tree(tmp_path, records) == [(5, "step a ends 2.001 s before it starts")]


@pytest.mark.parametrize(
    ("depends_on", "message"),
    [
        ({"a": {"depends_on": ["b"]}, "b": {"depends_on": ["a"]}}, "steps a, b wait on each other"),
        ({"a": {"depends_on": ["a"]}}, "step a depends on itself"),
    ],
)
def test_validate_names_dependencies_in_a_cycle(
    tmp_path: Path, depends_on: dict[str, dict[str, object]], message: str
) -> None:
    ((line, found),) = _step_tree(tmp_path, _two_steps(**depends_on))
    assert line == 0
    assert found.startswith(message)


def test_a_long_chain_of_dependencies_is_no_problem(tmp_path: Path) -> None:
    stream = EventStream().run_started()
    for index in range(2_000):
        stream.started(f"s{index}", depends_on=[f"s{index - 1}"] if index else [])
        stream.succeeded(f"s{index}")
    assert events.validate(_written(tmp_path, _records(stream))) == []


NO_DEVICE = exception_info(
    "RuntimeError",
    "no device found",
    frames=[events.FrameInfo(filename="/opt/lib/probe.py", lineno=3812, name="probe")],
)


def test_ranks_read_share_their_texts_and_frames(tmp_path: Path) -> None:
    # A run's ranks repeat each other's steps, reasons and results: a text
    # read from two logs is one object, so a large run's memory does not
    # hold it once per rank.
    def log(rank: int) -> Path:
        stream = EventStream(rank=rank, world_size=2).run_started()
        stream.started("loader", attributes={"plugins": ["acme", {"name": "zeta"}]})
        stream.unavailable("loader", reasons=["no device found"], cause=NO_DEVICE)
        stream.started("model")
        stream.succeeded("model", {"backend": "nccl", "tried": [{"name": "mnnvl"}]})
        return write(tmp_path / f"rank-{rank}.jsonl", lines_of(stream.run_finished()))

    first, second = (events.read_log(log(rank)).events for rank in (0, 1))
    assert first[1].step is second[1].step
    assert first[2].reasons[0] is second[2].reasons[0]
    assert first[2].cause == second[2].cause == NO_DEVICE
    assert first[2].cause.frames[0] is second[2].cause.frames[0]
    one, other = first[4].result, second[4].result
    assert isinstance(one, dict)
    assert isinstance(other, dict)
    assert one == other == {"backend": "nccl", "tried": [{"name": "mnnvl"}]}
    assert one["backend"] is other["backend"]
    assert one["tried"][0]["name"] is other["tried"][0]["name"]
    plugins = first[1].attributes["plugins"], second[1].attributes["plugins"]
    assert plugins[0][1]["name"] is plugins[1][1]["name"]
