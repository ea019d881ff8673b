"""Any chain a log can hold is cut to the bound capture keeps.

Capture keeps :data:`MAX_CHAIN` linked exceptions, but a log written by
another program is only JSON: it may nest ``cause`` (or group members) as
deep as a JSON reader goes. Decoding cuts such a record to the same bound,
marking where it cut, so every record in memory is small enough to compare,
hash, print and encode by recursion; a line nested deeper than orjson reads
(1,024 levels) is not valid JSON, named as such with its file and line.
"""

from __future__ import annotations

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
    LogCorruptError,
    RunOutcome,
    StepFailed,
    decode_exception,
    encode_exception,
    read_log,
    validate,
)
from events._exception_info import MAX_CHAIN, cut_chain
from events.testing import EventStream

from .samples import foreign_chain, with_foreign_cause

#: Far past the bound, within what orjson reads.
LONG = 500
#: Past what orjson reads.
TOO_DEEP = 10_000


def chain(depth: int, *, last: str = "") -> ExceptionInfo:
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


def nested_groups(depth: int) -> ExceptionInfo:
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


def failed_line(cause: bytes) -> bytes:
    """A ``step.failed`` line whose cause is the JSON ``cause``."""
    record = events.encode_record(
        StepFailed(
            run_id="r",
            rank=0,
            wall_ns=1,
            mono_ns=1,
            step="s",
            cause=ExceptionInfo(type="E", message="", reason="E"),
        )
    )
    return orjson.dumps(record).replace(orjson.dumps(record["cause"]), cause)


def messages(info: ExceptionInfo) -> list[str]:
    return [link.message for link in info.chain()]


# --- ExceptionInfo -------------------------------------------------------------------


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


def test_repr_is_the_form_attrs_writes() -> None:
    small = ExceptionInfo(
        type="E",
        message="m",
        reason="E: m",
        exceptions=(ExceptionInfo(type="F", message="", reason="F"),),
    )
    assert repr(small) == (
        "ExceptionInfo(type='E', message='m', reason='E: m', errno=None, strerror=None, "
        "filename=None, module_name=None, module_path=None, frames=(), cause=None, "
        "context=None, notes=(), exceptions=(ExceptionInfo(type='F', message='', reason='F', "
        "errno=None, strerror=None, filename=None, module_name=None, module_path=None, "
        "frames=(), cause=None, context=None, notes=(), exceptions=(), truncated=False),), "
        "truncated=False)"
    )


def test_chain_root_and_format_of_a_deep_record() -> None:
    info = chain(LONG)
    links = info.chain()
    assert len(links) == LONG
    assert info.root().message == "link 0"
    text = info.format()
    assert text.startswith('Traceback (most recent call last):\n  File "/opt/probe.py", line 0')
    assert text.endswith("RuntimeError: link 499\n")
    assert text.count("RuntimeError: link ") == LONG


def test_format_can_show_the_nearest_links_only() -> None:
    text = chain(LONG).format(max_links=3)
    assert text.startswith("... (497 more linked exceptions not shown)\n")
    assert [line for line in text.splitlines() if line.startswith("RuntimeError")] == [
        "RuntimeError: link 497",
        "RuntimeError: link 498",
        "RuntimeError: link 499",
    ]
    one_left = chain(4).format(max_links=3)
    assert one_left.startswith("... (1 more linked exception not shown)\n")
    assert chain(3).format(max_links=3) == chain(3).format()
    alone = chain(LONG).format(chain=False)
    assert alone == (
        "Traceback (most recent call last):\n"
        '  File "/opt/probe.py", line 499, in probe\n'
        "RuntimeError: link 499\n"
    )


def test_format_summarises_groups_nested_more_than_ten_deep() -> None:
    text = nested_groups(LONG).format()
    assert text.count("ExceptionGroup: group") == 11
    assert "2 member exceptions of a group nested more than 10 deep not shown" in text
    assert "innermost" not in text
    shallow = nested_groups(3).format()
    assert "innermost" in shallow
    assert "not shown" not in shallow


# --- the codec cuts a chain to the bound --------------------------------------------


def test_a_chain_past_the_bound_decodes_cut_and_marked_where_it_was_cut() -> None:
    event = events.decode(failed_line(foreign_chain(LONG)))
    assert isinstance(event, StepFailed)
    assert event.cause is not None
    kept = event.cause.chain()
    # The outermost links, as capture keeps them; the last says it was cut.
    assert messages(event.cause) == [
        f"link {index}" for index in range(LONG - 1, LONG - 1 - MAX_CHAIN, -1)
    ]
    assert [link.truncated for link in kept] == [False] * (MAX_CHAIN - 1) + [True]
    assert "exception chain truncated" in event.cause.format()
    # What is kept is ordinary data again: it compares, hashes and encodes.
    assert events.decode(events.encode(event)) == event
    assert hash(event) == hash(events.decode(events.encode(event)))


def test_groups_nested_past_the_bound_are_cut_too() -> None:
    record = encode_exception(nested_groups(40))  # 81 records in all
    decoded = decode_exception(record)

    def count(info: ExceptionInfo) -> int:
        return 1 + sum(count(member) for member in info.exceptions)

    assert count(decoded) == MAX_CHAIN
    assert decode_exception(encode_exception(decoded)) == decoded
    cut = decoded
    while not cut.truncated:
        cut = cut.exceptions[-1] if len(cut.exceptions) == 2 else cut.exceptions[0]
    assert cut.truncated


@pytest.mark.parametrize("make", [chain, nested_groups], ids=["chain", "groups"])
def test_a_record_within_the_bound_is_decoded_whole(make: object) -> None:
    info = chain(MAX_CHAIN) if make is chain else nested_groups(MAX_CHAIN // 2 - 1)
    record = encode_exception(info)
    assert cut_chain(record) is record
    assert decode_exception(record) == info
    assert events.decode(events.encode(failed(info))) == failed(info)


def test_cutting_leaves_the_callers_record_as_it_was() -> None:
    record = orjson.loads(foreign_chain(200))
    before = orjson.dumps(record)
    assert len(decode_exception(record).chain()) == MAX_CHAIN
    assert orjson.dumps(record) == before


def test_a_wrong_field_deep_down_is_named_with_its_path() -> None:
    record = encode_exception(chain(6))
    node = record
    for _ in range(5):
        node = node.get("cause") or node["context"]
    node["message"] = 5
    with pytest.raises(DecodeError) as caught:
        decode_exception(record)
    assert caught.value.reason == (
        "field 'cause.context.cause.context.cause.message': expected a string, got integer 5"
    )


def test_a_ready_made_record_in_a_link_is_refused() -> None:
    record = {"type": "E", "message": "m", "reason": "E: m", "cause": chain(3)}
    with pytest.raises(DecodeError, match="field 'cause': expected an object, got ExceptionInfo"):
        decode_exception(record)
    grouped = {"type": "E", "message": "m", "reason": "E: m", "exceptions": [chain(2)]}
    with pytest.raises(DecodeError, match=r"field 'exceptions\[0\]': expected an object"):
        decode_exception(grouped)


def test_a_record_holding_itself_is_cut_at_the_bound() -> None:
    record: dict[str, object] = {"type": "E", "message": "m", "reason": "E: m"}
    record["cause"] = record
    info = decode_exception(record)
    assert len(info.chain()) == MAX_CHAIN
    assert info.chain()[-1].truncated
    grouped: dict[str, object] = {"type": "E", "message": "m", "reason": "E: m"}
    grouped["exceptions"] = [grouped]
    assert decode_exception(grouped).exceptions[0].exceptions[0].type == "E"


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


def test_a_line_deeper_than_json_readers_go_is_not_valid_json() -> None:
    with pytest.raises(DecodeError, match=r"not valid JSON at column \d+: .*(recursion|depth)"):
        events.decode(failed_line(foreign_chain(TOO_DEEP)))


# --- logs ----------------------------------------------------------------------------


def failed(info: ExceptionInfo) -> StepFailed:
    return StepFailed(run_id="r", rank=0, wall_ns=1, mono_ns=1, step="s", cause=info)


def write_log(path: Path, info: ExceptionInfo) -> EventStream:
    builder = EventStream(rank=0, world_size=1).run_started()
    builder.started("probe")
    builder.failed("probe", info)
    builder.run_finished(RunOutcome.FAILED, cause=info, failed_step="probe")
    with JsonlLog(path, run_id=builder.run_id, rank=0) as log:
        for event in builder.events:
            log.append(event)
    return builder


def test_a_log_with_a_long_foreign_chain_reads_and_validates_cut(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    builder = write_log(path, ExceptionInfo(type="E", message="", reason="E"))
    lines = path.read_bytes().splitlines(keepends=True)
    # Rewrite the failed step's cause as another program might have.
    lines[2] = with_foreign_cause(lines[2], foreign_chain(LONG))
    path.write_bytes(b"".join(lines))
    assert validate(path) == []
    contents = read_log(path)
    cause = contents.events[2].cause  # type: ignore[attr-defined]
    assert len(cause.chain()) == MAX_CHAIN
    assert contents.events[3] == builder.events[3]


def test_a_line_too_deep_to_read_names_its_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    write_log(path, ExceptionInfo(type="E", message="", reason="E"))
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = with_foreign_cause(lines[2], foreign_chain(TOO_DEEP))
    path.write_bytes(b"".join(lines))
    with pytest.raises(LogCorruptError) as caught:
        read_log(path)
    assert (caught.value.path, caught.value.line) == (path, 3)
    assert "not valid JSON" in caught.value.reason
    (problem,) = [p for p in validate(path) if p.fatal]
    assert problem.line == 3
