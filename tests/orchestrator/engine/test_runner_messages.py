"""The engine's messages over events the real runner writes (not hand-built)."""

from __future__ import annotations

import logging

import pytest

from events import JsonValue, MemoryLog, RunOutcome, Severity, step_severity
from events import replay as replay_events
from orchestrator import (
    ANY_EXCEPTION_POLICY,
    PROBE_POLICY,
    Candidate,
    Graph,
    Runner,
    Step,
    StepContext,
    select_candidate,
)
from orchestrator.engine import ENGINE

pytestmark = pytest.mark.anyio


def zentorch(_context: StepContext) -> JsonValue:
    raise RuntimeError("unknown zentorch failure")


async def cpu_plugin(context: StepContext) -> JsonValue:
    await context.run_child("zentorch", zentorch, policy=PROBE_POLICY)
    return {"activated": True, "platform_class": "CpuPlatform"}


async def platform(context: StepContext) -> JsonValue:
    """The zentorch child propagates its RuntimeError (probe policy); the cpu
    plugin records it (any-exception policy), absorbing the failure; the
    platform goes on and ends on another plugin."""
    await context.run_child("cpu", cpu_plugin, policy=ANY_EXCEPTION_POLICY)
    return {"plugin": "cuda", "platform_class": "CudaPlatform"}


async def attention(context: StepContext) -> JsonValue:
    def fits(_context: StepContext) -> list[str]:
        return []

    def breaks(_context: StepContext) -> list[str]:
        raise AttributeError("module 'flash_attn' has no attribute 'flash_attn_func'")

    selection = await select_candidate(
        context,
        [
            Candidate(name="FLASH_ATTN", priority=0, probe=breaks),
            Candidate(name="TRITON_ATTN", priority=1, probe=fits),
        ],
    )
    return {"backend": selection.selected, "explicit": None, "considered": []}


async def test_absorbed_and_propagated_failures_from_the_runner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from exporters import LoggingBridge

    caplog.set_level(logging.DEBUG, logger="orchestrator")
    graph = Graph(
        "engine",
        [
            Step(name="platform", body=platform),
            Step(name="attention", body=attention, depends_on=["platform"]),
        ],
    )
    log = MemoryLog("runner-run", 0)
    bridge = LoggingBridge(slices=(ENGINE,))
    with log.subscribe(bridge), pytest.raises(AttributeError):
        await Runner(log).run(graph)

    result = replay_events(log.events, slices=[ENGINE])
    codes = [m.code for m in result.messages]
    # The absorbed child failure is the plugin's outcome; the propagated
    # candidate failure is one step.failed, on the candidate.
    assert codes == [
        "platform.plugin_failed",
        "platform.detected",
        "platform.fallback",
        "step.failed",
        "run.failed",
    ]
    failed = next(m for m in result.messages if m.code == "step.failed")
    assert failed.step == "attention/FLASH_ATTN"
    assert result.outcome is RunOutcome.FAILED
    cause = result.root_cause
    assert cause is not None
    assert cause.step == "attention/FLASH_ATTN"
    assert cause.exception is not None
    assert cause.exception.name == "AttributeError"
    assert step_severity(result.message_state, 0, "platform") is Severity.WARNING
    # Live and replayed messages are the same; the live stream leaves out
    # run.failed, which would repeat the step's ERROR line already printed.
    assert bridge.state.messages() == result.messages
    printed = [r.code for r in caplog.records]  # type: ignore[attr-defined]
    assert printed == [code for code in codes if code != "run.failed"]
