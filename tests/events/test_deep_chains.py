"""Any chain a log can hold: records thousands of links deep are compared,
hashed, printed, rendered, encoded, written, read and validated without
recursion.

Capture keeps 64 links, but a log written by another program is only JSON:
it may nest ``cause`` (or group members) as deep as it likes. orjson writes
at most 254 levels of nesting and reads at most 1,024; the codec splices and
parses around both.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import orjson
import pytest

import events
from events import (
    DecodeError,
    ExceptionInfo,
    FrameInfo,
    JsonlLog,
    JsonValue,
    LogCorruptError,
    RunOutcome,
    StepFailed,
    StepSucceeded,
    decode_exception,
    encode_exception,
    read_log,
    validate,
)
from events._codec import _dumps, _parse_deep, _spliced, encode_line
from tests.orchestrator.engine.streams import RankBuilder

DEPTH = 10_000


def chain(depth: int = DEPTH, *, last: str = "") -> ExceptionInfo:
    """``depth`` links, ``link 0`` innermost; each has a frame and
    alternates cause and context, so both links are exercised."""
    node: ExceptionInfo | None = None
    for index in range(depth):
        message = f"link {index}{last if index == 0 else ''}"
        node = ExceptionInfo(
            type="RuntimeError",
            message=message,
            reason=f"RuntimeError: {message}",
            frames=(FrameInfo(filename="/opt/probe.py", lineno=index, name="probe"),),
            cause=node if index % 2 else None,
            context=None if index % 2 else node,
        )
    assert node is not None
    return node


def nested_groups(depth: int = DEPTH) -> ExceptionInfo:
    """Exception groups nested ``depth`` deep, each with one plain sibling."""
    node = ExceptionInfo(type="ValueError", message="innermost", reason="ValueError: innermost")
    for index in range(depth):
        sibling = ExceptionInfo(type="KeyError", message=str(index), reason=f"KeyError: {index}")
        node = ExceptionInfo(
            type="ExceptionGroup",
            message=f"group {index}",
            reason=f"ExceptionGroup: group {index}",
            exceptions=(node, sibling),
        )
    return node


def failed(info: ExceptionInfo) -> StepFailed:
    return StepFailed(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", cause=info)


def innermost(record: dict[str, object]) -> dict[str, object]:
    """The innermost link of an encoded chain."""
    node = record
    while True:
        below = node.get("cause") or node.get("context")
        if not isinstance(below, dict):
            return node
        node = below


def test_the_recursion_limit_is_far_below_the_depth() -> None:
    # What makes every test here meaningful.
    assert sys.getrecursionlimit() < DEPTH


# --- ExceptionInfo -------------------------------------------------------------------


def test_equality_and_hashing_of_deep_records() -> None:
    left, right = chain(), chain()
    assert left == right
    assert not left != right  # noqa: SIM202 - __ne__ is derived from the written __eq__
    assert hash(left) == hash(right)
    assert left != chain(last="!")  # differs only in the innermost link
    assert left != chain(DEPTH - 1)
    assert left != "not a record"
    assert {left, right} == {left}
    assert nested_groups() == nested_groups()
    assert hash(nested_groups()) == hash(nested_groups())
    different = nested_groups(DEPTH - 1)
    assert nested_groups() != different


def test_equality_and_hashing_match_field_by_field_comparison() -> None:
    base = ExceptionInfo(type="E", message="m", reason="E: m")
    variants = [
        ExceptionInfo(type="F", message="m", reason="E: m"),
        ExceptionInfo(type="E", message="m", reason="E: m", errno=1),
        ExceptionInfo(type="E", message="m", reason="E: m", notes=("n",)),
        ExceptionInfo(type="E", message="m", reason="E: m", truncated=True),
        ExceptionInfo(type="E", message="m", reason="E: m", cause=base),
        ExceptionInfo(type="E", message="m", reason="E: m", context=base),
        ExceptionInfo(type="E", message="m", reason="E: m", exceptions=(base,)),
        ExceptionInfo(
            type="E",
            message="m",
            reason="E: m",
            frames=(FrameInfo(filename="f", lineno=1, name="n"),),
        ),
    ]
    for variant in variants:
        assert variant != base
        fields = {field.name: getattr(variant, field.name) for field in attrs.fields(ExceptionInfo)}
        assert variant == ExceptionInfo(**fields)
    # A cause and a context holding the same record are different links.
    assert variants[4] != variants[5]
    assert hash(variants[4]) != hash(variants[5])


def test_repr_of_a_deep_record() -> None:
    text = repr(chain())
    assert text.startswith("ExceptionInfo(type='RuntimeError', message='link 9999'")
    assert text.count("ExceptionInfo(") == DEPTH
    assert "message='link 0'" in text
    small = ExceptionInfo(
        type="E",
        message="m",
        reason="E: m",
        exceptions=(ExceptionInfo(type="F", message="", reason="F"),),
    )
    # The form attrs writes, a 1-tuple included.
    assert repr(small) == (
        "ExceptionInfo(type='E', message='m', reason='E: m', errno=None, strerror=None, "
        "filename=None, module_name=None, module_path=None, frames=(), cause=None, "
        "context=None, notes=(), exceptions=(ExceptionInfo(type='F', message='', reason='F', "
        "errno=None, strerror=None, filename=None, module_name=None, module_path=None, "
        "frames=(), cause=None, context=None, notes=(), exceptions=(), truncated=False),), "
        "truncated=False)"
    )
    assert repr(nested_groups()).count("ExceptionInfo(") == 2 * DEPTH + 1


def test_chain_root_and_format_of_a_deep_record() -> None:
    info = chain()
    links = info.chain()
    assert len(links) == DEPTH
    assert info.root().message == "link 0"
    text = info.format()
    assert text.startswith('Traceback (most recent call last):\n  File "/opt/probe.py", line 0')
    assert text.endswith("RuntimeError: link 9999\n")
    assert text.count("RuntimeError: link ") == DEPTH


def test_format_can_show_the_nearest_links_only() -> None:
    text = chain().format(max_links=3)
    assert text.startswith("... (9,997 more linked exceptions not shown)\n")
    assert [line for line in text.splitlines() if line.startswith("RuntimeError")] == [
        "RuntimeError: link 9997",
        "RuntimeError: link 9998",
        "RuntimeError: link 9999",
    ]
    one_left = chain(4).format(max_links=3)
    assert one_left.startswith("... (1 more linked exception not shown)\n")
    assert chain(3).format(max_links=3) == chain(3).format()
    alone = chain().format(chain=False)
    assert alone == (
        "Traceback (most recent call last):\n"
        '  File "/opt/probe.py", line 9999, in probe\n'
        "RuntimeError: link 9999\n"
    )


def test_format_summarises_groups_nested_more_than_ten_deep() -> None:
    text = nested_groups().format()
    assert text.count("ExceptionGroup: group") == 11
    assert "2 member exceptions of a group nested more than 10 deep not shown" in text
    assert "innermost" not in text
    shallow = nested_groups(3).format()
    assert "innermost" in shallow
    assert "not shown" not in shallow


# --- the codec -----------------------------------------------------------------------


@pytest.mark.parametrize("make", [chain, nested_groups], ids=["chain", "groups"])
def test_deep_records_round_trip(make: Callable[[], ExceptionInfo]) -> None:
    info = make()
    event = failed(info)
    record = events.encode_record(event)
    # orjson alone refuses the record, and the line the codec writes.
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(record)
    line = events.encode(event)
    with pytest.raises(orjson.JSONDecodeError, match="depth"):
        orjson.loads(line)
    assert events.decode(line) == event
    assert encode_line(event) == line + b"\n"
    assert decode_exception(encode_exception(info)) == info


def test_the_spliced_line_is_the_json_orjson_would_write() -> None:
    # Shallow enough for orjson to write in one piece: splicing must give
    # the same bytes.
    event = failed(chain(120))
    whole = orjson.dumps(events.encode_record(event))
    assert orjson.dumps(_spliced(events.encode_record(event))) == whole
    assert _dumps(events.encode_record(event)) == whole


def test_deep_json_in_an_any_field_round_trips() -> None:
    nested: JsonValue = "leaf"
    for _ in range(3_000):
        nested = [nested, {"k": 1}]
    event = StepSucceeded(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", result=nested)
    decoded = events.decode(events.encode(event))
    assert isinstance(decoded, StepSucceeded)
    # Compared level by level: == on lists this deep would recurse.
    left, right = decoded.result, nested
    depth = 0
    while isinstance(right, list):
        assert isinstance(left, list)
        assert len(left) == 2
        assert left[1] == right[1]
        left, right = left[0], right[0]
        depth += 1
    assert (left, depth) == ("leaf", 3_000)


def test_a_value_holding_itself_still_fails_as_orjson_says() -> None:
    looped: list[JsonValue] = []
    looped.append(looped)
    event = StepSucceeded(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", result=looped)
    with pytest.raises(orjson.JSONEncodeError):
        events.encode(event)


def test_a_wrong_field_deep_down_is_named_with_a_counted_path() -> None:
    record = events.encode_record(failed(chain()))
    innermost(record["cause"])["message"] = 5
    with pytest.raises(DecodeError) as caught:
        events.decode(_dumps(record))
    # Links alternate context and cause: runs of one are counted only when
    # longer than three, so this path is written out.
    assert caught.value.reason.startswith("field 'cause.cause.context.cause.context.")
    assert caught.value.reason.endswith(".message': expected a string, got integer 5")
    assert len(caught.value.reason) < 200_000

    groups = encode_exception(nested_groups(50))
    node = groups
    for _ in range(50):
        node = node["exceptions"][0]
    node["type"] = None
    with pytest.raises(DecodeError) as caught:
        decode_exception(groups)
    assert caught.value.reason == (
        "field 'exceptions[0](x50).type': expected a string, got null None"
    )


def test_a_ready_made_record_in_a_link_is_refused() -> None:
    record = {"type": "E", "message": "m", "reason": "E: m", "cause": chain(3)}
    with pytest.raises(DecodeError, match="field 'cause': expected an object, got ExceptionInfo"):
        decode_exception(record)
    grouped = {"type": "E", "message": "m", "reason": "E: m", "exceptions": [chain(2)]}
    with pytest.raises(DecodeError, match=r"field 'exceptions\[0\]': expected an object"):
        decode_exception(grouped)


def test_decoding_leaves_the_callers_record_as_it_was() -> None:
    record = encode_exception(chain(5))
    before = orjson.dumps(record)
    decode_exception(record)
    innermost(record)["message"] = 5
    with pytest.raises(DecodeError):
        decode_exception(record)
    innermost(record)["message"] = "link 0"
    assert orjson.dumps(record) == before


# --- the iterative parser reads what orjson reads ------------------------------------

VALID = [
    b"{}",
    b"[]",
    b' { "a" : [ 1 , -2.5e3 , true , false , null , "x" ] } ',
    b'"\\u00e9\\ud83d\\ude00\\n\\"\\\\\\/"',
    b"0",
    b"-0",
    b"1e300",
    b"18446744073709551615",
    b"18446744073709551616",  # past 64 bits: orjson gives a float
    b"-9223372036854775809",
    '{"é": "ü", "k": {"k": {}}}'.encode(),
    b'{"dup": 1, "dup": 2}',
    b"\t\r\n[1]\n",
]
INVALID = [
    b"",
    b"[1,]",
    b'{"a":1,}',
    b"[1 2]",
    b"{1: 2}",
    b'{"a" 1}',
    b"NaN",
    b"Infinity",
    b"1e400",
    b"01",
    b"1.",
    b".5",
    b"+1",
    b"tru",
    b'"\\ud800"',  # a lone surrogate
    b'"a\x01b"',  # a raw control character
    b'"\\x41"',
    b'"unterminated',
    b"[1]]",
    b"[1] 2",
    b'"\xff"',  # not UTF-8
    b"\x0c[1]",  # form feed is not JSON whitespace
]


@pytest.mark.parametrize("document", VALID)
def test_the_parser_reads_valid_json_as_orjson_does(document: bytes) -> None:
    assert _parse_deep(document) == orjson.loads(document)
    wrapped = b'{"w":' * 1_500 + document + b"}" * 1_500
    parsed = _parse_deep(wrapped)
    for _ in range(1_500):
        parsed = parsed["w"]
    assert parsed == orjson.loads(document)


@pytest.mark.parametrize("document", INVALID)
def test_the_parser_refuses_what_orjson_refuses(document: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(document)
    with pytest.raises(ValueError):  # noqa: PT011 - any refusal will do
        _parse_deep(document)
    with pytest.raises(ValueError):  # noqa: PT011
        _parse_deep(b"[" * 1_500 + b"0," + document + b"]" * 1_500)


def test_a_line_neither_reads_keeps_orjsons_explanation() -> None:
    line = b'{"v":' * 2_000 + b"[1,]" + b"}" * 2_000
    with pytest.raises(DecodeError, match="not valid JSON: depth limit exceeded"):
        events.decode(line)


# --- logs ----------------------------------------------------------------------------


def deep_failure(info: ExceptionInfo) -> RankBuilder:
    builder = RankBuilder(0, world_size=1).run_started()
    builder.started("probe")
    builder.failed("probe", info)
    builder.run_finished(RunOutcome.FAILED, cause=info, failed_step="probe")
    return builder


def write_log(path: Path, builder: RankBuilder) -> None:
    with JsonlLog(path, run_id=builder.run_id, rank=0) as log:
        for event in builder.events:
            log.append(event)


def test_a_deep_log_is_written_read_and_validated(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    builder = deep_failure(chain())
    write_log(path, builder)
    assert validate(path) == []
    contents = read_log(path)
    assert list(contents.events) == builder.events
    # Reopening the log to append reads it back too.
    reopened = JsonlLog(path, run_id=builder.run_id, rank=0)
    reopened.close()


def test_damage_deep_in_a_deep_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    write_log(path, deep_failure(chain()))
    lines = path.read_bytes().splitlines(keepends=True)
    # Cut the failed step's line short of its closing braces.
    lines[2] = lines[2][: len(lines[2]) // 2] + b"\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(LogCorruptError) as caught:
        read_log(path)
    assert (caught.value.path, caught.value.line) == (path, 3)
    assert "not valid JSON" in caught.value.reason
    (problem,) = [p for p in validate(path) if p.fatal]
    assert problem.line == 3


def test_a_record_shared_by_two_links_round_trips() -> None:
    shared = chain(3)
    group = ExceptionInfo(
        type="ExceptionGroup",
        message="two",
        reason="ExceptionGroup: two",
        exceptions=(shared, shared),
        cause=shared,
    )
    record = encode_exception(group)
    assert record["exceptions"] == [record["cause"], record["cause"]]
    assert decode_exception(record) == group
    assert events.decode(events.encode(failed(group))) == failed(group)


def test_a_record_holding_itself_is_refused() -> None:
    record: dict[str, object] = {"type": "E", "message": "m", "reason": "E: m"}
    record["cause"] = record
    with pytest.raises(DecodeError, match="link back"):
        decode_exception(record)
    grouped: dict[str, object] = {"type": "E", "message": "m", "reason": "E: m"}
    grouped["exceptions"] = [grouped]
    with pytest.raises(DecodeError, match="link back"):
        decode_exception(grouped)
