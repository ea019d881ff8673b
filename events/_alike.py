"""Logs alike: ranks whose logs differ only in the rank's own values.

The ranks of a launch run the same steps and mostly record the same thing:
the logs of two ranks differ in the rank, its place (``identity``), host
and pid, the times and the span ids, and in nothing else. A
:class:`~events.LogReader` that reads a run's logs notes which logs are alike in
that sense (a :class:`Shape` they share, made of the first such log once a
second log of its length is read), and builds a line of a log like one it
has read from that log's line (the *template*) instead of decoding it field
by field. :func:`events.replay` folds each shape once and puts each rank's
own values back (``events._rebase``).

Two lines are alike when, after the values that are the rank's own, they
are the same bytes. A template line is cut where its own values end (after
``parent_span_id``; after ``span_id`` in a line without a parent span, such
as ``run.finished`` or a decision; after ``pid`` in ``run.started``): the
*tail* after the cut holds every other field, and
the part before it only the envelope (and the place). A line is like the
template when it ends with the template's tail, has as many fields, and its
envelope fields other than the rank's own are equal. That is exact: a tail
that starts with ``,"`` can only be read at the top level of a valid line
(inside a string its first quote would end the string; nested, its last
brace would leave the line open), so the two lines hold the same fields
after the cut, with the same JSON values, byte for byte (``1`` and
``true`` or ``1.0`` are different bytes). Internal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ._builders import replacer
from ._model import SCHEMA_VERSION, Event, RunFinished, RunStarted

__all__: list[str] = []

#: The envelope's keys: what every record has before its event's own fields.
ENVELOPE = frozenset(
    {
        "v",
        "type",
        "run_id",
        "rank",
        "seq",
        "wall_ns",
        "mono_ns",
        "step",
        "trace_id",
        "span_id",
        "parent_span_id",
    }
)
#: The envelopes of a line built from its template: every field, or every
#: field but ``parent_span_id`` (a root span's, or a decision's).
_ENVELOPES = (ENVELOPE, ENVELOPE - {"parent_span_id"})
#: What a ``run.started`` records of the rank's place.
PLACE = frozenset({"identity", "host", "pid"})
#: The most shapes one reader keeps: beyond that, logs are read as they are.
MAX_SHAPES = 64

#: Line kinds: decoded from its template, or decoded in full and compared.
FROM_TEMPLATE = 0
COMPARED = 1


class TemplateLine:
    """One line of a shape: its tail and what the part before it holds."""

    __slots__ = (
        "build",
        "event",
        "key",
        "kind",
        "parented",
        "pathless",
        "prefix",
        "size",
        "tail",
        "top",
    )

    def __init__(
        self, event: Event, kind: int, tail: bytes, size: int, prefix: frozenset[str], top: bool
    ) -> None:
        self.event = event
        self.kind = kind
        self.tail = tail
        self.size = size
        self.prefix = prefix
        self.top = top
        #: whether the line has a ``parent_span_id`` (else it is ``None``)
        self.parented = "parent_span_id" in prefix
        #: whether its step is at the top of the tree by its path alone
        self.pathless = "/" not in event.step
        #: ``(template, rank, wall_ns, mono_ns, span_id, parent_span_id)`` ->
        #: the event of a line like this one
        self.build = rebuilder(type(event))
        #: what a line like this one must have: two lines with the same key
        #: accept the same lines, as alike
        self.key = (tail, size, prefix, kind, top, _envelope(event))


class Shape:
    """What the logs alike have in common: one template per line. Two
    :class:`~events.LogContents` with the same shape hold events that differ
    only in the rank's own values (see the module docstring)."""

    __slots__ = ("keys", "lines", "tails")

    def __init__(self, lines: Sequence[TemplateLine]) -> None:
        self.lines = tuple(lines)
        #: each line's tail, for a quick check of a whole log at once
        self.tails = [line.tail for line in self.lines]
        self.keys = [line.key for line in self.lines]


def top_level(step: str, parent: str | None, root: str | None) -> bool:
    """Whether a step is at the top of its rank's tree, as the projections
    judge it (a child of the rank's root span)."""
    if root is not None and parent is not None:
        return parent == root
    return "/" not in step


def root_of(events: Sequence[Event]) -> str | None:
    """The rank's root span: its ``run.started``'s, if it is the first event."""
    first = events[0] if events else None
    return first.span_id if isinstance(first, RunStarted) else None


def learn(lines: Sequence[bytes], events: Sequence[Event]) -> Shape | None:
    """The shape of a log whose complete lines are ``lines`` and that was
    decoded (strictly) to ``events``; ``None`` if a line has no cut to make
    (a record this release would not write)."""
    if len(lines) != len(events) or not events:
        return None
    root = root_of(events)
    made: list[TemplateLine] = []
    for content, event in zip(lines, events, strict=True):
        line = _template(content, event, root)
        if line is None:
            return None
        made.append(line)
    return Shape(made)


def _template(content: bytes, event: Event, root: str | None) -> TemplateLine | None:
    try:
        record = orjson.loads(content)
    except orjson.JSONDecodeError:  # deeper than orjson reads: decoded another way
        return None
    version = record.get("v")
    if type(version) is not int or version != SCHEMA_VERSION:
        return None  # upcast: not what a log of this release holds
    if isinstance(event, RunStarted):
        token = b'"pid":' + str(record.get("pid")).encode()
        allowed = ENVELOPE | PLACE
    elif "parent_span_id" in record:
        token = b'"parent_span_id":' + orjson.dumps(record["parent_span_id"])
        allowed = ENVELOPE
    else:
        token = b'"span_id":' + orjson.dumps(record.get("span_id"))
        allowed = ENVELOPE
    at = content.rfind(token)
    if at < 0:
        return None
    tail = content[at + len(token) :]
    if tail == b"}":
        after: set[str] = set()
    elif tail.startswith(b',"'):
        try:
            rest = orjson.loads(b"{" + tail[1:])
        except orjson.JSONDecodeError:
            return None
        after = set(rest)
    else:
        return None
    prefix = frozenset(record) - after
    if after & allowed or not prefix <= allowed:
        return None
    kind = (
        FROM_TEMPLATE
        if prefix in _ENVELOPES and not isinstance(event, RunStarted | RunFinished)
        else COMPARED
    )
    top = top_level(event.step, event.parent_span_id, root)
    return TemplateLine(event, kind, tail, len(record), prefix, top)


def _envelope(event: Event) -> tuple[Any, ...]:
    """What :func:`same_envelope` compares."""
    place = (
        (event.identity.world_size, event.identity.local_world_size)
        if isinstance(event, RunStarted)
        else None
    )
    return (type(event), event.run_id, event.step, event.trace_id, event.schema_version, place)


def same_envelope(event: Event, template: Event) -> bool:
    """Whether a log's event decoded in full is like its template's event in
    what the part before the cut holds (the rank's own values aside)."""
    return _envelope(event) == _envelope(template)


_REBUILDERS: dict[type[Any], Callable[..., Any]] = {}


def rebuilder(cls: type[Event]) -> Callable[..., Event]:
    """``(template, rank, wall_ns, mono_ns, span_id, parent_span_id)`` -> a
    copy of ``template`` with those values: an event decoded from its
    template."""
    made = _REBUILDERS.get(cls)
    if made is None:
        made = _REBUILDERS[cls] = replacer(
            cls, "rank", "wall_ns", "mono_ns", "span_id", "parent_span_id"
        )
    return made
