"""Spans of a record whose cause chain is thousands of links deep: one
exception event per link, built in linear time and size, and a Jaeger file
that holds them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from events import ExceptionInfo, FrameInfo, RunOutcome
from events.testing import EventStream
from exporters import JaegerJsonExporter, spans_from_events

DEPTH = 10_000


def chain(depth: int = DEPTH) -> ExceptionInfo:
    node: ExceptionInfo | None = None
    for index in range(depth):
        node = ExceptionInfo(
            type="RuntimeError",
            message=f"link {index}",
            reason=f"RuntimeError: link {index}",
            frames=(FrameInfo(filename="/opt/probe.py", lineno=index, name="probe"),),
            cause=node,
        )
    assert node is not None
    return node


def leaf(name: str, cause: ExceptionInfo | None = None) -> ExceptionInfo:
    return ExceptionInfo(type="ValueError", message=name, reason=f"ValueError: {name}", cause=cause)


def failed_run(info: ExceptionInfo) -> EventStream:
    builder = EventStream(rank=0, world_size=1).run_started()
    builder.started("probe")
    builder.failed("probe", info)
    builder.run_finished(RunOutcome.FAILED, cause=info, failed_step="probe")
    return builder


def exception_events(info: ExceptionInfo) -> list[dict[str, object]]:
    spans = spans_from_events(failed_run(info).events)
    (probe,) = [span for span in spans if span.name == "probe"]
    return [dict(event.attributes or {}) for event in probe.events if event.name == "exception"]


def reference_order(info: ExceptionInfo) -> Iterator[ExceptionInfo]:
    """The documented order, written recursively (for shallow records):
    each link, then its group members with everything below them."""
    for node in info.chain():
        yield node
        for member in node.exceptions:
            yield from reference_order(member)


@pytest.mark.slow
def test_every_link_is_an_event_and_the_text_grows_linearly() -> None:
    attributes = exception_events(chain())
    assert len(attributes) == DEPTH
    assert [a["exception.message"] for a in attributes[:2]] == ["link 9999", "link 9998"]
    assert attributes[-1]["exception.message"] == "link 0"
    first = str(attributes[0]["exception.stacktrace"])
    # The first event: the traceback as Python prints it, nearest 64 links.
    assert first.startswith("... (9,936 more linked exceptions not shown)\n")
    assert first.count("RuntimeError: link") == 64
    assert first.endswith("RuntimeError: link 9999\n")
    # The others: their own exception each.
    assert attributes[1]["exception.stacktrace"] == (
        'Traceback (most recent call last):\n  File "/opt/probe.py", line 9998, in probe\n'
        "RuntimeError: link 9998\n"
    )
    total = sum(len(str(a["exception.stacktrace"])) for a in attributes)
    assert total < 2 * len(first) + DEPTH * 120


def test_a_captured_chain_is_rendered_whole_in_the_first_event() -> None:
    info = chain(64)
    attributes = exception_events(info)
    assert attributes[0]["exception.stacktrace"] == info.format()
    for event, member in zip(attributes[1:], info.chain()[1:], strict=True):
        assert event["exception.stacktrace"] == member.format(chain=False)


def test_group_members_keep_their_order() -> None:
    inner_group = ExceptionInfo(
        type="ExceptionGroup",
        message="inner",
        reason="ExceptionGroup: inner",
        exceptions=(leaf("c"), leaf("d", leaf("d-cause"))),
        cause=leaf("inner-cause"),
    )
    outer = ExceptionInfo(
        type="ExceptionGroup",
        message="outer",
        reason="ExceptionGroup: outer",
        exceptions=(leaf("a", leaf("a-cause")), inner_group),
        context=ExceptionInfo(
            type="ExceptionGroup",
            message="context",
            reason="ExceptionGroup: context",
            exceptions=(leaf("e"),),
        ),
    )
    messages = [a["exception.message"] for a in exception_events(outer)]
    assert messages == [member.message for member in reference_order(outer)]
    assert messages == [
        "outer",
        "a",
        "a-cause",
        "inner",
        "c",
        "d",
        "d-cause",
        "inner-cause",
        "context",
        "e",
    ]


@pytest.mark.slow
def test_groups_nested_thousands_deep() -> None:
    node = leaf("innermost")
    for index in range(DEPTH):
        node = ExceptionInfo(
            type="ExceptionGroup",
            message=f"group {index}",
            reason=f"ExceptionGroup: group {index}",
            exceptions=(node,),
        )
    attributes = exception_events(node)
    assert len(attributes) == DEPTH + 1
    assert attributes[-1]["exception.message"] == "innermost"


def test_the_jaeger_file_holds_every_event(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    exporter = JaegerJsonExporter(path)
    exporter.export(spans_from_events(failed_run(chain()).events))
    exporter.shutdown()
    document = json.loads(path.read_text(encoding="utf-8"))
    (trace,) = document["data"]
    probe = next(span for span in trace["spans"] if span["operationName"] == "probe")
    assert len(probe["logs"]) == DEPTH
    fields = {field["key"]: field["value"] for field in probe["logs"][-1]["fields"]}
    assert fields["exception.message"] == "link 0"
