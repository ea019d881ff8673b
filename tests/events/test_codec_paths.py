"""The codec's two paths: generated functions, and field-by-field checks.

A well-formed record is decoded by the generated decoder alone. Anything
else goes to the precise checks, which name what is wrong. The two must
agree on every record: the same event or the same error, never an event
from one where the other refuses.
"""

from __future__ import annotations

import copy
from typing import Any
from unittest import mock

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events
from events import DecodeError, _codec

from .strategies import EVENTS, EXCEPTION_INFOS, JSON_VALUES

PROPERTY = settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def refuse(self: object, record: dict[str, Any], path: str) -> None:
    raise AssertionError(f"the precise checks ran for {record!r}")


@PROPERTY
@given(event=EVENTS, info=EXCEPTION_INFOS)
@pytest.mark.slow
def test_well_formed_records_take_the_generated_path(
    event: events.Event, info: events.ExceptionInfo
) -> None:
    with mock.patch.object(_codec._Checks, "load", refuse):
        decoded = events.decode(events.encode(event))
        record = orjson.loads(orjson.dumps(events.encode_exception(info)))
        exception = events.decode_exception(record)
    assert type(decoded) is type(event)
    assert decoded == event
    assert exception == info


def test_integers_for_floats_are_converted_on_the_generated_path() -> None:
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
    with mock.patch.object(_codec._Checks, "load", refuse):
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


def precise(record: dict[str, Any]) -> events.Event:
    """What the field-by-field checks alone make of a version-1 record."""
    fields = dict(record)
    tag = fields.pop("type")
    del fields["v"]
    event: events.Event = _codec._EVENT_CHECKS[tag].load(fields, "")
    return event


def outcome(decode: Any, record: dict[str, Any]) -> tuple[Any, ...]:
    try:
        event = decode(copy.deepcopy(record))
    except DecodeError as exc:
        return ("error", type(exc), exc.reason)
    # encode() tells 1 from 1.0, where == does not.
    return ("event", type(event), events.encode(event))


@PROPERTY
@given(event=EVENTS, data=st.data())
@pytest.mark.slow
def test_both_paths_agree_on_damaged_records(event: events.Event, data: st.DataObject) -> None:
    record = orjson.loads(events.encode(event))
    mutate(record, data)
    tag = record.get("type")
    if record.get("v") != 1 or type(record.get("v")) is not int or tag not in TAGS:
        return  # upcasting and unknown types come before either path
    assert outcome(events.decode_record, record) == outcome(precise, record)
