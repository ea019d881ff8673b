"""Logs alike: :class:`events.LogReader` reads what :func:`events.read_log`
reads, notes the logs that differ only in the rank's own values, and replay
of those (each shape folded once, each rank's own values put back) is the
replay of every rank folded.

The logs are real files written by the codec's encoder. The ranks' own
values (rank, place, host, pid, times, span ids) are changed the way a
launch changes them; anything else that differs, down to a ``1`` that
another rank wrote as ``true``, makes the logs not alike.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events
from events import (
    Event,
    LogContents,
    LogCorruptError,
    LogReader,
    RunStarted,
    Slice,
    encode,
    read_log,
    replay,
)

from .strategies import streams

PROPERTY = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)


def as_rank(stream: Sequence[Event], rank: int, *, seed: int) -> list[Event]:
    """``stream`` as rank ``rank`` of a launch would have written it: its
    rank, place, host and pid, times shifted and stretched, and every span
    id replaced by one of its own (the spans' structure kept)."""
    spans: dict[str, str] = {}
    chance = random.Random(seed)

    def span(value: str) -> str:
        return spans.setdefault(value, f"{chance.getrandbits(64):016x}")

    shift = chance.randrange(1, 10**9)
    made = []
    for event in stream:
        changes: dict[str, Any] = {
            "rank": rank,
            "wall_ns": event.wall_ns // 2 + shift,
            "mono_ns": event.mono_ns // 2 + shift,
            "span_id": span(event.span_id),
            "parent_span_id": None if event.parent_span_id is None else span(event.parent_span_id),
        }
        if isinstance(event, RunStarted):
            changes["identity"] = attrs.evolve(
                event.identity, rank=rank, local_rank=rank % 8, node_rank=rank // 8
            )
            changes["host"] = f"node-{rank // 8}"
            changes["pid"] = 4000 + rank
        made.append(attrs.evolve(event, **changes))
    return made


def write(directory: Path, stream: Sequence[Event]) -> Path:
    path = directory / f"rank-{stream[0].rank}.jsonl"
    path.write_bytes(b"".join(encode(event) + b"\n" for event in stream))
    return path


def read_both(paths: Sequence[Path]) -> tuple[list[LogContents], list[LogContents]]:
    """Each log read alone, and all of them by one reader; the events must
    be the same, of the same types."""
    alone = [read_log(path) for path in paths]
    reader = LogReader()
    together = [reader.read(path) for path in paths]
    for one, other in zip(alone, together, strict=True):
        assert one.events == other.events
        assert [type(e) for e in one.events] == [type(e) for e in other.events]
        assert one.torn_tail == other.torn_tail
    return alone, together


def assert_same_replay(
    alone: Sequence[LogContents], together: Sequence[LogContents], slices: Sequence[Slice]
) -> None:
    from exporters import report_json, report_text

    a = replay(alone, slices=slices)
    b = replay(together, slices=slices)
    assert a.states == b.states
    assert dict(a.message_state.ranks) == dict(b.message_state.ranks)
    assert a.messages == b.messages
    assert a.grouped == b.grouped
    assert dict(a.timeline.ranks) == dict(b.timeline.ranks)
    assert a.root_cause == b.root_cause
    assert a.divergences == b.divergences
    assert report_text(a) == report_text(b)
    assert report_json(a) == report_json(b)


def _engine() -> tuple[Slice, ...]:
    from orchestrator.engine import ENGINE

    return (ENGINE,)


@PROPERTY
@given(
    stream=streams(max_size=12),
    other=streams(max_size=12),
    ranks=st.integers(2, 5),
    odd=st.integers(0, 5),
    engine=st.booleans(),
)
def test_logs_alike_share_a_shape_and_replay_as_every_rank_folded(
    tmp_path_factory: pytest.TempPathFactory,
    stream: list[Event],
    other: list[Event],
    ranks: int,
    odd: int,
    engine: bool,
) -> None:
    if not stream:
        return
    directory = tmp_path_factory.mktemp("alike")
    logs = [as_rank(stream, rank, seed=rank) for rank in range(ranks)]
    if odd < ranks and other:
        # One rank wrote something else: of the same run, any events.
        logs[odd] = as_rank([attrs.evolve(e, run_id=stream[0].run_id) for e in other], odd, seed=99)
    alone, together = read_both([write(directory, log) for log in logs])
    alike = [c for rank, c in enumerate(together) if rank != odd or not other]
    # The first log of a kind is what its shape is made of, once a second
    # log of its length comes: the logs alike after it share the shape.
    if len(alike) > 1:
        assert alike[1].shape is not None
        assert all(c.shape is alike[1].shape for c in alike[1:])
    assert_same_replay(alone, together, _engine() if engine else ())


def test_a_run_of_engine_ranks_is_read_as_a_few_shapes(tmp_path: Path) -> None:
    from tests.orchestrator.engine.streams import healthy_rank
    from tests.orchestrator.engine.test_state import dead_rank, failed_rank

    streams_ = [healthy_rank(rank, world_size=64) for rank in range(64)]
    streams_[5] = failed_rank(5, offset_ns=3)
    streams_[40] = dead_rank(40, offset_ns=9, world_size=64)
    logs = [as_rank(s, s[0].rank, seed=s[0].rank) for s in streams_]
    alone, together = read_both([write(tmp_path, log) for log in logs])
    # The healthy ranks after the first share a shape; rank 5 and rank 40
    # are like no other rank.
    healthy = [c for c in together[1:] if c.events[0].rank not in (5, 40)]
    assert healthy[0].shape is not None
    assert all(c.shape is healthy[0].shape for c in healthy)
    assert together[5].shape is None
    assert together[40].shape is None
    assert_same_replay(alone, together, _engine())
    # Cut short anywhere, the ranks are still alike.
    for until in (0, 3, 17):
        a = replay(alone, slices=_engine(), until=until)
        b = replay(together, slices=_engine(), until=until)
        assert a.states == b.states
        assert a.messages == b.messages


# -- what is not alike ------------------------------------------------------


def _pair(tmp_path: Path) -> tuple[list[Event], bytes, Path]:
    """Rank 0 of an engine run, written; rank 1's log as bytes to edit."""
    from tests.orchestrator.engine.streams import healthy_rank

    stream = healthy_rank(0, world_size=2)
    write(tmp_path, stream)
    other = as_rank(stream, 1, seed=1)
    return other, b"".join(encode(event) + b"\n" for event in other), tmp_path / "rank-1.jsonl"


def _edited(tmp_path: Path, old: bytes, new: bytes, *, count: int = 1) -> list[LogContents]:
    _other, data, path = _pair(tmp_path)
    assert data.count(old) >= count, old
    path.write_bytes(data.replace(old, new, count))
    _alone, together = read_both([tmp_path / "rank-0.jsonl", path])
    return together


@pytest.mark.parametrize(
    ("old", "new"),
    [
        # A JSON value of another type that Python finds equal.
        (b'"builtin":true', b'"builtin":1'),
        (b'"priority":0', b'"priority":0.0'),
        (b'"priority":1', b'"priority":true'),
        # The same value written another way.
        (b'"plugin":"cuda"', b'"plugin":"\\u0063uda"'),
        # Another step.
        (b'"step":"attention/FLASH_ATTN"', b'"step":"attention/FLASH_ATTx"'),
    ],
)
def test_a_line_that_differs_in_anything_else_is_read_as_written_and_not_alike(
    tmp_path: Path, old: bytes, new: bytes
) -> None:
    _first, second = _edited(tmp_path, old, new)
    assert second.shape is None


def test_fields_in_another_order_are_read_as_written(tmp_path: Path) -> None:
    # The payload before the envelope's end: the same event, not the same
    # bytes after the cut.
    _other, data, path = _pair(tmp_path)
    lines = data.split(b"\n")
    line = lines[3]
    head, _, payload = line.rpartition(b',"parent_span_id":')
    parent, _, rest = payload.partition(b",")
    lines[3] = head + b"," + rest[:-1] + b',"parent_span_id":' + parent + b"}"
    path.write_bytes(b"\n".join(lines))
    read_both([tmp_path / "rank-0.jsonl", path])


def test_a_field_written_twice_reads_as_the_decoder_reads_it(tmp_path: Path) -> None:
    # A payload field also before the cut: the last one counts, for the
    # reader as for the decoder.
    _other, data, path = _pair(tmp_path)
    lines = data.split(b"\n")
    assert b'"attributes":' in lines[2]
    lines[2] = lines[2].replace(b'"trace_id"', b'"attributes":{"plugin":"x"},"trace_id"')
    path.write_bytes(b"\n".join(lines))
    _alone, (first, second) = read_both([tmp_path / "rank-0.jsonl", path])
    assert second.events[2].attributes == first.events[2].attributes
    assert second.shape is not None  # alike all the same


def test_a_record_with_an_unknown_field_fails_as_read_log_fails(tmp_path: Path) -> None:
    _other, data, path = _pair(tmp_path)
    path.write_bytes(data.replace(b'"trace_id"', b'"colour":"red","trace_id"', 2))
    reader = LogReader()
    reader.read(tmp_path / "rank-0.jsonl")
    with pytest.raises(LogCorruptError) as alone:
        read_log(path)
    with pytest.raises(LogCorruptError) as together:
        reader.read(path)
    assert str(together.value) == str(alone.value)


def test_a_step_under_another_parent_is_not_alike(tmp_path: Path) -> None:
    # Rank 1's first probe hangs under its own root span instead of under
    # the platform step: the same bytes after the cut, another tree.
    other, data, path = _pair(tmp_path)
    probe = other[4]
    root = other[0].span_id
    assert probe.parent_span_id != root
    line = encode(probe)
    moved = line.replace(
        f'"parent_span_id":"{probe.parent_span_id}"'.encode(), f'"parent_span_id":"{root}"'.encode()
    )
    path.write_bytes(data.replace(line, moved))
    _alone, (_first, second) = read_both([tmp_path / "rank-0.jsonl", path])
    assert second.shape is None


def test_a_slice_whose_hooks_read_the_rank_folds_every_rank(tmp_path: Path) -> None:
    # A slice with a hook is folded rank by rank unless it says its hooks
    # never read the rank's own values.
    from tests.orchestrator.engine.streams import healthy_rank

    def parity(facts: Any, event: Event) -> dict[str, Any] | None:
        return {"parity": event.rank % 2} if isinstance(event, events.StepSucceeded) else None

    reading = Slice(name="parity", facts={"parity": None}, derive_facts=parity)
    assert not reading.rank_independent
    assert Slice(name="plain").rank_independent
    assert attrs.evolve(reading, hooks_rank_independent=True).rank_independent

    reader = LogReader()
    contents = [
        reader.read(write(tmp_path, as_rank(healthy_rank(0, world_size=4), r, seed=r)))
        for r in range(4)
    ]
    assert contents[1].shape is not None
    assert len({id(c.shape) for c in contents[1:]}) == 1
    result = replay(contents, slices=(*_engine(), reading))
    assert [result.states[r].facts["parity"] for r in range(4)] == [0, 1, 0, 1]


def test_events_beside_a_rank_s_log_are_not_taken_as_alike(tmp_path: Path) -> None:
    # Each rank's log is alike, but more events of two ranks are passed
    # beside them, different ones: those ranks are folded from all their
    # events, as without a shape.
    from tests.orchestrator.engine.streams import exception, healthy_rank

    logs = [as_rank(healthy_rank(0, world_size=4), rank, seed=rank) for rank in range(4)]
    _alone, together = read_both([write(tmp_path, log) for log in logs])
    assert together[1].shape is together[3].shape is not None
    boom = exception("RuntimeError", "late")
    after_one = attrs.evolve(logs[1][-2], seq=len(logs[1]), step="late")
    after_three = events.StepFailed(
        run_id=logs[3][0].run_id,
        rank=3,
        seq=len(logs[3]),
        wall_ns=logs[3][-1].wall_ns + 1,
        mono_ns=logs[3][-1].mono_ns + 1,
        step="platform",
        cause=boom,
    )
    result = replay([*together, after_one, after_three], slices=_engine())
    each = replay(
        [together[0], [*logs[1], after_one], together[2], [*logs[3], after_three]],
        slices=_engine(),
    )
    assert result.states == each.states
    assert result.messages == each.messages
    assert dict(result.timeline.ranks) == dict(each.timeline.ranks)
    # Out of order beside the log: the order check still sees it.
    late = attrs.evolve(after_three, seq=len(logs[3]) + 5)
    with pytest.raises(events.FoldError):
        replay([*together, late], slices=_engine())
