"""Running the reference engine graph on the real host or a simulated one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from events import EventLog, RankIdentity

from .._faults import FaultPlan
from .._graph import Graph
from .._importer import Importer, RealImporter
from .._runner import Runner, SpanActivator
from ._config import EngineConfig, EngineConfigError
from ._conventions import ENGINE_SLICE
from ._graph import build_engine_graph
from ._host import HostFacts, RealHost
from ._platform import PlatformPlugin
from ._profiles import Profile, SimulatedHost, SimulatedImporter
from ._resolution import ENGINE_DECIDERS

__all__ = ["prepare_engine"]


def prepare_engine(
    config: EngineConfig,
    log: EventLog,
    *,
    identity: RankIdentity | None = None,
    profile: Profile | None = None,
    faults: FaultPlan | None = None,
    group: Any = None,
    workspace_factory: Any = None,
    trace_id: str | None = None,
    parent_span_id: str | None = None,
    span_activator: SpanActivator | None = None,
    plugins: Mapping[str, PlatformPlugin] | None = None,
    discover_plugins: bool = True,
    host: HostFacts | None = None,
    importer: Importer | None = None,
    engine: Literal["reference", "vllm"] = "reference",
    **runner_options: Any,
) -> tuple[Runner, Graph]:
    """The :class:`~orchestrator.Runner` and graph of the engine startup for
    one rank, ready to run: ``await runner.run(graph)`` runs it, recording it
    in ``log``, and returns its :class:`~orchestrator.RunResult` when it
    reached ``ready``; ``runner.begin(graph)`` first records ``run.started``
    at once, before any slow set-up of the caller's. A step that failed the
    run raises its original error from ``runner.run`` (PlatformConflictError,
    UnspecifiedPlatformError, the ValueError of attention selection, a
    programming error in a probe...), after its events and the run's final
    event are in the log.

    Args:
        config: what the engine is asked to start (recorded in
            ``run.started``).
        log: where the events go.
        identity: this rank (default: rank ``log.rank`` of a world of one).
        profile: simulate this host instead of probing the real one
            (:class:`SimulatedHost` facts and a :class:`SimulatedImporter`).
        faults: faults injected through the importer and on step paths.
        group: a cross-rank :class:`~orchestrator.Group` for the all-reduce
            agreement (none: each rank decides alone).
        workspace_factory: creates all-reduce workspaces (default: real
            flashinfer.comm on a real host, simulated on a simulated one).
        trace_id, parent_span_id: the launch's trace (default: derived
            from the run id).
        span_activator: makes a step's span current while it runs.
        plugins: third-party platform plugins besides the entry points.
        discover_plugins: whether to look up platform plugin entry points.
        host, importer: override the host facts or the importer (a fake
            host for tests, or the real importer on simulated host facts).
        engine: whose platform plugins run: the reference engine's, or
            ``vllm``'s own (vLLM's real platform code, on this host; the
            other steps are the reference engine's model for the platform
            it selects).
        runner_options: passed on to :class:`~orchestrator.Runner`.

    Raises:
        ValueError: a plugin name or a runner option is not valid, or
            ``engine="vllm"`` with vLLM not installed or on a simulated
            host (:class:`~orchestrator.engine.EngineConfigError`).
    """
    if engine == "vllm" and profile is not None:
        raise EngineConfigError(
            "engine",
            engine,
            "vLLM's platform code probes this host; a simulated host is for the reference "
            "engine's plugins",
        )
    if host is None:
        host = RealHost() if profile is None else SimulatedHost(profile)
    if importer is None:
        importer = RealImporter() if profile is None else SimulatedImporter(profile)
    services = {
        name: service
        for name, service in (("group", group), ("workspace_factory", workspace_factory))
        if service is not None
    }
    if profile is not None:
        # Reports say first that the host was simulated.
        runner_options.setdefault("simulated", profile.name)
    runner_options.setdefault("slices", (ENGINE_SLICE,))
    runner = Runner(
        log,
        identity=identity,
        importer=importer,
        faults=faults,
        config=config.to_json(),
        host=host,
        services=services,
        trace_id=trace_id,
        parent_span_id=parent_span_id,
        deciders={**ENGINE_DECIDERS, **runner_options.pop("deciders", {})},
        span_activator=span_activator,
        **runner_options,
    )
    return runner, build_engine_graph(
        config, plugins=plugins, discover_plugins=discover_plugins, engine=engine
    )
