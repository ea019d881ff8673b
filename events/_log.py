"""Append-only event logs: the protocol, an in-memory log and a JSON Lines file.

A log holds the events of one stream, ``(run_id, rank)``. ``append`` assigns
the next sequence number (gapless from 0), stores the event and hands it to
every subscriber, in order, before it returns. Nothing updates or removes a
stored event.

Logs are safe for many concurrent anyio tasks and for worker threads: an
append is atomic under a lock, so sequence numbers never skip or repeat and
file lines never interleave.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, Self, runtime_checkable

import orjson

from ._builders import evolve
from ._codec import LINE_ENCODERS
from ._errors import InvalidValueError, LogClosedError, StreamMismatchError
from ._model import Event

__all__ = ["Durability", "EventLog", "JsonlLog", "MemoryLog", "Subscription"]

Subscriber = Callable[[Event], None]


class Subscription:
    """A live subscription; ``close()`` (or leaving the ``with`` block) stops
    delivery. Closing twice is harmless."""

    def __init__(self, unsubscribe: Callable[[], None]) -> None:
        self._unsubscribe: Callable[[], None] | None = unsubscribe

    def close(self) -> None:
        """Stop delivering events to this subscriber."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@runtime_checkable
class EventLog(Protocol):
    """What every log offers.

    ``append`` assigns ``seq`` (the event's own ``seq`` is ignored), stores
    the event and delivers it to subscribers before returning the number.
    ``read(from_seq)`` yields the stored events from ``from_seq`` on.
    ``subscribe(callback, from_seq=None)`` delivers every later event in
    order; with ``from_seq`` it first delivers the stored events from there,
    with no event missed or repeated between the two.
    """

    @property
    def run_id(self) -> str: ...

    @property
    def rank(self) -> int: ...

    @property
    def next_seq(self) -> int: ...

    def append(self, event: Event) -> int: ...

    def read(self, from_seq: int = 0) -> Iterator[Event]: ...

    def subscribe(self, callback: Subscriber, *, from_seq: int | None = None) -> Subscription: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class _LogBase:
    """Sequencing, stream checks and subscribers; subclasses store."""

    def __init__(self, run_id: str, rank: int = 0) -> None:
        self._run_id = run_id
        self._rank = rank
        self._lock = threading.RLock()
        self._events: list[Event] = []
        # Replaced, never changed in place: an append delivers to the tuple
        # it finds, whoever subscribes or unsubscribes meanwhile.
        self._subscribers: tuple[Subscriber, ...] = ()
        self._closed = False
        self._file: Path | None = None

    @property
    def run_id(self) -> str:
        """The run this log belongs to."""
        return self._run_id

    @property
    def rank(self) -> int:
        """The rank whose events this log holds."""
        return self._rank

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next append will assign."""
        return len(self._events)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def append(self, event: Event) -> int:
        """Store ``event`` with the next ``seq`` and deliver it to subscribers.

        Returns:
            The assigned sequence number.

        Raises:
            StreamMismatchError: the event names another run or rank.
            LogClosedError: the log was closed.
            OSError: the file log could not write (the event is not stored).
        """
        if event.run_id != self._run_id or event.rank != self._rank:
            raise StreamMismatchError((self._run_id, self._rank), (event.run_id, event.rank))
        with self._lock:
            if self._closed:
                raise LogClosedError(self._file)
            seq = len(self._events)
            event = self._store(event, seq)
            self._events.append(event)
            first_error: Exception | None = None
            for callback in self._subscribers:
                try:
                    callback(event)
                except Exception as exc:  # one broken consumer must not starve the others
                    first_error = first_error or exc
            if first_error is not None:
                raise first_error
            return seq

    def read(self, from_seq: int = 0) -> Iterator[Event]:
        """Yield stored events with ``seq >= from_seq``, in order. Events
        appended while iterating are included."""
        return itertools.islice(self._events, max(from_seq, 0), None)

    def subscribe(self, callback: Subscriber, *, from_seq: int | None = None) -> Subscription:
        """Deliver every event appended from now on to ``callback``, on the
        appending thread, before ``append`` returns. With ``from_seq`` the
        stored events from there are delivered first, atomically."""
        with self._lock:
            if from_seq is not None:
                for event in self._events[max(from_seq, 0) :]:
                    callback(event)
            self._subscribers = (*self._subscribers, callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    remaining = list(self._subscribers)
                    remaining.remove(callback)
                    self._subscribers = tuple(remaining)

        return Subscription(unsubscribe)

    def flush(self) -> None:
        """Make every appended event durable (a no-op in memory)."""

    def close(self) -> None:
        """Flush and refuse further appends. Closing twice is harmless."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # Storage hooks --------------------------------------------------------------------

    def _store(self, event: Event, seq: int) -> Event:
        """Store ``event`` as number ``seq``; return it with that ``seq``."""
        return event if event.seq == seq else evolve(event, {"seq": seq})

    def _close(self) -> None:
        pass


class MemoryLog(_LogBase):
    """A log held in memory: for tests, benchmarks and short-lived graphs."""

    @property
    def events(self) -> tuple[Event, ...]:
        """Every stored event, in order."""
        return tuple(self._events)


class Durability(enum.StrEnum):
    """When a :class:`JsonlLog` asks the kernel to put events on disk.

    ``always``   fsync after every event: nothing acknowledged is lost, even
                 on power loss; the slowest.
    ``interval`` fsync at most every ``interval_ms`` (on the first append
                 after the interval has passed) and at flush/close.
    ``never``    leave it to the kernel (events survive a crashed process,
                 not a crashed host); fsync only on explicit :meth:`flush`.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"

    @classmethod
    def _missing_(cls, value: object) -> Durability:
        raise InvalidValueError("durability", value, [member.value for member in cls])


class JsonlLog(_LogBase):
    """A log in a JSON Lines file, one event per line.

    Each event is written with a single ``write`` of one complete line on a
    descriptor opened with ``O_APPEND`` (short writes are continued; a line
    whose write fails part-way, on a full disk, is cut off), so a reader
    sees whole lines or, after a crash mid-write, a torn last line
    that :func:`events.read_log` tolerates. When the file is created its
    directory is fsynced so the file itself survives a crash.

    Opening an existing file continues its stream: the events are read back
    (they must be of the same run and rank), the next ``seq`` follows the
    last one, and a torn last line left by a crash is cut off first.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run_id: str,
        rank: int = 0,
        durability: Durability | str = Durability.INTERVAL,
        interval_ms: float = 200.0,
        exclusive: bool = False,
    ) -> None:
        """Open (creating if needed) the log file at ``path``.

        With ``exclusive``, the file must not exist yet: it is created
        atomically (``O_EXCL``), so of several processes opening the same
        path exactly one gets the log and the others get
        :class:`FileExistsError` before anything is written.

        Raises:
            ValueError: ``interval_ms`` is negative or not finite; an
                :class:`~events.InvalidValueError` (a ``ValueError``) lists the
                valid values of an unknown ``durability``.
            FileExistsError: ``exclusive`` and the file exists.
            events.LogCorruptError: the existing file is damaged.
            events.StreamMismatchError: the existing file is of another stream.
            OSError: the file or its directory cannot be opened.
        """
        super().__init__(run_id, rank)
        self._file: Path = Path(path)
        self._durability = Durability(durability)
        if not 0 <= interval_ms < math.inf:
            raise ValueError(f"interval_ms must be >= 0 and finite, not {interval_ms}")
        # How long an append may leave events unsynced; one test per append
        # under ``never``.
        self._sync_after_ns = {
            Durability.ALWAYS: 0,
            Durability.INTERVAL: int(interval_ms * 1_000_000),
            Durability.NEVER: None,
        }[self._durability]
        self._last_sync_ns = time.monotonic_ns()
        self._dirty = False
        self._failed_write: OSError | None = None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        if exclusive:
            flags |= os.O_EXCL
        elif self._file.exists() and self._file.stat().st_size > 0:
            self._resume()
        created = exclusive or not self._file.exists()
        self._fd = os.open(self._file, flags, 0o644)
        if created:
            _fsync_directory(self._file.parent)

    @property
    def path(self) -> Path:
        """The log file."""
        return self._file

    @property
    def durability(self) -> Durability:
        """The durability policy in force."""
        return self._durability

    @property
    def failed_write(self) -> OSError | None:
        """The first write to the file that failed (a full disk: the events
        from there on are not in the file), or ``None``."""
        return self._failed_write

    def _resume(self) -> None:
        # Imported here: a log that starts afresh (every rank's) never loads
        # the reader, which costs a rank's start about 3 ms.
        from ._reader import read_log

        contents = read_log(self._file)
        if contents.events:
            first = contents.events[0]
            if (first.run_id, first.rank) != (self._run_id, self._rank):
                raise StreamMismatchError((self._run_id, self._rank), (first.run_id, first.rank))
        if contents.torn_tail is not None:
            os.truncate(self._file, contents.torn_tail.offset)
        self._events.extend(contents.events)

    def _store(self, event: Event, seq: int) -> Event:
        event = super()._store(event, seq)
        line = orjson.dumps(LINE_ENCODERS[event.TYPE](event), None, orjson.OPT_APPEND_NEWLINE)
        written = 0
        try:
            written = os.write(self._fd, line)
            while written != len(line):
                written += os.write(self._fd, memoryview(line)[written:])
        except OSError as exc:
            self._failed_write = self._failed_write or exc
            if written:  # cut the part written off, or the next line would follow it
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise
        self._dirty = True
        after = self._sync_after_ns
        if after is not None and time.monotonic_ns() - self._last_sync_ns >= after:
            self._sync()
        return event

    def _sync(self) -> None:
        try:
            os.fsync(self._fd)
        except OSError as exc:
            self._failed_write = self._failed_write or exc
            raise
        self._dirty = False
        self._last_sync_ns = time.monotonic_ns()

    def flush(self) -> None:
        """fsync every appended event now, whatever the policy."""
        with self._lock:
            if not self._closed and self._dirty:
                self._sync()

    def _close(self) -> None:
        try:
            if self._dirty and self._durability is not Durability.NEVER:
                self._sync()
        finally:
            os.close(self._fd)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms without directory handles
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
