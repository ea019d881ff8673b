"""The reference engine startup graph."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from .._graph import Graph
from ._allreduce import make_allreduce_step
from ._attention import make_attention_step
from ._config import EngineConfig
from ._flashinfer_comm import make_flashinfer_comm_step
from ._platform import PlatformPlugin, make_platform_step
from ._vllm import VllmPlugins

__all__ = ["build_engine_graph"]


def build_engine_graph(
    config: EngineConfig,
    *,
    plugins: Mapping[str, PlatformPlugin] | None = None,
    discover_plugins: bool = True,
    engine: Literal["reference", "vllm"] = "reference",
) -> Graph:
    """The engine's steps: ``platform``; then ``attention`` and
    ``flashinfer_comm`` (both after the platform); then
    ``allreduce_workspace`` (after the platform and flashinfer_comm), each
    bounded as :attr:`EngineConfig.step_timeout` says.

    Args:
        config: what the engine is asked to start.
        plugins: third-party platform plugins to probe besides those
            registered under the entry-point group, by name.
        discover_plugins: whether to look up the entry-point group.
        engine: whose platform plugins the platform step runs: the reference
            engine's, or ``vllm``'s own (the other steps are the reference
            engine's model for the platform selected).

    Raises:
        ValueError: a plugin name is empty, contains ``/`` or is a built-in
            plugin's name; ``engine="vllm"`` without vLLM installed
            (:class:`~orchestrator.engine.EngineConfigError`).
    """
    return Graph(
        "engine",
        [
            make_platform_step(
                config,
                plugins=plugins,
                discover=discover_plugins,
                plugin_set=VllmPlugins(config, discover=discover_plugins)
                if engine == "vllm"
                else None,
            ),
            make_attention_step(config),
            make_flashinfer_comm_step(config),
            make_allreduce_step(config),
        ],
    )
