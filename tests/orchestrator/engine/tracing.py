"""The engine run in this process with live spans, for the tracing tests of
the engine (the wiring and the spans as plain values:
``tests.exporters.tracing_harness``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from events import JsonlLog, RankIdentity
from orchestrator import FaultPlan, Graph, Runner
from orchestrator.engine import ENGINE, EngineConfig, load_profile, prepare_engine
from tests.exporters.tracing_harness import LiveRun, activate_span, run_traced


async def run_engine_traced(
    directory: Path,
    *,
    profile: str,
    tp: int = 1,
    rank: int = 0,
    inject: Sequence[str] = (),
    **config: Any,
) -> LiveRun:
    """Run the engine graph for ``rank`` on a simulated host, wired as the
    command line wires a rank: a JSON Lines log with the logging bridge
    (the engine's slice) subscribed first and live spans (into memory)
    second, the span activator on."""
    identity = RankIdentity(rank=rank, local_rank=rank, world_size=tp, local_world_size=tp)

    def prepare(log: JsonlLog) -> tuple[Runner, Graph]:
        return prepare_engine(
            EngineConfig(tp=tp, **config),
            log,
            identity=identity,
            profile=load_profile(profile),
            faults=FaultPlan.parse(list(inject)),
            span_activator=activate_span,
        )

    return await run_traced(directory, prepare, rank=rank, slices=(ENGINE,))
