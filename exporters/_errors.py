"""Errors raised by the exporters package.

::

    ExportersError          base of everything this package raises on purpose
    ├── SpanExportError     an exporter refused a batch of replayed spans
    ├── SpanBuildError      an event's ids are not trace context (also a
    │                       ValueError)
    └── TracingSettingError a tracing option (an argument) holds an unknown
                            value (also events.InvalidValueError, a
                            ValueError); an OTEL_* variable is a warning

Each class's ``__module__`` is ``exporters``, its public path.
"""

from __future__ import annotations

from events import InvalidValueError

__all__ = ["ExportersError", "SpanExportError", "TracingSettingError"]


class ExportersError(Exception):
    """Base class of the errors this package raises on purpose."""

    __module__ = "exporters"


class SpanExportError(ExportersError):
    """An exporter reported failure while replayed spans were sent.

    Attributes:
        exporter: the exporter's class name.
        exported: spans delivered before the failing batch.
        total: spans that were to be delivered.
        detail: where they went and why they were not taken
            (``to HOST:PORT (connection refused)``), when known.
    """

    __module__ = "exporters"

    def __init__(self, *, exporter: str, exported: int, total: int, detail: str = "") -> None:
        self.exporter = exporter
        self.exported = exported
        self.total = total
        self.detail = detail
        super().__init__(
            f"{exporter} failed to export spans{' ' + detail if detail else ''}: "
            f"{exported} of {total} delivered; "
            f"the event log still holds them, export again when the collector is reachable"
        )


class SpanBuildError(ExportersError, ValueError):
    """An event cannot become a span: an id that is not valid W3C trace
    context (not hex, or all zeros), as only a damaged or crafted log holds.

    Attributes:
        event_type, rank, seq, step: the event.
        reason: what is wrong with it.
    """

    __module__ = "exporters"

    def __init__(self, *, event_type: str, rank: int, seq: int, step: str, reason: str) -> None:
        self.event_type = event_type
        self.rank = rank
        self.seq = seq
        self.step = step
        self.reason = reason
        super().__init__(
            f"cannot build a span from {event_type} (rank {rank}, seq {seq}, step {step!r}): "
            f"{reason}; the log is damaged (validate it)"
        )


class TracingSettingError(ExportersError, InvalidValueError):
    """A tracing option holds a value this release does not support (an
    OTLP protocol given as an argument). An ``OTEL_*`` variable never raises
    it: a bad one is logged once and tracing falls back.

    Attributes:
        what, value, valid, where: as :class:`events.InvalidValueError`;
            ``where`` names the variable or option.
    """

    __module__ = "exporters"
