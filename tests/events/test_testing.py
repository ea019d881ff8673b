"""``events.testing``: the event-stream builder shipped for tests.

What it builds must be what the package's own readers accept (the fold, the
codec, the file log, ``validate``, ``merge``) and shaped as the runner
writes it; whether it matches a real run is checked against the runner in
``tests/orchestrator/test_testing.py``.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import events
import events.testing
from events import (
    Composite,
    DecisionMade,
    JsonlLog,
    Outcome,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepKind,
    StepStarted,
    StepSucceeded,
    Timeline,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info

CHAIN = exception_info(
    "RuntimeError",
    "no platform activated",
    cause=exception_info(
        "OSError",
        "[Errno 2] No such file or directory: 'libfoo.so'",
        errno=2,
        strerror="No such file or directory",
        filename="libfoo.so",
    ),
)


def every_event_type(rank: int = 0, *, world_size: int = 2) -> list[events.Event]:
    """One stream holding every event type, with nested steps."""
    stream = EventStream(run_id="run-1", rank=rank, world_size=world_size)
    stream.run_started(config={"tp": 2}, graph="probes", simulated="box", injected=("x=hang",))
    stream.started("platform")
    stream.started("platform/cpu", kind=StepKind.CANDIDATE, attributes={"priority": 1})
    stream.unavailable("platform/cpu", Outcome.ABSENT, reasons=("no cpu plugin",))
    stream.started("platform/cuda", kind=StepKind.CANDIDATE)
    stream.succeeded("platform/cuda", {"activated": True})
    stream.decision("platform.select", "cuda", step="platform", inputs={"n": 2})
    stream.succeeded("platform", "cuda")
    for step in ("slow", "gone", "stopped"):
        stream.started(step, depends_on=("platform",))
    stream.stalled("slow", 2.0)
    stream.timed_out("slow", 2.5)
    stream.crashed("gone", signal=11, stderr_tail=("Segmentation fault",))
    stream.cancelled("stopped", "another step failed")
    stream.started("broken")
    stream.failed("broken", CHAIN)
    return stream.run_finished(RunOutcome.FAILED, cause=CHAIN, failed_step="broken")


def test_a_built_stream_has_every_event_type_in_gapless_order() -> None:
    built = every_event_type()
    assert {type(event) for event in built} == set(events.EVENT_TYPES.values())
    assert [event.seq for event in built] == list(range(len(built)))
    assert all((event.run_id, event.rank) == ("run-1", 0) for event in built)


def test_a_built_stream_folds() -> None:
    built = every_event_type()
    state = events.fold(Composite(timeline=Timeline()), built)
    rank = state["timeline"].ranks[0]
    assert rank.outcome is RunOutcome.FAILED
    assert rank.steps["platform/cpu"].outcome is Outcome.ABSENT
    assert rank.steps["slow"].outcome is Outcome.TIMED_OUT
    assert all(timing.finished for timing in rank.steps.values())


def test_a_built_stream_round_trips_through_the_codec() -> None:
    built = every_event_type()
    assert [events.decode(events.encode(event)) for event in built] == built


def test_a_built_stream_round_trips_through_a_file_log(tmp_path: Path) -> None:
    built = every_event_type()
    path = tmp_path / "rank-0.jsonl"
    with JsonlLog(path, run_id="run-1", rank=0, durability="never") as log:
        for event in built:
            log.append(event)
    assert events.validate(path) == []
    assert list(events.read_log(path).events) == built


def test_built_ranks_merge_into_one_stream() -> None:
    ranks = [every_event_type(rank) for rank in range(2)]
    merged = list(events.merge(ranks))
    assert sorted(merged, key=lambda event: (event.rank, event.seq)) == [*ranks[0], *ranks[1]]
    timeline = events.fold(Timeline(), merged)
    assert set(timeline.ranks) == {0, 1}


def test_spans_nest_as_the_runner_nests_them() -> None:
    stream = EventStream(run_id="run-1", launcher_span_id="00f067aa0ba902b7").run_started()
    stream.started("platform").started("platform/cuda").started("platform/cuda/probe")
    stream.started("attention", parent="")
    stream.decision("platform.select", "cuda", step="platform/cuda")
    stream.succeeded("platform/cuda/probe")
    built = stream.run_finished()
    started = {event.step: event for event in built if isinstance(event, StepStarted)}

    run_events = [e for e in built if isinstance(e, RunStarted | RunFinished)]
    assert {(e.span_id, e.parent_span_id) for e in run_events} == {
        (stream.root_span_id, "00f067aa0ba902b7")
    }
    assert started["platform"].parent_span_id == stream.root_span_id
    assert started["platform/cuda"].parent_span_id == started["platform"].span_id
    assert started["platform/cuda/probe"].parent_span_id == started["platform/cuda"].span_id
    assert started["attention"].parent_span_id == stream.root_span_id
    (decision,) = (e for e in built if isinstance(e, DecisionMade))
    assert (decision.span_id, decision.parent_span_id) == (stream.span_id("platform/cuda"), None)
    (ended,) = (e for e in built if isinstance(e, StepSucceeded))
    assert (ended.span_id, ended.parent_span_id) == (
        started["platform/cuda/probe"].span_id,
        started["platform/cuda/probe"].parent_span_id,
    )
    span_ids = [event.span_id for event in started.values()] + [stream.root_span_id]
    assert len(set(span_ids)) == len(span_ids)
    assert all(len(span) == 16 and int(span, 16) for span in span_ids)
    assert stream.open_steps == ("platform", "platform/cuda", "attention")


def test_the_trace_id_is_derived_from_the_run_id_as_the_runner_does() -> None:
    # One derivation (events._launch.derive_trace_id) serves the runner,
    # the version-0 upcaster and this stream: the first 32 hex digits of
    # the run id's SHA-256.
    assert EventStream(run_id="run-9").trace_id == hashlib.sha256(b"run-9").hexdigest()[:32]
    assert EventStream(trace_id="4bf92f3577b34da6a3ce929d0e0e4736").trace_id == (
        "4bf92f3577b34da6a3ce929d0e0e4736"
    )


def test_the_same_calls_build_the_same_stream() -> None:
    assert every_event_type() == every_event_type()
    ids = {e.span_id for e in every_event_type(0)} & {e.span_id for e in every_event_type(1)}
    assert ids == set()


def test_the_clock_ticks_and_advances() -> None:
    stream = EventStream(wall_ns=1_000, mono_ns=5, tick_ns=10).run_started()
    stream.started("probe")
    stream.advance(1_000)
    built = stream.succeeded("probe").events
    assert [(e.wall_ns, e.mono_ns) for e in built] == [(1_000, 5), (1_010, 15), (2_020, 1_025)]
    assert EventStream().run_started().events[0].wall_ns == BASE_WALL_NS


def test_identity_follows_the_node_layout() -> None:
    stream = EventStream(rank=5, world_size=8, local_world_size=4).run_started()
    (started,) = stream.events
    assert isinstance(started, RunStarted)
    assert (started.identity.local_rank, started.identity.node_rank) == (1, 1)
    assert (started.host, started.pid) == ("node-1", 4005)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda s: s.started("a").started("a"), "step 'a' is already open"),
        (lambda s: s.succeeded("a"), "step 'a' is not open"),
        (lambda s: s.started("a").succeeded("a").failed("a", CHAIN), "step 'a' is not open"),
        (lambda s: s.started("a/b", parent="a"), "parent step 'a' of 'a/b' is not open"),
        (lambda s: s.decision("d", 1, step="a"), "'a' is not"),
    ],
)
def test_a_broken_lifecycle_is_refused(build: object, message: str) -> None:
    stream = EventStream().run_started()
    with pytest.raises(ValueError, match=message):
        build(stream)  # type: ignore[operator]


def test_a_rank_outside_its_world_is_refused() -> None:
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        EventStream(rank=2, world_size=2)


def test_exception_info_is_what_capture_records() -> None:
    exc = RuntimeError("no platform activated")
    exc.__cause__ = FileNotFoundError(2, "No such file or directory", "libfoo.so")
    captured = events.ExceptionInfo.capture(exc)
    built = exception_info(
        "RuntimeError",
        "no platform activated",
        cause=exception_info(
            "FileNotFoundError",
            "[Errno 2] No such file or directory: 'libfoo.so'",
            errno=2,
            strerror="No such file or directory",
            filename="libfoo.so",
        ),
    )
    assert built == captured
    assert exception_info("zentorch._C.AbiError", "bad").reason == "AbiError: bad"


def test_the_module_exports_what_it_defines() -> None:
    exported = events.testing.__all__
    assert exported == sorted(exported)
    for name in exported:
        value = getattr(events.testing, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == "events.testing"


def test_the_builder_imports_only_the_standard_library_attrs_and_events() -> None:
    source = inspect.getsource(events.testing)
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.partition(".")[0])
    assert imported - set(sys.stdlib_module_names) <= {"attrs", "events"}


def test_importing_events_does_not_import_the_builder() -> None:
    code = (
        "import sys, events\n"
        "events.fold, events.JsonlLog, events.Timeline, events.encode\n"
        "assert 'events.testing' not in sys.modules, sorted(sys.modules)\n"
        "assert 'testing' not in dir(events)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
