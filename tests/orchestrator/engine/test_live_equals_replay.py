"""The spans exported while the engine runs equal, field by field, the spans
rebuilt later from its stored log (SPEC §4: spans are reproducible); a
failed engine run is red where it failed, and a broken zentorch is marked on
its own span (a graph of the tests' own: ``tests/exporters/test_live_equals_replay.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from events import StepStarted
from orchestrator._runner import derive_trace_id
from orchestrator.engine import ZENTORCH_STEP
from tests.exporters.tracing_harness import LiveRun, assert_red_from_the_failing_step, spans_by_id

from .tracing import run_engine_traced

pytestmark = pytest.mark.anyio

ABI_MISMATCH = "libzentorch.so: undefined symbol: _ZN5torch3jit"
SCENARIOS: dict[str, dict[str, Any]] = {
    "h200x8 healthy": {"profile": "h200x8", "tp": 8, "rank": 5},
    "h200x8 rank 3 without libcuda": {
        "profile": "h200x8",
        "tp": 8,
        "rank": 3,
        "inject": ["3:attention/FLASH_ATTN=OSError:libcuda.so.1: cannot open shared object file"],
    },
    "zen4 zentorch OSError": {
        "profile": "zen4",
        "inject": [f"zentorch=OSError:{ABI_MISMATCH}"],
    },
    "failed: attention probe raises": {
        "profile": "h200x8",
        "tp": 8,
        "inject": ["attention/FLASHINFER=RuntimeError:CUDA error: no kernel image is available"],
    },
    "failed: no platform": {"profile": "zen4", "inject": ["zentorch=RuntimeError:unknown failure"]},
    "timed out: flashinfer.comm hangs": {
        "profile": "h200x8",
        "tp": 8,
        "step_timeout": 0.5,
        "inject": ["flashinfer.comm=hang"],
    },
}


def assert_live_equals_replay(run: LiveRun) -> None:
    live = spans_by_id(run.live)
    replayed = spans_by_id(run.replayed())
    assert sorted(live) == sorted(replayed)
    for span_id, fields in replayed.items():
        differing = {
            name: (live[span_id][name], value)
            for name, value in fields.items()
            if live[span_id][name] != value
        }
        assert not differing, f"span {fields['name']} ({span_id}) live != replay: {differing}"


@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_live_spans_equal_replayed_spans_field_by_field(
    scenario: str, tmp_path: Path
) -> None:
    run = await run_engine_traced(tmp_path, **SCENARIOS[scenario])

    assert_live_equals_replay(run)
    steps = [event for event in run.events if isinstance(event, StepStarted)]
    assert len(run.live) == len(steps) + 1  # every step, and the rank's root
    assert {span.context.trace_id for span in run.live} == {int(derive_trace_id("tracing-run"), 16)}


async def test_a_failed_run_is_red_from_the_failing_step_to_the_root(tmp_path: Path) -> None:
    run = await run_engine_traced(tmp_path, **SCENARIOS["failed: attention probe raises"])

    assert isinstance(run.error, RuntimeError)
    assert_red_from_the_failing_step(
        run,
        ("attention/FLASHINFER", "attention", "startup rank 0"),
        "RuntimeError: CUDA error: no kernel image is available",
    )


async def test_zentorch_abi_mismatch_nests_under_the_cpu_plugin_and_is_marked(
    tmp_path: Path,
) -> None:
    run = await run_engine_traced(tmp_path, **SCENARIOS["zen4 zentorch OSError"])

    spans = {span.name: span for span in run.live}
    zentorch, cpu, platform = (spans[name] for name in (ZENTORCH_STEP, "platform/cpu", "platform"))
    assert zentorch.parent is not None
    assert cpu.parent is not None
    assert zentorch.parent.span_id == cpu.context.span_id
    assert cpu.parent.span_id == platform.context.span_id
    # The WARNING (a recovered environment breakage) is on the import span,
    # as its severity and exception event, not a red status (the startup
    # recovered); the plugin that fell back to CpuPlatform and the platform
    # step are fine.
    assert zentorch.status.status_code is StatusCode.UNSET
    assert (zentorch.attributes or {})["startup.severity"] == "WARNING"
    assert cpu.status.status_code is StatusCode.UNSET
    assert platform.status.status_code is StatusCode.UNSET
    [raised] = [event for event in zentorch.events if event.name == "exception"]
    assert raised.attributes is not None
    assert raised.attributes["exception.type"] == "OSError"
    assert raised.attributes["exception.message"] == ABI_MISMATCH
    assert "Traceback" in str(raised.attributes["exception.stacktrace"])
