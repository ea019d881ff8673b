"""Property-based tests: the codec and the file log lose nothing.

Invariant 2 of the architecture: ``reduce(read(write(events))) == reduce(events)``.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events

from .strategies import BY_TYPE, EVENTS, EXCEPTION_INFOS, streams

#: Modest and reproducible: the same 50 examples on every run (derandomize),
#: no per-example deadline and no generation-speed health check, so a busy
#: 2-core CI machine cannot make these tests flaky.
PROPERTY = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


class Count:
    """A second projection for the composite: events seen per type tag."""

    def initial(self) -> dict[str, int]:
        return {}

    def apply(self, state: dict[str, int], event: events.Event) -> dict[str, int]:
        return {**state, event.TYPE: state.get(event.TYPE, 0) + 1}

    def apply_many(self, state: dict[str, int], stream: Iterable[events.Event]) -> dict[str, int]:
        for event in stream:
            state = self.apply(state, event)
        return state


@PROPERTY
@given(event=EVENTS)
def test_every_event_round_trips_through_the_codec(event: events.Event) -> None:
    line = events.encode(event)
    assert b"\n" not in line
    decoded = events.decode(line)
    assert type(decoded) is type(event)
    assert decoded == event
    record = orjson.loads(line)
    assert record["v"] == events.SCHEMA_VERSION
    assert record["type"] == event.TYPE
    assert list(record)[:2] == ["v", "type"]
    assert events.encode(decoded) == line


@PROPERTY
@given(data=st.data())
@pytest.mark.slow
def test_each_event_type_round_trips(data: st.DataObject) -> None:
    # One example of every type per run, so no type depends on luck.
    for tag, strategy in BY_TYPE.items():
        event = data.draw(strategy, label=tag)
        assert tag == event.TYPE
        assert events.decode(events.encode(event)) == event


@PROPERTY
@given(info=EXCEPTION_INFOS)
def test_exception_trees_round_trip(info: events.ExceptionInfo) -> None:
    event = events.StepFailed(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", cause=info)
    decoded = events.decode(events.encode(event))
    assert isinstance(decoded, events.StepFailed)
    assert decoded.cause == info
    assert decoded.cause.format() == info.format()


@PROPERTY
@given(stream=streams())
def test_streams_round_trip_through_records_and_fold_alike(stream: list[events.Event]) -> None:
    records: list[dict[str, Any]] = [orjson.loads(events.encode(e)) for e in stream]
    decoded = [events.decode_record(record) for record in records]
    assert decoded == stream
    assert events.fold(events.Timeline(), decoded) == events.fold(events.Timeline(), stream)


@PROPERTY
@given(stream=streams())
@pytest.mark.slow
def test_streams_round_trip_through_a_jsonl_file(stream: list[events.Event]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "rank.jsonl"
        run_id = stream[0].run_id if stream else "run"
        rank = stream[0].rank if stream else 0
        with events.JsonlLog(path, run_id=run_id, rank=rank, durability="never") as log:
            for expected_seq, event in enumerate(stream):
                assert log.append(event) == expected_seq
            assert list(log.read()) == stream
        contents = events.read_log(path)
        assert contents.torn_tail is None
        assert list(contents.events) == stream
        both = events.Composite(timeline=events.Timeline(), count=Count())
        assert events.fold(both, contents.events) == events.fold(both, stream)
        assert events.fold(events.Timeline(), contents.events) == events.fold(
            events.Timeline(), stream
        )
        # The file is exactly one encoded line per event.
        lines = path.read_bytes().splitlines()
        assert lines == [events.encode(event) for event in stream]


@PROPERTY
@given(stream=streams())
@pytest.mark.slow
def test_streams_round_trip_through_a_memory_log(stream: list[events.Event]) -> None:
    run_id = stream[0].run_id if stream else "run"
    rank = stream[0].rank if stream else 0
    log = events.MemoryLog(run_id, rank)
    for event in stream:
        log.append(attrs_without_seq(event))
    assert list(log.events) == stream
    assert events.fold(events.Timeline(), log.read()) == events.fold(events.Timeline(), stream)


def attrs_without_seq(event: events.Event) -> events.Event:
    """The event as a producer builds it: the log assigns ``seq``."""
    return attrs.evolve(event, seq=-1)


@PROPERTY
@given(event=EVENTS, seq=st.integers(0, 2**40))
def test_a_logs_line_is_the_events_encoding(event: events.Event, seq: int) -> None:
    # A log writes its lines with encoders of its own, which leave enums,
    # tuples and dicts to orjson; the bytes and the stored event are what
    # encode() and evolve() give.
    from events._codec import LINE_ENCODERS

    expected = attrs.evolve(event, seq=seq)
    assert orjson.dumps(LINE_ENCODERS[event.TYPE](event)) == events.encode(event)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "log.jsonl"
        with events.JsonlLog(path, run_id=event.run_id, rank=event.rank) as log:
            log.append(event)
            log.append(expected)
            stored = tuple(log.read())
        assert path.read_bytes().splitlines() == [
            events.encode(attrs.evolve(event, seq=0)),
            events.encode(attrs.evolve(event, seq=1)),
        ]
        assert stored == (attrs.evolve(event, seq=0), attrs.evolve(event, seq=1))
