"""Reading JSON Lines logs back: strict reads, full validation, merging ranks.

A file written by :class:`events.JsonlLog` is a sequence of complete lines.
If the writer died mid-write, the last line has no newline: that *torn tail*
is tolerated, left out and reported. Anything else that is wrong is an error
naming the file and line: a line that is not a valid event, a sequence gap,
a record of another run or rank, an unknown type or schema version.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import graphlib
import heapq
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import orjson

from ._codec import CURRENT_DECODERS, decode
from ._errors import (
    DecodeError,
    ForeignEventError,
    LogCorruptError,
    LogError,
    SequenceGapError,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from ._model import (
    SCHEMA_VERSION,
    TERMINAL_STEP_EVENTS,
    Event,
    RunFinished,
    RunStarted,
    StepStarted,
)

__all__ = ["LogContents", "LogProblem", "ProblemKind", "TornTail", "merge", "read_log", "validate"]


@attrs.frozen(kw_only=True)
class TornTail:
    """An unterminated last line: what a crash mid-write leaves.

    Attributes:
        path: the file.
        line: its 1-based line number.
        offset: byte offset where the torn line starts (the file's intact
            length).
        length: how many bytes of it were written.
    """

    path: Path
    line: int
    offset: int
    length: int

    def describe(self) -> str:
        """One line for reports."""
        return (
            f"{self.path}:{self.line}: torn last line ({self.length} bytes without a newline, "
            "from a writer that stopped mid-write) was ignored"
        )


@attrs.frozen(kw_only=True)
class LogContents:
    """What :func:`read_log` read.

    Attributes:
        path: the file.
        events: every complete event, in order.
        torn_tail: the torn last line, if there was one.
    """

    path: Path
    events: tuple[Event, ...]
    torn_tail: TornTail | None = None

    @property
    def warnings(self) -> tuple[str, ...]:
        """Human-readable warnings about the file (the torn tail)."""
        return () if self.torn_tail is None else (self.torn_tail.describe(),)


class ProblemKind(enum.StrEnum):
    """The kinds of problem :func:`validate` reports."""

    UNREADABLE = "unreadable"
    BAD_RECORD = "bad_record"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_TYPE = "unknown_type"
    SEQUENCE_GAP = "sequence_gap"
    FOREIGN_EVENT = "foreign_event"
    TORN_TAIL = "torn_tail"
    NOT_STARTED = "not_started"
    NOT_FINISHED = "not_finished"
    AFTER_FINISHED = "after_finished"
    STEP_TREE = "step_tree"


@attrs.frozen(kw_only=True)
class LogProblem:
    """One integrity problem in a log file.

    ``fatal`` problems make :func:`read_log` fail; the others (a torn tail, a
    log that never finished) are reported but readable.
    """

    path: Path
    line: int
    kind: ProblemKind
    message: str
    fatal: bool = True

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def _read_bytes(path: Path) -> bytes:
    """The whole file; only a regular file is read.

    A FIFO, socket or device named like a log is refused without reading
    from it: opening is non-blocking and the type is checked on the open
    descriptor, so a FIFO with no writer can never hang a reader.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            status = os.fstat(fd)
            mode = status.st_mode
            if stat.S_ISDIR(mode):
                raise LogCorruptError(path, 0, "is a directory, not a log file")
            if not stat.S_ISREG(mode):
                kind = _FILE_KINDS.get(stat.S_IFMT(mode), "special file")
                raise LogCorruptError(path, 0, f"is a {kind}, not a regular file; it was not read")
            # Read to the end, whatever the size said: a live log grows.
            data = b"".join(iter(functools.partial(os.read, fd, status.st_size + 1), b""))
        finally:
            os.close(fd)
    except OSError as exc:
        raise LogError(f"{path}: cannot read log: {exc.strerror or exc}") from exc
    # A log attached to a bug report is often compressed: say so, rather
    # than that its first line is not JSON (and never inflate it unbounded).
    for magic, (tool, _suffix) in COMPRESSED.items():
        if data.startswith(magic):
            raise LogCorruptError(path, 0, f"is {tool}-compressed: decompress it first ({tool} -d)")
    return data


#: The first bytes of a compressed file: the tool that made it, and the
#: suffix it gives the file's name.
COMPRESSED = {
    b"\x1f\x8b": ("gzip", ".gz"),
    b"\x28\xb5\x2f\xfd": ("zstd", ".zst"),
    b"\xfd7zXZ\x00": ("xz", ".xz"),
    b"BZh": ("bzip2", ".bz2"),
}


_FILE_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
}


def read_log(path: str | os.PathLike[str]) -> LogContents:
    """Read every event of one rank's log file, strictly.

    Returns:
        The events and the torn tail, if any.

    Raises:
        LogCorruptError: a bad record mid-file (its ``__cause__`` is the
            :class:`~events.DecodeError`, e.g. an
            :class:`~events.UnsupportedVersionError`).
        SequenceGapError: ``seq`` does not go up by one from 0.
        ForeignEventError: a record of another run or rank.
        LogError: the file cannot be read.
    """
    file = Path(path)
    data = _read_bytes(file)
    lines = data.split(b"\n")
    # What follows the last newline: nothing, or a line the writer never
    # finished.
    tail = lines.pop()
    count = len(lines)
    # Lines are taken off the list as they are decoded, so that each line's
    # memory is freed at once and reused for the events that follow, instead
    # of all of them staying alive until the end.
    lines.reverse()
    next_line = lines.pop
    events: list[Event] = []
    append = events.append
    run_id: str | None = None
    rank = 0
    expected = 0  # the next seq
    decoders = CURRENT_DECODERS
    loads = orjson.loads
    while lines:
        content = next_line()
        # A line holding a well-formed record of the current version (all of
        # them, in a log this release wrote) goes straight to its generated
        # decoder; anything else, or anything that decoder refuses, goes
        # through decode(), which upcasts it or names the field at fault.
        event: Event | None = None
        try:
            record: Any = loads(content)
            version = record["v"]
            if type(version) is int and version == SCHEMA_VERSION:
                event = decoders[record["type"]](record)
        except (ValueError, TypeError, LookupError):
            pass
        if event is None:
            try:
                event = decode(content)
            except DecodeError as exc:
                # Every earlier line holds an event: this is the next one.
                raise LogCorruptError(file, len(events) + 1, exc.reason) from exc
        if event.seq != expected or event.rank != rank or event.run_id != run_id:
            # The first event, or one out of place.
            number = len(events) + 1
            if run_id is not None and (event.run_id, event.rank) != (run_id, rank):
                raise ForeignEventError(file, number, (run_id, rank), (event.run_id, event.rank))
            run_id, rank = event.run_id, event.rank
            if event.seq != expected:
                raise SequenceGapError(file, number, expected, event.seq)
        append(event)
        expected += 1
    torn = None
    if tail:
        torn = TornTail(path=file, line=count + 1, offset=len(data) - len(tail), length=len(tail))
    return LogContents(path=file, events=tuple(events), torn_tail=torn)


def validate(path: str | os.PathLike[str]) -> list[LogProblem]:
    """List every integrity problem in a log file instead of stopping at the
    first. An empty list means the file reads cleanly and is complete (it
    starts with ``run.started`` and ends with ``run.finished``)."""
    file = Path(path)
    try:
        data = _read_bytes(file)
    except LogError as exc:
        # The problem names the file itself: its message says only what is wrong.
        reason = exc.reason if isinstance(exc, LogCorruptError) else str(exc)
        message = reason.removeprefix(f"{file}: ")
        return [LogProblem(path=file, line=0, kind=ProblemKind.UNREADABLE, message=message)]
    problems: list[LogProblem] = []

    def found(line: int, kind: ProblemKind, message: str, *, fatal: bool = True) -> None:
        problems.append(LogProblem(path=file, line=line, kind=kind, message=message, fatal=fatal))

    stream: tuple[str, int] | None = None
    expected = 0
    first: Event | None = None
    last: Event | None = None
    after_finished = False
    steps: list[tuple[Event, int]] = []
    *lines, tail = data.split(b"\n")
    for number, content in enumerate(lines, 1):
        try:
            event = decode(content)
        except DecodeError as exc:
            found(number, _KINDS.get(type(exc), ProblemKind.BAD_RECORD), exc.reason)
            expected += 1  # assume the bad line held the next event
            continue
        identity = (event.run_id, event.rank)
        stream = stream or identity
        foreign = identity != stream
        if foreign:
            error = ForeignEventError(file, number, stream, identity)
            found(number, ProblemKind.FOREIGN_EVENT, error.reason)
        if event.seq != expected:
            gap = SequenceGapError(file, number, expected, event.seq)
            found(number, ProblemKind.SEQUENCE_GAP, gap.reason)
        if not foreign and (after_finished or isinstance(last, RunFinished)):
            after_finished = True
            message = (
                f"{event.TYPE} (seq {event.seq}) after run.finished: a finished rank writes "
                "nothing more"
            )
            found(number, ProblemKind.AFTER_FINISHED, message)
        expected = event.seq + 1
        first = first or event
        last = event
        if not foreign and isinstance(event, (StepStarted, *TERMINAL_STEP_EVENTS)):
            steps.append((event, number))
    if tail:
        message = f"torn last line ({len(tail)} bytes without a newline)"
        found(len(lines) + 1, ProblemKind.TORN_TAIL, message, fatal=False)
    for line, message in _step_tree_problems(steps):
        found(line, ProblemKind.STEP_TREE, message, fatal=False)
    if not isinstance(first, RunStarted):
        # read_log accepts such a file: like a missing run.finished, this is
        # reported, not fatal.
        message = (
            "the log holds no complete event"
            if first is None
            else f"first event is {first.TYPE}, not run.started"
        )
        found(1, ProblemKind.NOT_STARTED, message, fatal=False)
    if last is not None and not isinstance(last, RunFinished) and not after_finished:
        message = (
            f"no run.finished event: the rank stopped after seq {last.seq} "
            f"({last.TYPE} {last.step})"
        )
        found(0, ProblemKind.NOT_FINISHED, message, fatal=False)
    return problems


def _step_tree_problems(steps: list[tuple[Event, int]]) -> Iterator[tuple[int, str]]:
    """What :func:`validate` checks of one rank's steps (each with its
    line), each problem as its line and message: that no two share a span
    or a path, none ends before it starts, and neither their spans' parents
    nor their dependencies go round in a cycle (which no run writes; a
    crafted log may). Readable all the same: the views show such steps."""
    #: span id -> (step, parent span id, start on the monotonic clock, line)
    spans: dict[str, tuple[str, str | None, int, int]] = {}
    depends_on: dict[str, tuple[str, ...]] = {}
    #: step path -> the line it started on
    started: dict[str, int] = {}
    for event, line in steps:
        if isinstance(event, StepStarted):
            other = spans.get(event.span_id)
            if other is not None:
                yield line, f"step {event.step} reuses span {event.span_id} of step {other[0]}"
                continue
            first = started.setdefault(event.step, line)
            if first != line:
                message = (
                    f"step {event.step} starts again (it started on line {first}); a path "
                    "names one step of a run"
                )
                yield line, message
            spans[event.span_id] = (event.step, event.parent_span_id, event.mono_ns, line)
            depends_on.setdefault(event.step, event.depends_on)
        else:
            start = spans.get(event.span_id)
            if start is not None and event.mono_ns < start[2]:
                early = (start[2] - event.mono_ns) / 1e9
                yield line, f"step {event.step} ends {early:g} s before it starts"
    # Parents: a walk from each span stops at a span already settled, so the
    # whole check is linear in the spans.
    settled: set[str] = set()
    for span_id in spans:
        path: dict[str, None] = {}  # the walk so far, in order
        current: str | None = span_id
        while current in spans and current not in settled:
            if current in path:
                walked = list(path)
                cycle = walked[walked.index(current) :]
                names = ", ".join(spans[span][0] for span in cycle)
                message = (
                    f"the spans of steps {names} are each other's parents"
                    if len(cycle) > 1
                    else f"the span of step {names} is its own parent"
                )
                yield spans[current][3], message
                break
            path[current] = None
            current = spans[current][1]
        settled.update(path)
    # Dependencies: the steps still waiting once every step whose
    # dependencies are met is done are in a cycle, or wait on one.
    sorter = graphlib.TopologicalSorter(depends_on)
    with contextlib.suppress(graphlib.CycleError):
        sorter.prepare()  # the sorter still gives every step a cycle does not hold up
    waiting = set(depends_on)
    while ready := sorter.get_ready():
        sorter.done(*ready)
        waiting.difference_update(ready)
    if len(waiting) == 1:
        yield 0, f"step {next(iter(waiting))} depends on itself"
    elif waiting:
        names = ", ".join(sorted(waiting))
        yield 0, f"steps {names} wait on each other: their dependencies go round in a cycle"


#: The problem kind of a decode error of each kind, else BAD_RECORD.
_KINDS: dict[type[DecodeError], ProblemKind] = {
    UnsupportedVersionError: ProblemKind.UNSUPPORTED_VERSION,
    UnknownEventTypeError: ProblemKind.UNKNOWN_TYPE,
}


def check_logs(source: object, name: str) -> None:
    """Refuse a path or one log where a list of logs goes: iterated, it would
    be taken apart (a path into characters) and fail far from the call."""
    if isinstance(source, str | os.PathLike | LogContents):
        what = f"the log {source.path}" if isinstance(source, LogContents) else repr(source)
        raise TypeError(
            f"{name} is {what}, not a list of logs or events: "
            "pass [events.read_log(path), ...], one per rank"
        )


def merge(logs: Iterable[LogContents | Iterable[Event]]) -> Iterator[Event]:
    """Merge several ranks' event streams into one, ordered by wall-clock
    time, ties broken by ``(rank, seq)``.

    Each stream's own order is kept even if its wall clock stepped back, so a
    fold over the result sees every rank's events in ``seq`` order.

    Raises:
        LogError: two streams are of the same rank, or of different runs.
        TypeError: ``logs`` is one log or a path, not a list of them.
    """
    check_logs(logs, "logs")
    streams: list[Iterable[Event]] = []
    seen: dict[int, str] = {}
    run_ids: set[str] = set()
    for log in logs:
        if isinstance(log, LogContents):
            events, source = log.events, str(log.path)
        else:
            events, source = tuple(log), "an event stream"
        if not events:
            continue
        head = events[0]
        if head.rank in seen:
            raise LogError(
                f"two logs for rank {head.rank} ({seen[head.rank]} and {source}); "
                "pass one log per rank"
            )
        seen[head.rank] = source
        run_ids.add(head.run_id)
        streams.append(events)
    if len(run_ids) > 1:
        raise LogError(f"logs of different runs cannot be merged: {', '.join(sorted(run_ids))}")
    return heapq.merge(*streams, key=lambda event: (event.wall_ns, event.rank, event.seq))
