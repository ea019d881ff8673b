"""The codec's one decoder on records well-formed and damaged.

A well-formed record decodes to the event it was made from. A damaged one
either still decodes to a valid event or is refused with a
:class:`DecodeError` whose path leads to the field at fault in the record.
"""

from __future__ import annotations

import ast
import copy
import re
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events
from events import DecodeError

from .strategies import EVENTS, EXCEPTION_INFOS, JSON_VALUES

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


@PROPERTY
@given(event=EVENTS, info=EXCEPTION_INFOS)
@pytest.mark.slow
def test_well_formed_records_decode_to_what_they_were_made_from(
    event: events.Event, info: events.ExceptionInfo
) -> None:
    decoded = events.decode(events.encode(event))
    record = orjson.loads(orjson.dumps(events.encode_exception(info)))
    assert type(decoded) is type(event)
    assert decoded == event
    assert events.decode_exception(record) == info


def test_integers_for_floats_are_converted() -> None:
    record = {
        "v": 1,
        "type": "step.timed_out",
        "run_id": "r",
        "rank": 0,
        "wall_ns": 1,
        "mono_ns": 1,
        "timeout_s": 5,
        "elapsed_ns": 9,
    }
    event = events.decode_record(record)
    assert isinstance(event, events.StepTimedOut)
    assert type(event.timeout_s) is float


#: Values that sit next to the valid ones: wrong types, enum values of
#: other enums, empty and near-miss containers; now and then any JSON value.
NEAR_MISSES = st.sampled_from(
    [
        *("", "ok", "step", "absent", "ready", "E"),
        *(0, -1, 1.0, 1.5, True, False, None),
        *([], {}, ["a"], [1], [None], [{}], [{"type": "E"}]),
        *({"a": 1}, {"a": "b"}, {"a": None}, {"type": "E", "message": "", "reason": ""}),
    ]
)
TRICKY = st.one_of(NEAR_MISSES, NEAR_MISSES, NEAR_MISSES, JSON_VALUES)
FIELD_NAMES = st.sampled_from(
    ["surprise", "schema_version", "v", "type", "seq", "cause", "frames", "filename", "lineno"]
)


TAGS = [*events.EVENT_TYPES]


def containers(value: Any) -> list[Any]:
    """Every dict and list inside ``value``, ``value`` first."""
    found: list[Any] = []
    if isinstance(value, dict | list):
        found.append(value)
        for item in value.values() if isinstance(value, dict) else value:
            found += containers(item)
    return found


def mutate(record: dict[str, Any], data: st.DataObject) -> None:
    """Change one thing somewhere in ``record``, nested records included."""
    # The record itself half of the time: most fields live there.
    target = data.draw(st.just(record) | st.sampled_from(containers(record)))
    if isinstance(target, list):
        if not target:
            target.append(data.draw(TRICKY))
            return
        target[data.draw(st.integers(0, len(target) - 1))] = data.draw(TRICKY)
        return
    action = data.draw(st.sampled_from(["replace", "delete", "add"]))
    if action == "add" or not target:
        target[data.draw(FIELD_NAMES)] = data.draw(TRICKY)
        return
    key = data.draw(st.sampled_from(sorted(target)))
    if action == "delete":
        del target[key]
    else:
        target[key] = data.draw(TRICKY)


_PART = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]|\[('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")\]")


def parts(path: str) -> list[str | int]:
    """The keys and indices a reported path is made of."""
    found: list[str | int] = []
    position = 0
    while position < len(path):
        match = _PART.match(path, position)
        assert match is not None, f"{path!r} is not a path"
        name, index, key = match.groups()
        found.append(int(index) if index is not None else name or ast.literal_eval(key))
        position = match.end()
    return found


def follow(record: Any, path: list[str | int]) -> Any:
    """What ``path`` leads to in ``record``; a KeyError or IndexError where
    it leads nowhere."""
    for part in path:
        record = record[part]
    return record


#: How the decoder names a field at fault: the path, then what is wrong.
_WRONG = re.compile(r"field (?P<path>'[^']*'|\"[^\"]*\"): expected .*, got ")
_UNKNOWN = re.compile(r"field (?P<path>'[^']*'|\"[^\"]*\") is not a field of \w+ \(valid: [^)]*\)$")
_ABSENT = re.compile(r"\w+ is missing field\(s\) (?P<paths>.*)$")


def check_named(record: dict[str, Any], reason: str) -> None:
    """The field ``reason`` names is where it says in ``record``."""
    if match := _WRONG.match(reason) or _UNKNOWN.match(reason):
        follow(record, parts(ast.literal_eval(match["path"])))
    elif match := _ABSENT.match(reason):
        for named in ast.literal_eval(f"[{match['paths']}]"):
            *parent, last = parts(named)
            assert last not in follow(record, parent), reason
    else:
        # Only a class's own invariant is reported without a field.
        assert re.match(r"\w+: ", reason), reason


@PROPERTY
@given(event=EVENTS, data=st.data())
@pytest.mark.slow
def test_damaged_records_decode_or_name_the_field_at_fault(
    event: events.Event, data: st.DataObject
) -> None:
    record = orjson.loads(events.encode(event))
    mutate(record, data)
    tag = record.get("type")
    if record.get("v") != events.SCHEMA_VERSION or type(record.get("v")) is not int:
        return  # upcasting comes first
    if tag not in TAGS:
        return
    kept = copy.deepcopy(record)
    try:
        decoded = events.decode_record(record)
    except DecodeError as exc:
        assert record == kept
        check_named(record, exc.reason)
        return
    assert record == kept
    # What was decoded is an event in its own right.
    assert events.decode(events.encode(decoded)) == decoded


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("cause.frames[0].filename", ["cause", "frames", 0, "filename"]),
        ("versions['torch']", ["versions", "torch"]),
        ('attributes["it\'s"]', ["attributes", "it's"]),
    ],
)
def test_reported_paths_are_read_back(path: str, expected: list[str | int]) -> None:
    assert parts(path) == expected
