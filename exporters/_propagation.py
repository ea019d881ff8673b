"""Carrying a recorded span across threads and processes.

The runtime records hex ids in its events; OpenTelemetry wants integers in a
:class:`~opentelemetry.trace.SpanContext`, and child processes want a W3C
``traceparent`` string in their environment (``TRACEPARENT``). This module
converts between the three, strictly: a malformed id is an error, never a
silently new trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

__all__ = [
    "TraceParent",
    "activate_span",
    "context_with_span",
    "format_traceparent",
    "parse_traceparent",
]

_HEX = frozenset("0123456789abcdef")
_VERSION_00_LENGTH = 55
_EXPECTED_FORM = "00-<32 hex trace id>-<16 hex span id>-<2 hex flags>"


def hex_id(value: str, digits: int, what: str) -> int:
    """``value``, an id of ``digits`` lower-case hex digits, not all zero (a
    trace id has 32, a span id 16), as an integer.

    Raises:
        ValueError: not a valid id; the message names ``what`` and shows the value.
    """
    if len(value) != digits or not _HEX.issuperset(value):
        raise ValueError(f"{what} must be {digits} lower-case hex digits, not {value!r}")
    if value == "0" * digits:
        raise ValueError(f"{what} must not be all zeros")
    return int(value, 16)


# A step's span context is built by the activator while the step runs, again
# for its span, and again as the parent of each of its children; checking and
# converting the hex ids each time would be a large part of what tracing
# costs a step. A SpanContext is an immutable tuple, so one can be shared; a failed
# check raises and is not cached.
@functools.lru_cache(maxsize=4096)
def span_context(
    trace_id: str, span_id: str, *, is_remote: bool = False, sampled: bool = True
) -> SpanContext:
    """A :class:`~opentelemetry.trace.SpanContext` for recorded hex ids.

    Raises:
        ValueError: an id is not lower-case hex of the right length, or is zero.
    """
    return SpanContext(
        trace_id=hex_id(trace_id, 32, "trace id"),
        span_id=hex_id(span_id, 16, "span id"),
        is_remote=is_remote,
        trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT),
    )


def context_with_span(trace_id: str, span_id: str, context: Context | None = None) -> Context:
    """An OpenTelemetry :class:`~opentelemetry.context.Context` in which the
    recorded span ``(trace_id, span_id)`` is the current span.

    Attach it (``opentelemetry.context.attach``) around a step's work and any
    span a probe creates with the global tracer becomes a child of the step's
    span. The span in the context is a :class:`~opentelemetry.trace.NonRecordingSpan`
    (the real span is built from the events when the step ends) with a
    sampled, local (``is_remote=False``) span context. ``context`` is the
    context to extend (default: the current one).

    Raises:
        ValueError: an id is malformed.
    """
    return trace.set_span_in_context(NonRecordingSpan(span_context(trace_id, span_id)), context)


@contextlib.contextmanager
def activate_span(trace_id: str, span_id: str) -> Iterator[None]:
    """Make the recorded span ``(trace_id, span_id)`` current for the block.

    This is the runner's ``span_activator`` when tracing::

        Runner(log, span_activator=activate_span, ...)

    Spans that probe code creates inside a step (in its worker thread too:
    the context is copied there) become children of the step's span.
    """
    token = otel_context.attach(context_with_span(trace_id, span_id))
    try:
        yield
    finally:
        otel_context.detach(token)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceParent:
    """A parsed W3C ``traceparent``: ids as lower-case hex, and the sampled flag.

    ``str(parent)`` gives the version-00 header form.
    """

    trace_id: str
    span_id: str
    sampled: bool = True

    def __str__(self) -> str:
        return format_traceparent(self.trace_id, self.span_id, sampled=self.sampled)


def format_traceparent(trace_id: str, span_id: str, *, sampled: bool = True) -> str:
    """The W3C version-00 ``traceparent`` value for a span, e.g.
    ``00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01``.

    Raises:
        ValueError: an id is not lower-case hex of the right length, or is zero.
    """
    hex_id(trace_id, 32, "trace id")
    hex_id(span_id, 16, "span id")
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def parse_traceparent(value: str) -> TraceParent:
    """Parse a W3C ``traceparent`` value (surrounding whitespace ignored).

    Follows the W3C Trace Context rules: version ``ff`` is invalid; version
    ``00`` is exactly 55 characters; a later version may append fields after
    a ``-``, which are ignored; ids are lower-case hex and not all zeros.

    Raises:
        ValueError: the value is malformed; the message shows it, says why and
            gives the expected form.
    """
    try:
        return _parse_fields(value.strip())
    except ValueError as exc:
        raise ValueError(
            f"invalid traceparent {value!r}: {exc}; expected {_EXPECTED_FORM}"
        ) from None


def _parse_fields(text: str) -> TraceParent:
    if len(text) < _VERSION_00_LENGTH:
        raise ValueError(f"too short ({len(text)} characters, at least {_VERSION_00_LENGTH})")
    version = text[0:2]
    if not _HEX.issuperset(version):
        raise ValueError(f"version must be 2 lower-case hex digits, not {version!r}")
    if version == "ff":
        raise ValueError("version ff is forbidden")
    if version == "00" and len(text) != _VERSION_00_LENGTH:
        raise ValueError(f"version 00 must be exactly {_VERSION_00_LENGTH} characters")
    if text[2] != "-" or text[35] != "-" or text[52] != "-" or text[55:56] not in ("", "-"):
        raise ValueError("fields must be separated by '-'")
    hex_id(text[3:35], 32, "trace id")
    hex_id(text[36:52], 16, "span id")
    flags = text[53:55]
    if not _HEX.issuperset(flags):
        raise ValueError(f"flags must be 2 lower-case hex digits, not {flags!r}")
    return TraceParent(trace_id=text[3:35], span_id=text[36:52], sampled=bool(int(flags, 16) & 1))
