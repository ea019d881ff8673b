"""Errors raised by the events package.

::

    EventsError
    ├── DecodeError                a record is not a valid event
    │   ├── UnknownEventTypeError  its ``type`` tag is not one we know
    │   └── UnsupportedVersionError  its schema version cannot be read
    ├── LogError                   a log cannot be used
    │   ├── LogClosedError         append to a closed log
    │   ├── StreamMismatchError    an event of another run or rank
    │   └── LogCorruptError        a file is damaged at ``path:line``
    │       ├── SequenceGapError   ``seq`` jumps or repeats
    │       └── ForeignEventError  a record of another run or rank
    ├── FoldError                  a stream given to a fold is out of order
    ├── InvalidValueError          a value is not one of the valid ones (also ValueError)
    └── PolicyError                a severity policy is not valid (``_policy``; also ValueError)

:class:`InvalidValueError` is the one "unknown X 'y'; valid: a, b" error of
the distribution: the other packages' errors of that kind inherit it next to
their own root (``orchestrator.engine.EngineConfigError``,
``exporters.TracingSettingError``), so one ``except`` catches them all and
the message reads the same everywhere.

Every error carries its facts as attributes and builds its message from them,
ending with what to do about it where there is something to do. Each class's
``__module__`` is ``events``, the public path logs and reports record.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "DecodeError",
    "EventsError",
    "FoldError",
    "ForeignEventError",
    "InvalidValueError",
    "LogClosedError",
    "LogCorruptError",
    "LogError",
    "SequenceGapError",
    "StreamMismatchError",
    "UnknownEventTypeError",
    "UnsupportedVersionError",
]


#: The top-level packages of this distribution: the only names rewritten.
DISTRIBUTION_PACKAGES = frozenset({"events", "orchestrator", "exporters"})


def public_module(module: str) -> str:
    """``module`` without its ``_``-prefixed components if it is under one of
    :data:`DISTRIBUTION_PACKAGES` (``orchestrator.cli._errors`` -> ``orchestrator.cli``).

    It is the ``__module__`` each package's root error gives its classes, so
    that logs (from schema version 2 on), reports and spans name them by a
    path that stays when code moves between private modules."""
    parts = module.split(".")
    if parts[0] not in DISTRIBUTION_PACKAGES:
        return module
    return ".".join(part for part in parts if not part.startswith("_"))


def public_type_name(name: str) -> str:
    """The public path of an exception type name as a version-1 log recorded
    it, by its defining module: ``orchestrator._errors.StepTimeoutError`` ->
    ``orchestrator.StepTimeoutError``. A name outside
    :data:`DISTRIBUTION_PACKAGES`, a builtin's bare name or a name already
    public is returned unchanged; the last component (the class) is kept
    even when it is private."""
    module, _, qualname = name.rpartition(".")
    return f"{public_module(module)}.{qualname}" if module else name


class EventsError(Exception):
    """Base class of every error raised by :mod:`events`."""

    __module__ = "events"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__module__ = public_module(cls.__module__)


class InvalidValueError(EventsError, ValueError):
    """A value is not one of the values this release accepts.

    Attributes:
        what: what the value is (``"severity"``, ``"OTLP protocol"``).
        value: the value given.
        valid: the values accepted, in the order to list them.
        where: where the value came from (a variable, an option, a field),
            or ``None``.

    The message is ``unknown WHAT 'VALUE' [in WHERE]; valid: A, B, C``: the
    list says what to write instead.
    """

    def __init__(
        self, what: str, value: object, valid: Iterable[str], where: str | None = None
    ) -> None:
        self.what = what
        self.value = value
        self.valid = tuple(valid)
        self.where = where
        place = "" if where is None else f" in {where}"
        super().__init__(f"unknown {what} {value!r}{place}; valid: {', '.join(self.valid)}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its fields (the default would call it with the message).
        return (type(self), (self.what, self.value, self.valid, self.where))


class DecodeError(EventsError):
    """A JSON record does not describe a valid event (or, from
    :func:`events.structure`, a valid instance of the class asked for).

    Attributes:
        reason: what is wrong with the record.
        field: the path of the first field at fault (``cause.frames[0]``),
            when a field is; ``None`` when the record as a whole is wrong.
    """

    def __init__(self, reason: str, *, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        super().__init__(reason)


class UnknownEventTypeError(DecodeError):
    """The record's ``type`` is not a known event type.

    Attributes:
        type_tag: the tag found in the record.
        known: the tags this release reads.
    """

    def __init__(self, type_tag: object, known: tuple[str, ...]) -> None:
        self.type_tag = type_tag
        self.known = known
        super().__init__(
            f"unknown event type {type_tag!r}; known types: {', '.join(known)}"
            " (was the log written by a newer release? upgrade startup-orchestrator)"
            if isinstance(type_tag, str)
            else f"no event type: field 'type' is {type_tag!r}, not one of {', '.join(known)}"
        )


class UnsupportedVersionError(DecodeError):
    """The record's schema version is missing, or not one this release reads.

    Attributes:
        version: the version found.
        supported: the newest version this release writes.
    """

    def __init__(self, version: object, supported: int) -> None:
        self.version = version
        self.supported = supported
        hint = (
            "upgrade startup-orchestrator to read it"
            if isinstance(version, int) and version > supported
            else f"versions 0..{supported} are readable"
        )
        # A record without a "v" is most likely a line of some other JSON Lines file.
        super().__init__(
            f'not a startup event: the record has no schema version ("v"); '
            f"{hint}: is this a startup-orchestrator log?"
            if version is None
            else f"unsupported schema version {version!r}; {hint}"
        )


class LogError(EventsError):
    """A log cannot be used as asked."""


class LogClosedError(LogError):
    """An append to a log that was closed."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        where = f" {path}" if path else ""
        super().__init__(f"event log{where} is closed; open a new log to append")


class StreamMismatchError(LogError):
    """An event appended to a log belongs to another run or rank.

    Attributes:
        expected: ``(run_id, rank)`` of the log.
        found: ``(run_id, rank)`` of the event.
    """

    def __init__(self, expected: tuple[str, int], found: tuple[str, int]) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            f"event of run {found[0]!r} rank {found[1]} appended to the log of run "
            f"{expected[0]!r} rank {expected[1]}; each rank writes its own log"
        )


class LogCorruptError(LogError):
    """A log file is damaged.

    Attributes:
        path: the file.
        line: 1-based line number of the bad record.
        reason: what is wrong with it.
    """

    def __init__(self, path: Path | str, line: int, reason: str) -> None:
        self.path = Path(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{path}:{line}: {reason}")


class SequenceGapError(LogCorruptError):
    """A record's ``seq`` is not the one after its predecessor's.

    Attributes:
        expected: the sequence number that should have come.
        found: the one that did.
    """

    def __init__(self, path: Path | str, line: int, expected: int, found: int) -> None:
        self.expected = expected
        self.found = found
        what = "repeats" if found < expected else "skips"
        super().__init__(
            path,
            line,
            f"sequence gap: expected seq {expected}, found {found} (the log {what} "
            "events; it was edited or two writers shared the file)",
        )


class ForeignEventError(LogCorruptError):
    """A record belongs to another run or rank than the file's first record.

    Attributes:
        expected: ``(run_id, rank)`` of the file.
        found: ``(run_id, rank)`` of the record.
    """

    def __init__(
        self, path: Path | str, line: int, expected: tuple[str, int], found: tuple[str, int]
    ) -> None:
        self.expected = expected
        self.found = found
        super().__init__(
            path,
            line,
            f"record of run {found[0]!r} rank {found[1]} in the log of run {expected[0]!r} "
            f"rank {expected[1]}",
        )


class FoldError(EventsError):
    """A fold was given a stream that is out of order for one (run, rank).

    Attributes:
        run_id, rank: the stream.
        expected: the next ``seq`` the fold expected.
        found: the ``seq`` it got.
    """

    def __init__(self, run_id: str, rank: int, expected: int, found: int) -> None:
        self.run_id = run_id
        self.rank = rank
        self.expected = expected
        self.found = found
        super().__init__(
            f"run {run_id!r} rank {rank}: expected seq {expected}, got {found}; "
            "fold each rank's events in log order (events.merge does)"
        )
