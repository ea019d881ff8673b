"""The logging bridge: derived messages to stdlib logging, live (on a
graph and a slice of the tests' own; the engine's messages through it are
tested with the engine)."""

from __future__ import annotations

import logging
import threading

import pytest

from events import (
    Event,
    FrameInfo,
    MemoryLog,
    Message,
    MessageRule,
    Outcome,
    Scope,
    Severity,
    SeverityPolicy,
    Slice,
    StepKind,
)
from events.testing import EventStream, exception_info

from .tracing_harness import live_span_marks

RUN_ID = "run-7f3a"

#: An optional library whose shared object does not load: an OSError with
#: the frame of the probe that imported it.
IMPORT_BROKEN = exception_info(
    "OSError",
    "libfast.so: undefined symbol: _ZN3c104impl8GPUTrace",
    frames=(
        FrameInfo(filename="/opt/mine/probe.py", lineno=41, name="probe_fast", line="import x"),
    ),
)

#: The tests' slice: a broken import of the fast kernels is a WARNING,
#: printed once a node (local rank 0), with its traceback.
MINE = Slice(
    name="mine",
    rules=[
        MessageRule(
            code="mine.import_broken",
            step="kernels/*/import",
            outcomes="unavailable",
            exception="OSError",
            severity=Severity.WARNING,
            scope=Scope.LOCAL,
            text="{parent} failed to import ({error})",
        )
    ],
)


def started_rank(rank: int, *, world_size: int = 8, local_world_size: int = 4) -> EventStream:
    """One rank of an 8-rank, 4-ranks-a-node run, ``run.started`` written."""
    return EventStream(
        run_id=RUN_ID, rank=rank, world_size=world_size, local_world_size=local_world_size
    ).run_started()


def ready_rank(rank: int, *, world_size: int = 8) -> list[Event]:
    """A rank that starts: the ``fast`` kernels are not installed (a DEBUG
    candidate line), the ``slow`` ones are chosen; the ``graph`` warmup
    attempt is unavailable and ``eager`` recovers (a WARNING); ready."""
    stream = started_rank(rank, world_size=world_size)
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    stream.unavailable("kernels/fast", Outcome.ABSENT, reasons=["not installed"])
    stream.succeeded("kernels/slow", {"candidate": "slow"})
    stream.succeeded("kernels", {"selected": "slow"})
    stream.started("warmup")
    stream.started("warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": True})
    stream.unavailable("warmup/graph", cause=exception_info("RuntimeError", "no graph capture"))
    stream.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    stream.succeeded("warmup/eager")
    stream.succeeded("warmup")
    return stream.run_finished()


def broken_import_rank(rank: int = 0, **options: int) -> list[Event]:
    """A rank whose fast kernels fail to import (``mine.import_broken``)
    and that starts on the slow ones: ready."""
    stream = started_rank(rank, **options)
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.started("kernels/fast/import")
    stream.unavailable("kernels/fast/import", cause=IMPORT_BROKEN)
    stream.unavailable("kernels/fast", cause=IMPORT_BROKEN)
    stream.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    stream.succeeded("kernels/slow", {"candidate": "slow"})
    stream.succeeded("kernels", {"selected": "slow"})
    return stream.run_finished()


def eight_ranks_two_nodes() -> list[Event]:
    """Eight ranks, four a node, each with the broken import."""
    return [event for rank in range(8) for event in broken_import_rank(rank)]


def records_of(caplog: pytest.LogCaptureFixture, code: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "code", None) == code]


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    return caplog


def test_messages_are_logged_as_they_are_derived(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    log = MemoryLog(RUN_ID, 0)
    bridge = LoggingBridge(slices=(MINE,))
    events = ready_rank(0)
    with log.subscribe(bridge):
        for event in events[:-1]:
            log.append(event)
        assert not records_of(caplog_debug, "run.ready")
        log.append(events[-1])
    assert [r.code for r in caplog_debug.records] == [  # type: ignore[attr-defined]
        m.code for m in bridge.state.messages(0)
    ]
    ready = records_of(caplog_debug, "run.ready")[0]
    assert ready.name == "orchestrator.run"
    assert ready.levelno == logging.INFO
    assert ready.getMessage() == "[rank 0] Startup ready."
    assert ready.rank == 0  # type: ignore[attr-defined]
    warning = records_of(caplog_debug, "fallback.used")[0]
    assert warning.name == "orchestrator.fallback"
    assert warning.levelno == logging.WARNING
    assert warning.step == "warmup/graph"  # type: ignore[attr-defined]
    unavailable = records_of(caplog_debug, "candidate.unavailable")[0]
    assert unavailable.name == "orchestrator.candidate"
    assert unavailable.levelno == logging.DEBUG

    # A slice's code goes to the logger named for its prefix.
    with log.subscribe(bridge):
        for event in broken_import_rank(0):
            log.append(event)
    broken = records_of(caplog_debug, "mine.import_broken")[0]
    assert broken.name == "orchestrator.mine"
    assert broken.levelno == logging.WARNING


def test_scope_is_honoured_per_rank(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,))
    for event in eight_ranks_two_nodes():
        bridge(event)
    broken = records_of(caplog_debug, "mine.import_broken")
    assert sorted(r.rank for r in broken) == [0, 4]  # type: ignore[attr-defined]
    assert sorted(r.local_rank for r in broken) == [0, 0]  # type: ignore[attr-defined]
    assert [r.rank for r in records_of(caplog_debug, "run.ready")] == [0]  # type: ignore[attr-defined]
    for record in caplog_debug.records:
        assert record.getMessage().startswith(f"[rank {record.rank}] ")  # type: ignore[attr-defined]
    # Everything was derived on every rank, printed or not.
    assert len([m for m in bridge.state.messages() if m.code == "mine.import_broken"]) == 8


def test_an_error_is_printed_on_its_rank_whatever_the_scope(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    policy = SeverityPolicy(rules=MINE.code_rules()).with_rule(
        "mine.import_broken", severity=Severity.ERROR
    )
    bridge = LoggingBridge(slices=(MINE, policy.as_slice()))
    for event in broken_import_rank(5):
        bridge(event)
    (record,) = records_of(caplog_debug, "mine.import_broken")
    assert record.levelno == logging.ERROR
    assert record.rank == 5  # type: ignore[attr-defined]
    # An ERROR's exception prints its own traceback when it propagates.
    assert "Traceback" not in record.getMessage()


def test_a_warning_carries_its_traceback(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,))
    for event in broken_import_rank(0):
        bridge(event)
    (record,) = records_of(caplog_debug, "mine.import_broken")
    assert record.levelno == logging.WARNING
    assert record.name == "orchestrator.mine"
    text = record.getMessage()
    assert text == (
        "[rank 0] kernels/fast failed to import "
        "(OSError: libfast.so: undefined symbol: _ZN3c104impl8GPUTrace)\n"
        "  Traceback (most recent call last):\n"
        '    File "/opt/mine/probe.py", line 41, in probe_fast\n'
        "      import x\n"
        "  OSError: libfast.so: undefined symbol: _ZN3c104impl8GPUTrace"
    )  # no blank line after the traceback
    first, _, traceback = text.partition("\n")
    assert first.startswith("[rank 0] kernels/fast failed to import (OSError: libfast.so")
    # Continuation lines are indented, so none can pass for a record of its own.
    assert traceback.startswith("  Traceback (most recent call last):")
    assert '  File "/opt/mine/probe.py", line 41, in probe_fast' in traceback
    assert "OSError: libfast.so: undefined symbol" in traceback
    assert record.detail.startswith("Traceback (most recent call last):")  # type: ignore[attr-defined]
    assert "Traceback" in caplog_debug.text


def test_tracebacks_can_be_left_out(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,), tracebacks=False)
    for event in broken_import_rank(0):
        bridge(event)
    (record,) = records_of(caplog_debug, "mine.import_broken")
    assert "\n" not in record.getMessage()


def test_logger_levels_filter_and_prefix_is_configurable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    caplog.set_level(logging.WARNING, logger="engine")
    bridge = LoggingBridge(slices=(MINE,), logger_prefix="engine")
    for event in ready_rank(0):
        bridge(event)
    assert {r.name for r in caplog.records} == {"engine.fallback"}
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_events_from_several_threads(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,))
    streams = [ready_rank(rank) for rank in range(4)]

    def feed(stream: list[object]) -> None:
        for event in stream:
            bridge(event)

    threads = [threading.Thread(target=feed, args=(stream,)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {m.rank for m in bridge.state.messages()} == {0, 1, 2, 3}
    assert len(records_of(caplog_debug, "fallback.used")) == 1  # local rank 0 only


def test_the_bridge_gives_live_spans_their_severity_and_status() -> None:
    from opentelemetry.trace import StatusCode

    from events import merge

    status, severity = live_span_marks((MINE,), merge(ready_rank(rank) for rank in range(2)))
    # A recovered fallback: WARNING, and (like every span short of ERROR) unset.
    assert severity[(1, "warmup/graph")] == "WARNING"
    assert status[(1, "warmup/graph")] is StatusCode.UNSET
    assert status[(1, "warmup")] is StatusCode.UNSET
    assert status[(0, "kernels/fast")] is StatusCode.UNSET


def test_held_warnings_are_released_unless_the_printing_rank_saw_them() -> None:
    from exporters import LoggingBridge, launcher_messages

    # Ranks 0 and 1 share a node (local world 4): mine.import_broken is
    # scope local, so only local rank 0 prints it live.
    streams = {}
    for rank, broken in ((0, False), (1, True), (2, True)):
        builder = started_rank(rank, world_size=3, local_world_size=4)
        builder.started("kernels")
        builder.started("kernels/fast")
        builder.started("kernels/fast/import")
        if broken:
            builder.unavailable("kernels/fast/import", cause=IMPORT_BROKEN)
        else:
            builder.succeeded("kernels/fast/import")
        streams[rank] = builder.events

    bridges = {rank: LoggingBridge(slices=(MINE,), hold_warnings=True) for rank in streams}
    for rank, events in streams.items():
        for event in events:
            bridges[rank](event)
    assert bridges[0].held == ()
    assert [m.code for m in bridges[1].held] == ["mine.import_broken"]

    # Rank 0 did not derive it: rank 1 prints it; rank 2 leaves it to rank 1.
    released = bridges[1].release(lambda message: False)
    assert [m.rank for m in released] == [1]
    assert bridges[1].held == ()
    assert bridges[2].release(lambda message: True) == []

    from events import Messages, fold

    state = fold(Messages(slices=[MINE]), [e for events in streams.values() for e in events])
    # A launcher that sees every rank prints it once, for both ranks.
    found = [(m.rank, m.code, ranks) for m, ranks in launcher_messages(state)]
    assert found == [(1, "mine.import_broken", (1, 2))]


def _failed_rank(*, failed_step: str | None) -> list[Event]:
    from events import RunOutcome

    boom = exception_info("RuntimeError", "CUDA driver version is insufficient")
    builder = started_rank(0)
    builder.started("kernels")
    builder.started("kernels/fast", kind=StepKind.CANDIDATE)
    builder.failed("kernels/fast", boom)
    builder.failed("kernels", boom)
    return list(builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step=failed_step))


def test_one_failure_is_one_live_line(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,))
    for event in _failed_rank(failed_step="kernels/fast"):
        bridge(event)
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [r.code for r in errors] == ["step.failed"]  # type: ignore[attr-defined]
    # The state, and so the report, keeps the run's message.
    assert "run.failed" in [m.code for m in bridge.state.messages(0)]


def test_a_run_failure_no_step_printed_is_still_printed(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,))
    for event in _failed_rank(failed_step=None):
        bridge(event)
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [r.code for r in errors] == ["step.failed", "run.failed"]  # type: ignore[attr-defined]


def test_held_warnings_never_hold_a_repeated_run_failure(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(MINE,), hold_warnings=True)
    for event in _failed_rank(failed_step="kernels/fast"):
        bridge(event)
    assert bridge.held == ()
    assert bridge.release() == []
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [r.code for r in errors] == ["step.failed"]  # type: ignore[attr-defined]


def test_a_run_failure_below_the_step_that_printed_its_error_is_not_printed_again(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from events import RunOutcome
    from exporters import LoggingBridge

    boom = exception_info("RuntimeError", "CUDA driver version is insufficient")
    builder = started_rank(0)
    builder.started("kernels")
    builder.started("kernels/fast", kind=StepKind.CANDIDATE)
    builder.cancelled("kernels/fast", "kernels failed")
    builder.failed("kernels", boom, origin="kernels/fast")
    events = builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="kernels/fast")

    bridge = LoggingBridge(slices=(MINE,))
    for event in events:
        bridge(event)
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [(r.code, r.step) for r in errors] == [("step.failed", "kernels")]  # type: ignore[attr-defined]
    assert "run.failed" in [m.code for m in bridge.state.messages(0)]


def test_a_hold_rule_holds_only_what_this_rank_would_print() -> None:
    from exporters import LoggingBridge

    # Local rank 1: the node's warning is local rank 0's to print.
    bridge = LoggingBridge(slices=(MINE,), hold=lambda message: True)
    for event in broken_import_rank(1):
        bridge(event)
    derived = bridge.state.messages(1)
    assert "mine.import_broken" in [m.code for m in derived]
    assert bridge.held == tuple(m for m in derived if m.printed)
    assert "mine.import_broken" not in [m.code for m in bridge.held]


def test_the_launcher_prints_a_local_warning_once_for_each_node_whose_printer_missed_it() -> None:
    from events import Messages, fold
    from exporters import launcher_messages

    # Rank 0 prints it live for node 0; on node 1 (ranks 4-7) only rank 5
    # has it, and rank 4, which prints for that node, does not.
    events = [
        *broken_import_rank(0),
        *ready_rank(4),
        *broken_import_rank(5),
    ]
    state = fold(Messages(slices=[MINE]), events)
    found = [(m.rank, m.code, ranks) for m, ranks in launcher_messages(state)]
    assert found == [(5, "mine.import_broken", (0, 5))]


def _peer_failure(rank: int, error: str) -> list[Event]:
    """A rank whose ``exchange`` step fails with ``error`` (a lost peer, for
    ``ConnectionError``), and its run with it."""
    from events import RunOutcome

    cause = exception_info(error, "peer 5 went away" if error == "ConnectionError" else "boom")
    builder = started_rank(rank, world_size=3)
    builder.started("exchange")
    builder.failed("exchange", cause)
    return list(builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="exchange"))


def _lost_peer(message: Message) -> bool:
    return message.exception is not None and message.exception.name == "ConnectionError"


def test_held_messages_are_printed_once_for_every_rank_by_the_launcher(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from events import Messages, fold
    from exporters import LoggingBridge, launcher_messages

    streams = {0: _peer_failure(0, "RuntimeError"), 1: _peer_failure(1, "ConnectionError")}
    streams[2] = _peer_failure(2, "ConnectionError")
    held = LoggingBridge(slices=(MINE,), hold=_lost_peer)
    for event in streams[1]:
        held(event)
    # Nothing of the lost peer is printed on the rank: it is held, both lines.
    assert [r for r in caplog_debug.records if r.levelno >= logging.ERROR] == []
    assert [m.code for m in held.held] == ["step.failed", "run.failed"]

    state = fold(Messages(slices=[MINE]), [e for events in streams.values() for e in events])
    found = [(m.code, m.rank, ranks) for m, ranks in launcher_messages(state, held=_lost_peer)]
    # One line for both ranks, and not their runs' failure again; rank 0's
    # own failure is printed live by rank 0, not by the launcher.
    assert found == [("step.failed", 1, (1, 2))]
    bridge = LoggingBridge(slices=(MINE,))
    bridge.log(launcher_messages(state, held=_lost_peer)[0][0], ranks=(1, 2))
    assert caplog_debug.records[-1].getMessage().startswith("[ranks 1-2] Step exchange failed")
