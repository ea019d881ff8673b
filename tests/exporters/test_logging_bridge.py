"""The logging bridge: derived messages to stdlib logging, live."""

from __future__ import annotations

import logging
import threading

import pytest

from events import Event, MemoryLog, Message, Severity, SeverityPolicy
from orchestrator.engine import ENGINE
from tests.orchestrator.engine.streams import (
    RUN_ID,
    RankBuilder,
    eight_ranks_two_nodes,
    healthy_rank,
    zentorch_rank,
)


def records_of(caplog: pytest.LogCaptureFixture, code: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "code", None) == code]


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    return caplog


def test_messages_are_logged_as_they_are_derived(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    log = MemoryLog(RUN_ID, 0)
    bridge = LoggingBridge(slices=(ENGINE,))
    events = healthy_rank(0)
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
    warning = records_of(caplog_debug, "allreduce.attempt_failed")[0]
    assert warning.name == "orchestrator.allreduce"
    assert warning.levelno == logging.WARNING
    assert warning.step == "allreduce_workspace/mnnvl"  # type: ignore[attr-defined]
    unavailable = records_of(caplog_debug, "attention.backend_unavailable")[0]
    assert unavailable.name == "orchestrator.attention"
    assert unavailable.levelno == logging.DEBUG


def test_scope_is_honoured_per_rank(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,))
    for event in eight_ranks_two_nodes():
        bridge(event)
    broken = records_of(caplog_debug, "zentorch.broken")
    assert sorted(r.rank for r in broken) == [0, 4]  # type: ignore[attr-defined]
    assert sorted(r.local_rank for r in broken) == [0, 0]  # type: ignore[attr-defined]
    assert [r.rank for r in records_of(caplog_debug, "run.ready")] == [0]  # type: ignore[attr-defined]
    for record in caplog_debug.records:
        assert record.getMessage().startswith(f"[rank {record.rank}] ")  # type: ignore[attr-defined]
    # Everything was derived on every rank, printed or not.
    assert len([m for m in bridge.state.messages() if m.code == "zentorch.broken"]) == 8


def test_an_error_is_printed_on_its_rank_whatever_the_scope(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    policy = SeverityPolicy(rules=ENGINE.code_rules()).with_rule(
        "zentorch.broken", severity=Severity.ERROR
    )
    bridge = LoggingBridge(slices=(ENGINE, policy.as_slice()))
    for event in zentorch_rank("broken", rank=5).events:
        bridge(event)
    (record,) = records_of(caplog_debug, "zentorch.broken")
    assert record.levelno == logging.ERROR
    assert record.rank == 5  # type: ignore[attr-defined]
    # An ERROR's exception prints its own traceback when it propagates.
    assert "Traceback" not in record.getMessage()


def test_zentorch_broken_carries_its_traceback(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,))
    for event in zentorch_rank("broken", rank=0).events:
        bridge(event)
    (record,) = records_of(caplog_debug, "zentorch.broken")
    assert record.levelno == logging.WARNING
    assert record.name == "orchestrator.zentorch"
    text = record.getMessage()
    first, _, traceback = text.partition("\n")
    assert first.startswith("[rank 0] zentorch failed to import (OSError: libzentorch.so")
    # Continuation lines are indented, so none can pass for a record of its own.
    assert traceback.startswith("  Traceback (most recent call last):")
    assert "OSError: libzentorch.so: undefined symbol" in traceback
    assert record.detail.startswith("Traceback (most recent call last):")  # type: ignore[attr-defined]
    assert "Traceback" in caplog_debug.text


def test_tracebacks_can_be_left_out(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,), tracebacks=False)
    for event in zentorch_rank("broken", rank=0).events:
        bridge(event)
    (record,) = records_of(caplog_debug, "zentorch.broken")
    assert "\n" not in record.getMessage()


def test_logger_levels_filter_and_prefix_is_configurable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    caplog.set_level(logging.WARNING, logger="engine")
    bridge = LoggingBridge(slices=(ENGINE,), logger_prefix="engine")
    for event in healthy_rank(0):
        bridge(event)
    assert {r.name for r in caplog.records} == {"engine.allreduce"}
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_events_from_several_threads(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,))
    streams = [healthy_rank(rank) for rank in range(4)]

    def feed(stream: list[object]) -> None:
        for event in stream:
            bridge(event)

    threads = [threading.Thread(target=feed, args=(stream,)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {m.rank for m in bridge.state.messages()} == {0, 1, 2, 3}
    assert len(records_of(caplog_debug, "allreduce.attempt_failed")) == 1  # local rank 0 only


def test_the_bridge_gives_live_spans_their_severity_and_status() -> None:
    from opentelemetry.trace import StatusCode

    from events import merge
    from exporters import LoggingBridge, SpanProjection

    bridge = LoggingBridge(slices=(ENGINE,))
    spans = SpanProjection(severity_of=bridge.severity_of)
    finished = []
    for event in merge(healthy_rank(rank) for rank in range(2)):
        bridge(event)
        finished.extend(spans.feed(event))
    status = {
        (s.resource.attributes["startup.rank"], s.name): s.status.status_code for s in finished
    }
    severity = {
        (s.resource.attributes["startup.rank"], s.name): (s.attributes or {}).get(
            "startup.severity"
        )
        for s in finished
    }
    # A recovered fallback: WARNING, and (like every span short of ERROR) unset.
    assert severity[(1, "allreduce_workspace/mnnvl")] == "WARNING"
    assert status[(1, "allreduce_workspace/mnnvl")] is StatusCode.UNSET
    assert status[(1, "allreduce_workspace")] is StatusCode.UNSET
    assert status[(0, "attention/FLASHINFER")] is StatusCode.UNSET


def test_held_warnings_are_released_unless_the_printing_rank_saw_them() -> None:
    from exporters import LoggingBridge, launcher_messages
    from tests.orchestrator.engine.streams import ZENTORCH_ABI

    # Ranks 0 and 1 share a node (local world 4): zentorch.broken is scope
    # local, so only local rank 0 prints it live.
    streams = {}
    for rank, broken in ((0, False), (1, True), (2, True)):
        builder = RankBuilder(rank, world_size=3, local_world_size=4).run_started()
        builder.started("platform")
        builder.started("platform/cpu")
        builder.started("platform/cpu/zentorch")
        if broken:
            builder.unavailable("platform/cpu/zentorch", cause=ZENTORCH_ABI)
        else:
            builder.succeeded("platform/cpu/zentorch")
        streams[rank] = builder.events

    bridges = {rank: LoggingBridge(slices=(ENGINE,), hold_warnings=True) for rank in streams}
    for rank, events in streams.items():
        for event in events:
            bridges[rank](event)
    assert bridges[0].held == ()
    assert [m.code for m in bridges[1].held] == ["zentorch.broken"]

    # Rank 0 did not derive it: rank 1 prints it; rank 2 leaves it to rank 1.
    released = bridges[1].release(lambda message: False)
    assert [m.rank for m in released] == [1]
    assert bridges[1].held == ()
    assert bridges[2].release(lambda message: True) == []

    from events import Messages, fold

    state = fold(Messages(slices=[ENGINE]), [e for events in streams.values() for e in events])
    # A launcher that sees every rank prints it once, for both ranks.
    found = [(m.rank, m.code, ranks) for m, ranks in launcher_messages(state)]
    assert found == [(1, "zentorch.broken", (1, 2))]


def _failed_rank(*, failed_step: str | None) -> list[Event]:
    from events import RunOutcome, StepKind
    from tests.orchestrator.engine.streams import ATTENTION_STEP, exception

    boom = exception("RuntimeError", "CUDA driver version is insufficient")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.failed(ATTENTION_STEP, boom)
    return list(builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step=failed_step))


def test_one_failure_is_one_live_line(caplog_debug: pytest.LogCaptureFixture) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,))
    for event in _failed_rank(failed_step="attention/FLASH_ATTN"):
        bridge(event)
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [r.code for r in errors] == ["step.failed"]  # type: ignore[attr-defined]
    # The state, and so the report, keeps the run's message.
    assert "run.failed" in [m.code for m in bridge.state.messages(0)]


def test_a_run_failure_no_step_printed_is_still_printed(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    bridge = LoggingBridge(slices=(ENGINE,))
    for event in _failed_rank(failed_step=None):
        bridge(event)
    errors = [r for r in caplog_debug.records if r.levelno >= logging.ERROR]
    assert [r.code for r in errors] == ["step.failed", "run.failed"]  # type: ignore[attr-defined]


def _peer_failure(rank: int, error: str) -> list[Event]:
    """A rank whose ``allreduce`` step fails with ``error`` (a lost peer, for
    ``ConnectionError``), and its run with it."""
    from events import RunOutcome
    from tests.orchestrator.engine.streams import exception

    cause = exception(error, "peer 5 went away" if error == "ConnectionError" else "boom")
    builder = RankBuilder(rank, world_size=3).run_started()
    builder.started("allreduce")
    builder.failed("allreduce", cause)
    return list(builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="allreduce"))


def _lost_peer(message: Message) -> bool:
    return message.exception is not None and message.exception.name == "ConnectionError"


def test_held_messages_are_printed_once_for_every_rank_by_the_launcher(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
    from events import Messages, fold
    from exporters import LoggingBridge, launcher_messages

    streams = {0: _peer_failure(0, "RuntimeError"), 1: _peer_failure(1, "ConnectionError")}
    streams[2] = _peer_failure(2, "ConnectionError")
    held = LoggingBridge(slices=(ENGINE,), hold=_lost_peer)
    for event in streams[1]:
        held(event)
    # Nothing of the lost peer is printed on the rank: it is held, both lines.
    assert [r for r in caplog_debug.records if r.levelno >= logging.ERROR] == []
    assert [m.code for m in held.held] == ["step.failed", "run.failed"]

    state = fold(Messages(slices=[ENGINE]), [e for events in streams.values() for e in events])
    found = [(m.code, m.rank, ranks) for m, ranks in launcher_messages(state, held=_lost_peer)]
    # One line for both ranks, and not their runs' failure again; rank 0's
    # own failure is printed live by rank 0, not by the launcher.
    assert found == [("step.failed", 1, (1, 2))]
    bridge = LoggingBridge(slices=(ENGINE,))
    bridge.log(launcher_messages(state, held=_lost_peer)[0][0], ranks=(1, 2))
    assert caplog_debug.records[-1].getMessage().startswith("[ranks 1-2] Step allreduce failed")
