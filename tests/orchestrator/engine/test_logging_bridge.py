"""The engine's messages through the logging bridge, live: each code on its
logger at its severity and scope, zentorch.broken with its traceback, and
the engine's step severities on live spans (the bridge itself, on a slice
of its own: ``tests/exporters/test_logging_bridge.py``)."""

from __future__ import annotations

import logging

import pytest

from events import MemoryLog
from exporters import LoggingBridge
from orchestrator.engine import ENGINE
from tests.exporters.tracing_harness import live_span_marks

from .streams import RUN_ID, eight_ranks_two_nodes, healthy_rank, zentorch_rank


def records_of(caplog: pytest.LogCaptureFixture, code: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "code", None) == code]


@pytest.fixture
def caplog_debug(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    return caplog


def test_engine_messages_are_logged_on_their_loggers_as_they_are_derived(
    caplog_debug: pytest.LogCaptureFixture,
) -> None:
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


def test_engine_warnings_are_printed_once_a_node(caplog_debug: pytest.LogCaptureFixture) -> None:
    bridge = LoggingBridge(slices=(ENGINE,))
    for event in eight_ranks_two_nodes():
        bridge(event)
    broken = records_of(caplog_debug, "zentorch.broken")
    assert sorted(r.rank for r in broken) == [0, 4]  # type: ignore[attr-defined]
    assert sorted(r.local_rank for r in broken) == [0, 0]  # type: ignore[attr-defined]
    assert [r.rank for r in records_of(caplog_debug, "run.ready")] == [0]  # type: ignore[attr-defined]
    # Everything was derived on every rank, printed or not.
    assert len([m for m in bridge.state.messages() if m.code == "zentorch.broken"]) == 8

    # A recovered all-reduce attempt too: four ranks of one node, one line.
    caplog_debug.clear()
    bridge = LoggingBridge(slices=(ENGINE,))
    for rank in range(4):
        for event in healthy_rank(rank):
            bridge(event)
    assert len(records_of(caplog_debug, "allreduce.attempt_failed")) == 1  # local rank 0 only


def test_zentorch_broken_carries_its_traceback(caplog_debug: pytest.LogCaptureFixture) -> None:
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


def test_the_bridge_gives_live_engine_spans_their_severity_and_status() -> None:
    from opentelemetry.trace import StatusCode

    from events import merge

    status, severity = live_span_marks((ENGINE,), merge(healthy_rank(rank) for rank in range(2)))
    # A recovered fallback: WARNING, and (like every span short of ERROR) unset.
    assert severity[(1, "allreduce_workspace/mnnvl")] == "WARNING"
    assert status[(1, "allreduce_workspace/mnnvl")] is StatusCode.UNSET
    assert status[(1, "allreduce_workspace")] is StatusCode.UNSET
    assert status[(0, "attention/FLASHINFER")] is StatusCode.UNSET
