"""The spans exported while a graph runs equal, field by field, the spans
rebuilt later from its stored log (SPEC §4: spans are reproducible): a graph
of the tests' own, run by :class:`orchestrator.Runner` with faults injected
on its step paths (the engine's run, in the engine's tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from events import (
    JsonValue,
    MessageRule,
    Severity,
    Slice,
    StepStarted,
)
from orchestrator import (
    ANY_EXCEPTION_POLICY,
    PROBE_POLICY,
    Attempt,
    Candidate,
    FaultPlan,
    Graph,
    Step,
    StepContext,
    run_fallback_chain,
    select_candidate,
)
from orchestrator._runner import derive_trace_id

from .tracing_harness import (
    LiveRun,
    assert_red_from_the_failing_step,
    run_graph_traced,
    spans_by_id,
)

pytestmark = pytest.mark.anyio

ABI_MISMATCH = "libfast.so: undefined symbol: _ZN5torch3jit"

#: The tests' slice: a broken import under the cpu kernels is a WARNING (a
#: recovered environment breakage), with its traceback.
MINE = Slice(
    name="mine",
    rules=[
        MessageRule(
            code="mine.import_broken",
            step="kernels/cpu/import",
            outcomes="unavailable",
            exception="OSError",
            severity=Severity.WARNING,
            text="The fast kernels failed to import ({error})",
        )
    ],
)


def fits(_context: StepContext) -> list[str]:
    return []


def import_json(context: StepContext) -> JsonValue:
    context.import_module("json")
    return {"loaded": True}


async def cpu_kernels(context: StepContext) -> JsonValue:
    """The cpu kernels: their import child records an environment failure
    (probe policy), and the kernels fall back to the plain ones."""
    imported = await context.run_child("import", import_json, policy=PROBE_POLICY)
    return {"fast": imported.ok}


async def kernels(context: StepContext) -> JsonValue:
    await context.run_child("cpu", cpu_kernels, policy=ANY_EXCEPTION_POLICY)
    selection = await select_candidate(
        context,
        [
            Candidate(name="fast", priority=0, probe=fits),
            Candidate(name="slow", priority=1, probe=fits),
        ],
    )
    return {"selected": selection.selected}


def ready(_context: StepContext) -> JsonValue:
    return {"ready": True}


def cache_dir(_context: StepContext) -> JsonValue:
    return {"cache_dir": "/cache"}


async def warmup(context: StepContext) -> JsonValue:
    chain = await run_fallback_chain(
        context,
        [Attempt(name="graph", body=ready), Attempt(name="eager", body=ready)],
        timeout=0.5,
    )
    return {"mode": chain.backend}


GRAPH = Graph(
    "mine",
    [
        Step(name="cache_dir", body=cache_dir),
        Step(name="kernels", body=kernels, depends_on=["cache_dir"]),
        Step(name="warmup", body=warmup, depends_on=["kernels"]),
    ],
)

SCENARIOS: dict[str, dict[str, Any]] = {
    "healthy, rank 5 of 8": {"world_size": 8, "rank": 5},
    "rank 3 without the fast kernels": {
        "world_size": 8,
        "rank": 3,
        "inject": ["3:kernels/fast=OSError:libfast.so.1: cannot open shared object file"],
    },
    "import OSError": {"inject": [f"kernels/cpu/import=OSError:{ABI_MISMATCH}"]},
    "failed: a kernel probe raises": {
        "world_size": 8,
        "inject": ["kernels/fast=RuntimeError:no kernel image is available"],
    },
    "timed out: the graph warmup hangs": {"inject": ["warmup/graph=hang"]},
}


async def run_scenario(directory: Path, scenario: str) -> LiveRun:
    options = dict(SCENARIOS[scenario])
    inject = options.pop("inject", [])
    return await run_graph_traced(
        directory, GRAPH, slices=(MINE,), faults=FaultPlan.parse(inject), **options
    )


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
    run = await run_scenario(tmp_path, scenario)

    assert_live_equals_replay(run)
    steps = [event for event in run.events if isinstance(event, StepStarted)]
    assert len(run.live) == len(steps) + 1  # every step, and the rank's root
    assert {span.context.trace_id for span in run.live} == {int(derive_trace_id("tracing-run"), 16)}


async def test_a_failed_run_is_red_from_the_failing_step_to_the_root(tmp_path: Path) -> None:
    run = await run_scenario(tmp_path, "failed: a kernel probe raises")

    assert isinstance(run.error, RuntimeError)
    assert_red_from_the_failing_step(
        run,
        ("kernels/fast", "kernels", "startup rank 0"),
        "RuntimeError: no kernel image is available",
    )


async def test_a_recovered_import_failure_nests_under_its_parent_and_is_marked(
    tmp_path: Path,
) -> None:
    run = await run_scenario(tmp_path, "import OSError")

    assert run.error is None
    spans = {span.name: span for span in run.live}
    imported, cpu, parent = (
        spans[name] for name in ("kernels/cpu/import", "kernels/cpu", "kernels")
    )
    assert imported.parent is not None
    assert cpu.parent is not None
    assert imported.parent.span_id == cpu.context.span_id
    assert cpu.parent.span_id == parent.context.span_id
    # The WARNING (a recovered environment breakage) is on the import span,
    # as its severity and exception event, not a red status (the startup
    # recovered); the kernels that fell back and their parent are fine.
    assert imported.status.status_code is StatusCode.UNSET
    assert (imported.attributes or {})["startup.severity"] == "WARNING"
    assert cpu.status.status_code is StatusCode.UNSET
    assert parent.status.status_code is StatusCode.UNSET
    [raised] = [event for event in imported.events if event.name == "exception"]
    assert raised.attributes is not None
    assert raised.attributes["exception.type"] == "OSError"
    assert raised.attributes["exception.message"] == ABI_MISMATCH
    assert "Traceback" in str(raised.attributes["exception.stacktrace"])
