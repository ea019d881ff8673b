"""The codec: records, upcasting, strict field checks, no imports."""

from __future__ import annotations

import copy
import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import orjson
import pytest

import events
from events import (
    DecodeError,
    ExceptionInfo,
    FrameInfo,
    Outcome,
    RunOutcome,
    StepKind,
    UnknownEventTypeError,
    UnsupportedVersionError,
)
from events._codec import structure

FIXTURES = Path(__file__).parent / "fixtures"
V0_LOG = FIXTURES / "v0-rank0.jsonl"


def base(**fields: Any) -> dict[str, Any]:
    """A minimal valid ``step.succeeded`` record, with ``fields`` changed."""
    record: dict[str, Any] = {
        "v": events.SCHEMA_VERSION,
        "type": "step.succeeded",
        "run_id": "r",
        "rank": 0,
        "seq": 0,
        "wall_ns": 10,
        "mono_ns": 20,
        "step": "s",
    }
    record.update(fields)
    return record


def failed_record() -> dict[str, Any]:
    cause = ExceptionInfo(
        type="RuntimeError",
        message="boom",
        reason="RuntimeError: boom",
        frames=(FrameInfo(filename="f.py", lineno=3, name="probe", line="boom()"),),
        cause=ExceptionInfo(type="OSError", message="x", reason="OSError: x", errno=5),
    )
    event = events.StepFailed(run_id="r", rank=0, seq=0, wall_ns=1, mono_ns=2, cause=cause)
    record: dict[str, Any] = orjson.loads(events.encode(event))
    return record


# --- encoding ------------------------------------------------------------------------


def test_record_layout_and_defaults_omitted() -> None:
    event = events.StepStarted(run_id="r", rank=2, seq=5, wall_ns=10, mono_ns=20, step="a/b")
    assert events.encode_record(event) == {
        "v": events.SCHEMA_VERSION,
        "type": "step.started",
        "run_id": "r",
        "rank": 2,
        "seq": 5,
        "wall_ns": 10,
        "mono_ns": 20,
        "step": "a/b",
    }
    assert events.encode(event) == (
        b'{"v":3,"type":"step.started","run_id":"r","rank":2,"seq":5,'
        b'"wall_ns":10,"mono_ns":20,"step":"a/b"}'
    )


def test_enums_nested_records_and_tuples_encode_as_json() -> None:
    event = events.StepUnavailable(
        run_id="r",
        rank=0,
        seq=1,
        wall_ns=1,
        mono_ns=1,
        outcome=Outcome.INVALID,
        reasons=("too old", "wrong dtype"),
        cause=ExceptionInfo(type="ValueError", message="m", reason="ValueError: m"),
    )
    record = events.encode_record(event)
    assert record["outcome"] == "invalid"
    assert record["reasons"] == ["too old", "wrong dtype"]
    assert record["cause"] == {"type": "ValueError", "message": "m", "reason": "ValueError: m"}
    started = events.RunStarted(
        run_id="r",
        rank=0,
        wall_ns=1,
        mono_ns=1,
        identity=events.RankIdentity(rank=0, world_size=8),
        host="h",
        pid=1,
    )
    assert events.encode_record(started)["identity"] == {"world_size": 8}


def test_every_type_tag_is_known() -> None:
    assert sorted(events.EVENT_TYPES) == [
        "decision.made",
        "run.finished",
        "run.started",
        "step.cancelled",
        "step.crashed",
        "step.failed",
        "step.stalled",
        "step.started",
        "step.succeeded",
        "step.timed_out",
        "step.unavailable",
    ]
    for tag, cls in events.EVENT_TYPES.items():
        assert tag == cls.TYPE


# --- decoding ------------------------------------------------------------------------


def test_decode_builds_the_event() -> None:
    event = events.decode(orjson.dumps(base(result={"x": [1, 2.5, None]})))
    assert event == events.StepSucceeded(
        run_id="r", rank=0, seq=0, wall_ns=10, mono_ns=20, step="s", result={"x": [1, 2.5, None]}
    )
    assert event.schema_version == events.SCHEMA_VERSION


def test_decode_record_leaves_its_input_alone_and_can_repeat() -> None:
    record = failed_record()
    snapshot = copy.deepcopy(record)
    first = events.decode_record(record)
    assert record == snapshot
    second = events.decode_record(record)
    assert second == first


def test_decode_accepts_str_lines() -> None:
    line = events.encode(events.StepCancelled(run_id="r", rank=0, wall_ns=1, mono_ns=1))
    assert events.decode(line.decode()) == events.decode(line)


def test_unknown_type() -> None:
    with pytest.raises(UnknownEventTypeError) as caught:
        events.decode_record(base(type="step.exploded"))
    assert caught.value.type_tag == "step.exploded"
    assert caught.value.known == tuple(events.EVENT_TYPES)
    assert "unknown event type 'step.exploded'" in str(caught.value)
    assert isinstance(caught.value, DecodeError)


@pytest.mark.parametrize("tag", [None, 3, ["step.started"]])
def test_type_that_is_not_a_string(tag: object) -> None:
    with pytest.raises(UnknownEventTypeError) as caught:
        events.decode_record(base(type=tag))
    assert caught.value.type_tag == tag
    # Not a type a newer release knows: no advice to upgrade.
    assert str(caught.value).startswith(f"no event type: field 'type' is {tag!r}, not one of ")
    assert "upgrade" not in str(caught.value)


def test_newer_version() -> None:
    with pytest.raises(UnsupportedVersionError) as caught:
        events.decode_record(base(v=4))
    assert caught.value.version == 4
    assert caught.value.supported == 3
    assert str(caught.value) == (
        "unsupported schema version 4; upgrade startup-orchestrator to read it"
    )


@pytest.mark.parametrize("version", [None, -1, "1", 1.0, True])
def test_unreadable_version(version: object) -> None:
    record = base(v=version)
    if version is None:
        del record["v"]
    with pytest.raises(UnsupportedVersionError) as caught:
        events.decode_record(record)
    assert caught.value.version == version
    assert "versions 0..3 are readable" in str(caught.value)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("wall_ns", "10", "field 'wall_ns': expected an integer, got string '10'"),
        ("rank", True, "field 'rank': expected an integer, got boolean True"),
        ("seq", 1.0, "field 'seq': expected an integer, got number 1.0"),
        ("run_id", 7, "field 'run_id': expected a string, got integer 7"),
        ("step", None, "field 'step': expected a string, got null None"),
        ("parent_span_id", 5, "field 'parent_span_id': expected a string, got integer 5"),
        # A long value is shown cut to its first 60 characters.
        ("wall_ns", "9" * 100, "field 'wall_ns': expected an integer, got string '" + "9" * 59),
    ],
)
def test_wrong_envelope_field_types(field: str, value: object, expected: str) -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode_record(base(**{field: value}))
    assert caught.value.reason == expected


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            base(type="step.started", kind="phase"),
            "field 'kind': expected one of ['attempt', 'candidate', 'step'], got string 'phase'",
        ),
        (
            base(type="step.started", kind=["step"]),
            "field 'kind': expected one of ['attempt', 'candidate', 'step'], got array ['step']",
        ),
        (
            base(type="step.started", depends_on="a"),
            "field 'depends_on': expected an array, got string 'a'",
        ),
        (
            base(type="step.started", depends_on=["a", 2]),
            "field 'depends_on[1]': expected a string, got integer 2",
        ),
        (
            base(type="step.started", attributes=[]),
            "field 'attributes': expected an object, got array []",
        ),
        (
            base(type="step.timed_out", timeout_s="5", elapsed_ns=1),
            "field 'timeout_s': expected a number, got string '5'",
        ),
        (
            base(type="step.timed_out", timeout_s=True, elapsed_ns=1),
            "field 'timeout_s': expected a number, got boolean True",
        ),
        (
            base(type="step.failed", origin=1, cause={"type": "E", "message": "", "reason": ""}),
            "field 'origin': expected a string, got integer 1",
        ),
        (
            base(type="step.failed", cause="RuntimeError"),
            "field 'cause': expected an object, got string 'RuntimeError'",
        ),
        (
            base(
                type="step.failed",
                cause={"type": "E", "message": "", "reason": "", "frames": [{"filename": 1}]},
            ),
            "field 'cause.frames[0].filename': expected a string, got integer 1",
        ),
        (
            base(
                type="run.started",
                identity={"rank": "0"},
                host="h",
                pid=1,
            ),
            "field 'identity.rank': expected an integer, got string '0'",
        ),
        (
            base(
                type="run.started",
                identity={},
                host="h",
                pid=1,
                versions={"torch": 2.4},
            ),
            "field \"versions['torch']\": expected a string, got number 2.4",
        ),
    ],
)
def test_wrong_payload_field_types_name_the_field(record: dict[str, Any], expected: str) -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode_record(record)
    assert caught.value.reason == expected


def test_unknown_and_missing_fields() -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode_record(base(surprise=1))
    assert caught.value.reason == (
        "field 'surprise' is not a field of StepSucceeded (valid: mono_ns, parent_span_id, "
        "rank, result, run_id, seq, span_id, step, trace_id, wall_ns)"
    )
    nested = failed_record()
    nested["cause"]["evil"] = True
    with pytest.raises(DecodeError) as caught:
        events.decode_record(nested)
    assert caught.value.reason.startswith("field 'cause.evil' is not a field of ExceptionInfo (")
    record = base()
    del record["wall_ns"], record["run_id"]
    with pytest.raises(DecodeError) as caught:
        events.decode_record(record)
    assert caught.value.reason == "StepSucceeded is missing field(s) 'run_id', 'wall_ns'"
    # The envelope's schema version travels as "v" only.
    with pytest.raises(DecodeError):
        events.decode_record(base(schema_version=1))


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (base(wall_ns="10"), "wall_ns"),
        (base(surprise=1), "surprise"),
        (
            {
                **failed_record(),
                "cause": {"type": "E", "message": "", "reason": "", "frames": [{}]},
            },
            "cause.frames[0].filename",
        ),
        # Of several missing, the first by name.
        ({"v": events.SCHEMA_VERSION, "type": "step.succeeded", "rank": 0}, "mono_ns"),
        # The record as a whole is wrong: no field is named.
        (base(type="step.unavailable", outcome="ok"), None),
    ],
)
def test_the_error_names_the_first_field_at_fault(
    record: dict[str, Any], field: str | None
) -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode_record(record)
    assert caught.value.field == field


def test_payload_invariants_are_checked() -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode_record(base(type="step.unavailable", outcome="ok"))
    assert "outcome must be absent, unavailable or invalid" in caught.value.reason


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"", "not valid JSON at column 1: Input is a zero-length, empty document"),
        # The column within the line, never a "line 1" beside the file's own.
        (b'{"v": 3, not json', "not valid JSON at column 10: unexpected character"),
        (b"[1, 2]", "a record must be a JSON object, not array"),
        (b'"run.started"', "a record must be a JSON object, not string"),
        (b"null", "a record must be a JSON object, not null"),
    ],
)
def test_not_a_record(line: bytes, reason: str) -> None:
    with pytest.raises(DecodeError) as caught:
        events.decode(line)
    assert caught.value.reason.startswith(reason)


# --- the other files read strictly (structure) --------------------------------------------


@attrs.frozen(kw_only=True)
class Window:
    """A class a JSON file describes: a fixed-size array and a validated field."""

    span: tuple[int, int]
    count: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ({"span": [1]}, "field 'span': expected an array of 2, got array [1]"),
        ({"span": [1, 2, 3]}, "field 'span': expected an array of 2, got array [1, 2, 3]"),
        ({"span": [1, "2"]}, "field 'span[1]': expected an integer, got string '2'"),
        # The class's validators run, as its __init__ would run them.
        ({"span": [1, 2], "count": -1}, "field 'count': 'count' must be >= 0: -1"),
    ],
)
def test_structure_checks_sizes_and_runs_validators(record: dict[str, Any], expected: str) -> None:
    with pytest.raises(DecodeError) as caught:
        structure(Window, record)
    assert caught.value.reason == expected


def test_structure_builds_the_instance() -> None:
    assert structure(Window, {"span": [1, 2], "count": 3}) == Window(span=(1, 2), count=3)
    assert structure(Window, {"span": [1, 2]}) == Window(span=(1, 2))


# --- nothing is imported or evaluated ----------------------------------------------------

MADE_UP_MODULE = "startup_orchestrator_made_up_module"


def test_a_type_naming_code_is_rejected_without_importing() -> None:
    before = set(sys.modules)
    for tag in ("os.system", f"{MADE_UP_MODULE}.Evil", "__import__", "builtins.eval"):
        with pytest.raises(UnknownEventTypeError):
            events.decode_record(base(type=tag))
    assert MADE_UP_MODULE not in sys.modules
    assert set(sys.modules) == before


def test_values_naming_code_stay_plain_data() -> None:
    before = set(sys.modules)
    hostile = {
        "__import__": MADE_UP_MODULE,
        "py/object": f"{MADE_UP_MODULE}.Evil",
        "__reduce__": ["os.system", ["echo pwned"]],
        "!!python/object/apply:os.system": ["true"],
    }
    event = events.decode_record(
        base(
            step=f"__import__('{MADE_UP_MODULE}')",
            result=hostile,
        )
    )
    assert isinstance(event, events.StepSucceeded)
    assert event.result == hostile
    assert event.step == f"__import__('{MADE_UP_MODULE}')"
    info = events.decode_record(
        base(
            type="step.failed",
            cause={"type": f"{MADE_UP_MODULE}.Error", "message": "", "reason": ""},
        )
    )
    assert isinstance(info, events.StepFailed)
    assert info.cause.type == f"{MADE_UP_MODULE}.Error"
    assert MADE_UP_MODULE not in sys.modules
    assert set(sys.modules) == before


# --- upcasting ---------------------------------------------------------------------------


def test_v0_fixture_is_upcast() -> None:
    records = [orjson.loads(line) for line in V0_LOG.read_bytes().splitlines()]
    assert {record["v"] for record in records} == {0}
    decoded = [events.decode_record(record) for record in records]
    assert [event.schema_version for event in decoded] == [events.SCHEMA_VERSION] * 7
    started, platform, platform_ok, flash, flash_unavailable, xformers, finished = decoded
    # Version 0 had no spans: each step gets one of its own, which its start
    # and end share, and the run's events share the root's.
    assert platform.span_id == platform_ok.span_id
    assert flash.span_id == flash_unavailable.span_id
    assert started.span_id == finished.span_id
    spans = {started.span_id, platform.span_id, flash.span_id, xformers.span_id}
    assert len(spans) == 4
    assert "0" * 16 not in spans
    # And one trace, the run's, as a run without a launcher derives it.
    assert {event.trace_id for event in decoded} == {hashlib.sha256(b"legacy-run").hexdigest()[:32]}
    trace_id = started.trace_id
    assert started == events.RunStarted(
        span_id=started.span_id,
        trace_id=trace_id,
        run_id="legacy-run",
        rank=0,
        seq=0,
        wall_ns=1_700_000_000_000_000_000,
        mono_ns=1_700_000_000_000_000_000,
        identity=events.RankIdentity(rank=0, world_size=2, local_world_size=2),
        host="node-a",
        pid=4242,
        versions={"python": "3.11.7"},
    )
    assert platform == events.StepStarted(
        span_id=platform.span_id,
        trace_id=trace_id,
        run_id="legacy-run",
        rank=0,
        seq=1,
        wall_ns=1_700_000_000_500_000_000,
        mono_ns=1_700_000_000_500_000_000,
        step="platform",
    )
    assert platform_ok == events.StepSucceeded(
        span_id=platform.span_id,
        trace_id=trace_id,
        run_id="legacy-run",
        rank=0,
        seq=2,
        wall_ns=1_700_000_001_000_000_000,
        mono_ns=1_700_000_001_000_000_000,
        step="platform",
        result={"device": "cpu", "count": 1},
    )
    assert isinstance(flash, events.StepStarted)
    assert flash.kind is StepKind.CANDIDATE
    assert flash_unavailable == events.StepUnavailable(
        span_id=flash.span_id,
        trace_id=trace_id,
        run_id="legacy-run",
        rank=0,
        seq=4,
        wall_ns=1_700_000_002_500_000_000,
        mono_ns=1_700_000_002_500_000_000,
        step="attention/flashinfer",
        outcome=Outcome.UNAVAILABLE,
        reasons=("PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'",),
    )
    assert isinstance(xformers, events.StepUnavailable)
    assert xformers.outcome is Outcome.ABSENT
    assert xformers.reasons == ()
    assert isinstance(finished, events.RunFinished)
    assert finished.outcome is RunOutcome.READY
    # Re-encoded, they are current records with integer nanoseconds.
    reencoded = orjson.loads(events.encode(flash_unavailable))
    assert reencoded["v"] == events.SCHEMA_VERSION
    assert "time" not in reencoded
    assert reencoded["reasons"] == [flash_unavailable.reasons[0]]
    assert events.decode_record(reencoded) == flash_unavailable


def test_v0_fixture_reads_validates_and_folds() -> None:
    contents = events.read_log(V0_LOG)
    assert contents.torn_tail is None
    assert len(contents.events) == 7
    assert events.validate(V0_LOG) == []
    state = events.fold(events.Timeline(), contents.events)
    rank = state.ranks[0]
    assert rank.outcome is RunOutcome.READY
    assert rank.duration_ns == 3_500_000_000
    assert rank.steps["platform"].duration_ns == 500_000_000
    assert rank.steps["attention/flashinfer"].outcome is Outcome.UNAVAILABLE
    assert rank.steps["attention/flashinfer"].duration_ns == 1_000_000_000


@pytest.mark.parametrize("time", ["noon", True, None])
def test_v0_record_with_bad_time(time: object) -> None:
    record = {"v": 0, "type": "step.started", "run_id": "r", "rank": 0, "time": time}
    with pytest.raises(DecodeError) as caught:
        events.decode_record(record)
    assert caught.value.reason == f"v0 field 'time' must be a number, not {time!r}"


@pytest.mark.parametrize(
    ("message", "stop"),
    [
        (
            "received SIGTERM: its launcher (pid 12) exited",
            ("SIGTERM", "its launcher (pid 12) exited"),
        ),
        ("received SIGINT", ("SIGINT", None)),
        ("stopped: closed before it ran", (None, "closed before it ran")),
    ],
)
def test_a_version_2_stop_is_read_back_from_its_cause(
    message: str, stop: tuple[str | None, str | None]
) -> None:
    cause = {"type": "orchestrator.StartupInterrupted", "message": message, "reason": message}
    record = base(v=2, type="run.finished", outcome="interrupted", cause=cause)
    finished = events.decode_record(record)
    assert isinstance(finished, events.RunFinished)
    assert finished.stop == events.Stop(signal=stop[0], reason=stop[1])
    assert str(finished.stop) == message


def test_a_version_2_end_caused_otherwise_records_no_stop() -> None:
    cause = {"type": "KeyboardInterrupt", "message": "", "reason": "KeyboardInterrupt"}
    record = base(v=2, type="run.finished", outcome="interrupted", cause=cause)
    finished = events.decode_record(record)
    assert isinstance(finished, events.RunFinished)
    assert finished.stop is None


def test_a_version_2_failure_drops_propagated_and_has_no_origin() -> None:
    record = failed_record()
    record.update(v=2, propagated=True)
    failed = events.decode_record(record)
    assert isinstance(failed, events.StepFailed)
    assert failed.origin is None


@pytest.mark.parametrize(
    ("seconds", "ns"),
    # 1.005 s is 1004999999.9999999 ns as a float: the nearest nanosecond.
    [(1.5, 1_500_000_000), (1.005, 1_005_000_000), (2, 2_000_000_000)],
)
def test_a_version_0_record_is_upgraded_through_every_version(seconds: float, ns: int) -> None:
    record = base(v=0, time=seconds)
    del record["wall_ns"], record["mono_ns"]
    event = events.decode_record(record)
    assert event.wall_ns == ns
    assert event.mono_ns == ns


def _older_records() -> list[dict[str, Any]]:
    v0 = base(v=0, type="step.unavailable", time=1.5, reason="gone", outcome="absent")
    del v0["wall_ns"], v0["mono_ns"]
    interrupted = {
        "type": "orchestrator._errors.StartupInterrupted",
        "message": "received SIGTERM",
        "reason": "received SIGTERM",
    }
    v1 = base(v=1, type="run.finished", outcome="interrupted", cause=interrupted)
    v2 = {**failed_record(), "v": 2, "propagated": True}
    return [v0, v1, v2]


@pytest.mark.parametrize("record", _older_records(), ids=["v0", "v1", "v2"])
def test_upgrading_an_older_record_leaves_it_alone(record: dict[str, Any]) -> None:
    snapshot = copy.deepcopy(record)
    first = events.decode_record(record)
    assert record == snapshot
    assert events.decode_record(record) == first


def test_importing_the_codec_compiles_nothing_until_an_event_is_encoded_or_decoded() -> None:
    code = (
        "import threading, events, events._codec as codec\n"
        "from events import StepStarted, decode, encode\n"
        "print(len(codec._RECORD_FUNCTIONS), len(codec.LINE_ENCODERS))\n"
        "event = StepStarted(run_id='r', rank=0, wall_ns=1, mono_ns=1, step='s')\n"
        "lines = []\n"
        "work = lambda: lines.append(encode(event))\n"
        "threads = [threading.Thread(target=work) for _ in range(8)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "print(len(set(lines)), decode(lines[0]) == event, len(codec.LINE_ENCODERS) > 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # Eight threads met the empty tables at once: one compiled, all encoded.
    assert done.stdout.split("\n")[:2] == ["0 0", "1 True True"]
