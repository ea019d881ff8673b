"""JsonlLog beyond the contract: files, reopening, durability, short writes."""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path

import pytest

import events
from events import Durability, JsonlLog, LogClosedError, LogCorruptError, StreamMismatchError

from .samples import rank_stream


class RecordingOs:
    """Stands in for ``os`` inside ``events._log`` only: records fsyncs and
    can cut writes short or fail them. Everything else is the real ``os``."""

    def __init__(self) -> None:
        self.fsyncs: list[str] = []
        self.max_write: int | None = None
        self.fail_writes: OSError | None = None
        #: Writes that go through before ``fail_writes`` takes effect.
        self.writes_before_failing = 0
        self.writes = 0

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def fsync(self, fd: int) -> None:
        self.fsyncs.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        os.fsync(fd)

    def write(self, fd: int, data: bytes | memoryview) -> int:
        self.writes += 1
        if self.fail_writes is not None and self.writes > self.writes_before_failing:
            raise self.fail_writes
        if self.max_write is not None:
            data = data[: self.max_write]
        return os.write(fd, data)


class FakeClock:
    """Stands in for ``time`` inside ``events._log``."""

    def __init__(self) -> None:
        self.now_ns = 0

    def monotonic_ns(self) -> int:
        return self.now_ns


@pytest.fixture
def recording_os(monkeypatch: pytest.MonkeyPatch) -> RecordingOs:
    fake = RecordingOs()
    monkeypatch.setattr(events._log, "os", fake)
    return fake


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(events._log, "time", fake)
    return fake


def test_one_line_per_event(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    stream = rank_stream()
    with JsonlLog(path, run_id="run-1", rank=0, durability="never") as log:
        assert log.path == path
        assert log.durability is Durability.NEVER
        for event in stream:
            log.append(event)
    assert path.read_bytes() == b"".join(events.encode(event) + b"\n" for event in stream)
    assert stat.S_IMODE(path.stat().st_mode) & 0o600 == 0o600


def test_directory_is_fsynced_when_the_file_is_created(
    tmp_path: Path, recording_os: RecordingOs
) -> None:
    path = tmp_path / "rank-0.jsonl"
    JsonlLog(path, run_id="run-1", durability="never").close()
    assert recording_os.fsyncs == ["dir"]
    recording_os.fsyncs.clear()
    # An existing (even empty) file is not created again.
    JsonlLog(path, run_id="run-1", durability="never").close()
    assert recording_os.fsyncs == []


def test_missing_directory_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        JsonlLog(tmp_path / "no" / "such" / "dir.jsonl", run_id="run-1")


@pytest.mark.parametrize(
    ("durability", "interval_ms", "after_appends", "after_close"),
    [
        ("always", 200.0, 7, 7),
        ("interval", 0.0, 7, 7),
        ("interval", 1e9, 0, 1),
        ("never", 200.0, 0, 0),
    ],
)
def test_fsyncs_per_policy(
    tmp_path: Path,
    recording_os: RecordingOs,
    durability: str,
    interval_ms: float,
    after_appends: int,
    after_close: int,
) -> None:
    log = JsonlLog(
        tmp_path / "r.jsonl", run_id="run-1", durability=durability, interval_ms=interval_ms
    )
    recording_os.fsyncs.clear()  # the directory's
    for event in rank_stream():
        log.append(event)
    assert recording_os.fsyncs == ["file"] * after_appends
    log.close()
    assert recording_os.fsyncs == ["file"] * after_close


def test_interval_policy_syncs_at_most_once_per_interval(
    tmp_path: Path, recording_os: RecordingOs, clock: FakeClock
) -> None:
    log = JsonlLog(tmp_path / "r.jsonl", run_id="run-1", durability="interval", interval_ms=100)
    recording_os.fsyncs.clear()
    synced_after: list[int] = []
    ms = 1_000_000
    for event, now in zip(rank_stream(), [10, 50, 99, 100, 150, 200, 250], strict=True):
        clock.now_ns = now * ms
        log.append(event)
        synced_after.append(len(recording_os.fsyncs))
    # Synced on the first append at least 100 ms after the previous sync.
    assert synced_after == [0, 0, 0, 1, 1, 2, 2]
    log.close()  # the events since 250 ms are flushed at close
    assert len(recording_os.fsyncs) == 3


def test_flush_syncs_whatever_the_policy(tmp_path: Path, recording_os: RecordingOs) -> None:
    log = JsonlLog(tmp_path / "r.jsonl", run_id="run-1", durability="never")
    recording_os.fsyncs.clear()
    log.flush()
    assert recording_os.fsyncs == []  # nothing to sync
    log.append(rank_stream()[0])
    log.flush()
    log.flush()
    assert recording_os.fsyncs == ["file"]
    log.close()
    log.flush()  # closed: harmless
    assert recording_os.fsyncs == ["file"]


def test_every_policy_writes_the_same_file(tmp_path: Path) -> None:
    stream = rank_stream()
    contents = []
    for durability in Durability:
        path = tmp_path / f"{durability}.jsonl"
        with JsonlLog(path, run_id="run-1", durability=durability, interval_ms=0.5) as log:
            for event in stream:
                log.append(event)
        contents.append(path.read_bytes())
        assert events.read_log(path).events == tuple(stream)
    assert contents[0] == contents[1] == contents[2]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(events.InvalidValueError) as unknown:
        JsonlLog(tmp_path / "a.jsonl", run_id="r", durability="sometimes")
    assert str(unknown.value) == "unknown durability 'sometimes'; valid: always, interval, never"
    assert not (tmp_path / "a.jsonl").exists()
    for interval_ms in (-1, math.nan, math.inf):
        with pytest.raises(
            ValueError, match=f"interval_ms must be >= 0 and finite, not {interval_ms}"
        ):
            JsonlLog(tmp_path / "b.jsonl", run_id="r", interval_ms=interval_ms)


def test_short_writes_are_continued(tmp_path: Path, recording_os: RecordingOs) -> None:
    recording_os.max_write = 7
    path = tmp_path / "r.jsonl"
    stream = rank_stream()
    with JsonlLog(path, run_id="run-1", durability="never") as log:
        for event in stream:
            log.append(event)
    expected = b"".join(events.encode(event) + b"\n" for event in stream)
    assert path.read_bytes() == expected
    assert recording_os.writes >= len(expected) // 7
    assert events.read_log(path).events == tuple(stream)


def test_a_failed_write_stores_nothing(tmp_path: Path, recording_os: RecordingOs) -> None:
    path = tmp_path / "r.jsonl"
    stream = rank_stream()
    seen: list[int] = []
    with JsonlLog(path, run_id="run-1", durability="never") as log:
        log.subscribe(lambda event: seen.append(event.seq))
        log.append(stream[0])
        recording_os.fail_writes = OSError(errno.ENOSPC, "No space left on device")
        with pytest.raises(OSError, match="No space left"):
            log.append(stream[1])
        assert log.next_seq == 1
        assert seen == [0]
        recording_os.fail_writes = None
        assert log.append(stream[1]) == 1
    assert events.read_log(path).events == tuple(stream[:2])


def test_a_write_failing_part_way_leaves_no_partial_line(
    tmp_path: Path, recording_os: RecordingOs
) -> None:
    # A full disk takes part of a line, then refuses the rest: the part is
    # cut off, so the events appended once there is room again follow the
    # last whole line, and the file reads back.
    path = tmp_path / "r.jsonl"
    stream = rank_stream()
    with JsonlLog(path, run_id="run-1", durability="never") as log:
        log.append(stream[0])
        recording_os.max_write = 7
        recording_os.writes_before_failing = recording_os.writes + 2
        recording_os.fail_writes = OSError(errno.ENOSPC, "No space left on device")
        with pytest.raises(OSError, match="No space left"):
            log.append(stream[1])
        assert path.read_bytes() == events.encode(stream[0]) + b"\n"
        recording_os.max_write = recording_os.fail_writes = None
        for event in stream[1:]:
            log.append(event)
    assert events.read_log(path).events == tuple(stream)


def test_failed_write_keeps_the_first_failure(tmp_path: Path, recording_os: RecordingOs) -> None:
    stream = rank_stream()
    full = OSError(errno.ENOSPC, "No space left on device")
    with JsonlLog(tmp_path / "r.jsonl", run_id="run-1", durability="never") as log:
        log.append(stream[0])
        assert log.failed_write is None
        recording_os.fail_writes = full
        with pytest.raises(OSError, match="No space left"):
            log.append(stream[1])
        recording_os.fail_writes = OSError(errno.EROFS, "Read-only file system")
        with pytest.raises(OSError, match="Read-only"):
            log.append(stream[1])
        assert log.failed_write is full


def test_closed_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    log = JsonlLog(path, run_id="run-1")
    log.close()
    assert log.closed
    with pytest.raises(LogClosedError) as caught:
        log.append(rank_stream()[0])
    assert caught.value.path == path
    assert str(path) in str(caught.value)


# --- reopening ---------------------------------------------------------------------------


def test_an_exclusive_log_is_refused_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with JsonlLog(path, run_id="run-1", durability="never", exclusive=True) as log:
        log.append(rank_stream()[0])
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        JsonlLog(path, run_id="run-1", durability="never", exclusive=True)
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with pytest.raises(FileExistsError):
        JsonlLog(empty, run_id="run-1", durability="never", exclusive=True)
    assert path.read_bytes() == before
    assert empty.read_bytes() == b""


def test_reopening_continues_the_sequence(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    stream = rank_stream()
    with JsonlLog(path, run_id="run-1", durability="never") as log:
        for event in stream[:3]:
            log.append(event)
    with JsonlLog(path, run_id="run-1", durability="never") as log:
        assert log.next_seq == 3
        assert list(log.read()) == stream[:3]
        replayed: list[events.Event] = []
        log.subscribe(replayed.append, from_seq=0)
        for event in stream[3:]:
            log.append(event)
        assert replayed == stream
    assert events.read_log(path).events == tuple(stream)


def test_reopening_truncates_a_torn_tail_at_every_offset(tmp_path: Path) -> None:
    stream = rank_stream()
    data = b"".join(events.encode(event) + b"\n" for event in stream)
    last_start = data.rindex(b"\n", 0, len(data) - 1) + 1
    path = tmp_path / "r.jsonl"
    for cut in range(last_start + 1, len(data)):
        path.write_bytes(data[:cut])
        with JsonlLog(path, run_id="run-1", durability="never") as log:
            assert path.stat().st_size == last_start
            assert log.next_seq == len(stream) - 1
            assert log.append(stream[-1]) == len(stream) - 1
        assert path.read_bytes() == data


def test_reopening_another_streams_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    with JsonlLog(path, run_id="run-1", rank=0) as log:
        log.append(rank_stream()[0])
    before = path.read_bytes()
    with pytest.raises(StreamMismatchError) as caught:
        JsonlLog(path, run_id="run-2", rank=0)
    assert caught.value.expected == ("run-2", 0)
    assert caught.value.found == ("run-1", 0)
    with pytest.raises(StreamMismatchError):
        JsonlLog(path, run_id="run-1", rank=1)
    assert path.read_bytes() == before


def test_reopening_a_damaged_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    lines = [events.encode(event) for event in rank_stream()]
    path.write_bytes(lines[0] + b"\ngarbage\n" + lines[2] + b"\n")
    with pytest.raises(LogCorruptError) as caught:
        JsonlLog(path, run_id="run-1")
    assert caught.value.line == 2
