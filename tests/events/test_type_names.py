"""Exception types are recorded by their public path; version 1 logs, which
recorded private module paths, read back with the public ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

import events
from events import ExceptionInfo, RunFinished, StepFailed
from events._codec import _v1_to_v2
from events._errors import public_type_name
from events._exception_info import MAX_CHAIN

#: A failed zen4 start (``--inject zentorch=RuntimeError:...``) written by the
#: release before public type names: schema version 1, private paths.
PRIVATE_NAMES_RUN = Path(__file__).parent / "fixtures" / "private-type-names"
PRIVATE_NAMES_LOG = PRIVATE_NAMES_RUN / "rank-0.jsonl"


def exception_types(info: ExceptionInfo | None) -> list[str]:
    """Every type name in ``info``'s tree (causes, contexts, group members)."""
    found: list[str] = []
    stack = [info] if info is not None else []
    while stack:
        current = stack.pop()
        found.append(current.type)
        stack.extend(i for i in (current.cause, current.context) if i is not None)
        stack.extend(current.exceptions)
    return found


def test_the_fixture_is_a_version_1_log_with_private_names() -> None:
    records = [json.loads(line) for line in PRIVATE_NAMES_LOG.read_text().splitlines()]
    assert {record["v"] for record in records} == {1}
    assert b'"orchestrator.engine._config.UnspecifiedPlatformError"' in (
        PRIVATE_NAMES_LOG.read_bytes()
    )


def test_a_version_1_log_reads_with_public_names() -> None:
    contents = events.read_log(PRIVATE_NAMES_LOG)
    names = [
        name
        for event in contents.events
        if isinstance(event, StepFailed | RunFinished)
        for name in exception_types(event.cause)
    ]
    assert "orchestrator.engine.UnspecifiedPlatformError" in names
    assert all("._" not in name for name in names), names
    finished = contents.events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.cause is not None
    assert finished.cause.type == "orchestrator.engine.UnspecifiedPlatformError"
    assert finished.cause.name == "UnspecifiedPlatformError"
    assert {event.schema_version for event in contents.events} == {events.SCHEMA_VERSION}


def test_a_version_1_log_re_encodes_as_a_current_record() -> None:
    finished = events.read_log(PRIVATE_NAMES_LOG).events[-1]
    record = orjson.loads(events.encode(finished))
    assert record["v"] == events.SCHEMA_VERSION
    assert record["cause"]["type"] == "orchestrator.engine.UnspecifiedPlatformError"
    assert events.decode_record(record) == finished


@pytest.mark.parametrize(
    ("recorded", "public"),
    [
        ("orchestrator.engine._config.UnspecifiedPlatformError", "orchestrator.engine."),
        ("orchestrator._errors.StepTimeoutError", "orchestrator."),
        ("orchestrator._group.GroupError", "orchestrator."),
        ("events._messages.PolicyError", "events."),
        ("exporters._errors.SpanExportError", "exporters."),
        # Already public, builtins, other packages and private classes stay.
        ("orchestrator.engine.UnspecifiedPlatformError", "orchestrator.engine."),
        ("RuntimeError", ""),
        ("mylib._impl.ProbeError", "mylib._impl."),
        ("orchestrator.testing.FakeError", "orchestrator.testing."),
        ("eventsource._x.Error", "eventsource._x."),
        ("orchestrator._runner._Propagating", "orchestrator."),
    ],
)
def test_public_type_name(recorded: str, public: str) -> None:
    expected = public + recorded.rpartition(".")[2]
    assert public_type_name(recorded) == expected


def info_record(type_name: str, **nested: Any) -> dict[str, Any]:
    return {"type": type_name, "message": "m", "reason": "r", **nested}


def test_the_upcaster_walks_causes_contexts_and_group_members() -> None:
    cause = info_record(
        "orchestrator._errors.StepTimeoutError",
        cause=info_record("events._errors.LogError"),
        context=info_record("exporters._errors.ExportersError"),
        exceptions=[info_record("orchestrator._group.GroupError"), "not an object"],
    )
    original = {"v": 1, "type": "step.failed", "cause": cause}
    before = json.dumps(original)

    upgraded = _v1_to_v2(dict(original))

    top = upgraded["cause"]
    assert top["type"] == "orchestrator.StepTimeoutError"
    assert top["cause"]["type"] == "events.LogError"
    assert top["context"]["type"] == "exporters.ExportersError"
    assert top["exceptions"][0]["type"] == "orchestrator.GroupError"
    assert top["exceptions"][1] == "not an object"  # left for the codec to reject
    assert json.dumps(original) == before  # the caller's objects are not changed


def test_the_upcaster_leaves_records_without_a_cause() -> None:
    record = {"v": 1, "type": "step.succeeded", "result": {"type": "orchestrator._x.Y"}}
    assert _v1_to_v2(dict(record)) == record


def test_a_deeply_nested_cause_is_cut_to_the_bound_and_upgraded() -> None:
    depth = 5_000
    cause: dict[str, Any] = info_record("orchestrator._errors.GraphError")
    for _ in range(depth):
        cause = info_record("orchestrator._errors.GraphError", cause=cause)
    upgraded = _v1_to_v2({"v": 1, "type": "step.failed", "cause": cause})
    current: dict[str, Any] | None = upgraded["cause"]
    seen = 0
    while current is not None:
        assert current["type"] == "orchestrator.GraphError"
        last, current = current, current.get("cause")
        seen += 1
    assert seen == MAX_CHAIN
    assert last["truncated"] is True
