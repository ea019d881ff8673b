"""One contract suite, run against every EventLog implementation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import events
from events import EventLog, LogClosedError, StreamMismatchError

from .samples import numbered, rank_stream

MakeLog = Callable[..., EventLog]


@pytest.fixture(params=["memory", "jsonl"])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeLog]:
    """A factory ``(run_id="run-1", rank=0) -> EventLog`` for each implementation."""
    made: list[EventLog] = []

    def make(run_id: str = "run-1", rank: int = 0) -> EventLog:
        log: EventLog
        if request.param == "memory":
            log = events.MemoryLog(run_id, rank)
        else:
            path = tmp_path / f"{run_id}-{rank}-{len(made)}.jsonl"
            log = events.JsonlLog(path, run_id=run_id, rank=rank, durability="never")
        made.append(log)
        return log

    yield make
    for log in made:
        log.close()


def test_is_an_event_log(make_log: MakeLog) -> None:
    log = make_log()
    assert isinstance(log, EventLog)
    assert log.run_id == "run-1"
    assert log.rank == 0
    assert log.next_seq == 0
    assert list(log.read()) == []


def test_append_assigns_gapless_seq_from_zero(make_log: MakeLog) -> None:
    log = make_log("run-1", 3)
    stream = rank_stream("run-1", 3)
    for expected, event in enumerate(stream):
        # Whatever seq the producer put on the event, the log assigns its own.
        assert log.append(event) == expected
        assert log.next_seq == expected + 1
    assert list(log.read()) == stream
    drafts = numbered("run-1", 3, 3)
    assert [event.seq for event in drafts] == [-1, -1, -1]
    assert [log.append(event) for event in drafts] == [7, 8, 9]
    assert [event.seq for event in log.read()] == list(range(10))


def test_read_from_a_seq(make_log: MakeLog) -> None:
    log = make_log()
    stream = rank_stream()
    for event in stream:
        log.append(event)
    assert list(log.read(4)) == stream[4:]
    assert list(log.read(0)) == stream
    assert list(log.read(-5)) == stream
    assert list(log.read(len(stream))) == []
    assert list(log.read(100)) == []


def test_appending_never_changes_earlier_events(make_log: MakeLog) -> None:
    log = make_log()
    stream = rank_stream()
    for event in stream[:3]:
        log.append(event)
    before = list(log.read())
    for event in stream[3:]:
        log.append(event)
    assert list(log.read())[:3] == before == stream[:3]


def test_subscribers_see_every_event_in_order(make_log: MakeLog) -> None:
    log = make_log()
    first: list[events.Event] = []
    second: list[int] = []
    log.subscribe(first.append)
    log.subscribe(lambda event: second.append(event.seq))
    stream = rank_stream()
    for event in stream:
        log.append(event)
        # Delivered before append returned.
        assert first[-1] == event
    assert first == stream
    assert second == list(range(len(stream)))


def test_subscribe_from_seq_replays_without_gap_or_repeat(make_log: MakeLog) -> None:
    log = make_log()
    stream = rank_stream()
    for event in stream[:4]:
        log.append(event)
    seen: list[events.Event] = []
    log.subscribe(seen.append, from_seq=1)
    assert seen == stream[1:4]
    for event in stream[4:]:
        log.append(event)
    assert seen == stream[1:]
    everything: list[events.Event] = []
    log.subscribe(everything.append, from_seq=0)
    assert everything == stream
    late: list[events.Event] = []
    log.subscribe(late.append, from_seq=50)
    assert late == []


def test_closing_a_subscription_stops_delivery(make_log: MakeLog) -> None:
    log = make_log()
    seen: list[int] = []
    stream = rank_stream()
    with log.subscribe(lambda event: seen.append(event.seq)):
        log.append(stream[0])
    subscription = log.subscribe(lambda event: seen.append(-event.seq))
    log.append(stream[1])
    subscription.close()
    subscription.close()  # harmless
    log.append(stream[2])
    assert seen == [0, -1]
    assert log.next_seq == 3


def test_a_failing_subscriber_does_not_starve_the_others(make_log: MakeLog) -> None:
    log = make_log()
    seen: list[int] = []

    def broken(event: events.Event) -> None:
        raise RuntimeError(f"consumer broke on {event.seq}")

    log.subscribe(broken)
    log.subscribe(lambda event: seen.append(event.seq))
    with pytest.raises(RuntimeError, match="consumer broke on 0"):
        log.append(rank_stream()[0])
    assert seen == [0]
    assert log.next_seq == 1
    assert [event.seq for event in log.read()] == [0]


def test_of_several_failing_subscribers_the_first_error_is_raised(make_log: MakeLog) -> None:
    log = make_log()
    seen: list[int] = []

    def broken(name: str) -> Callable[[events.Event], None]:
        def consume(event: events.Event) -> None:
            seen.append(event.seq)
            raise RuntimeError(f"{name} broke on {event.seq}")

        return consume

    log.subscribe(broken("first"))
    log.subscribe(broken("second"))
    with pytest.raises(RuntimeError) as caught:
        log.append(rank_stream()[0])
    assert str(caught.value) == "first broke on 0"
    assert seen == [0, 0]


def test_closing_a_subscription_twice_leaves_another_of_the_same_callback(
    make_log: MakeLog,
) -> None:
    log = make_log()
    seen: list[events.Event] = []
    stream = rank_stream()
    log.subscribe(seen.append)
    second = log.subscribe(seen.append)
    log.append(stream[0])
    second.close()
    second.close()
    log.append(stream[1])
    assert seen == [stream[0], stream[0], stream[1]]


@pytest.mark.parametrize(("run_id", "rank"), [("other-run", 0), ("run-1", 1)])
def test_an_event_of_another_stream_is_refused(make_log: MakeLog, run_id: str, rank: int) -> None:
    log = make_log("run-1", 0)
    log.append(rank_stream("run-1", 0)[0])
    with pytest.raises(StreamMismatchError) as caught:
        log.append(rank_stream(run_id, rank)[1])
    assert caught.value.expected == ("run-1", 0)
    assert caught.value.found == (run_id, rank)
    assert log.next_seq == 1
    assert isinstance(caught.value, events.LogError)


def test_append_after_close_is_refused(make_log: MakeLog) -> None:
    log = make_log()
    stream = rank_stream()
    log.append(stream[0])
    log.close()
    log.close()  # harmless
    with pytest.raises(LogClosedError):
        log.append(stream[1])
    assert log.next_seq == 1
    assert list(log.read()) == stream[:1]
    log.flush()  # harmless too


def test_context_manager_closes(make_log: MakeLog) -> None:
    log = make_log()
    with log as entered:  # type: ignore[attr-defined]
        assert entered is log
        log.append(rank_stream()[0])
    with pytest.raises(LogClosedError):
        log.append(rank_stream()[1])
