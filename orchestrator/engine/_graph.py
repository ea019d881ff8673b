"""The reference engine startup graph."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .._decisions import Decider
from .._graph import Graph, Step
from ._allreduce import make_allreduce_step
from ._attention import make_attention_step
from ._config import EngineConfig
from ._flashinfer_comm import make_flashinfer_comm_step
from ._platform import PlatformPlugin, decide_platform, make_platform_step

__all__ = ["ENGINE_DECIDERS", "build_engine_graph"]

#: The deciders the engine's steps call through ``StepContext.decide``
#: (besides the runner's defaults); replay needs them to recompute the
#: engine's decisions.
ENGINE_DECIDERS: Mapping[str, Decider] = {"platform.select": decide_platform}


def build_engine_graph(
    config: EngineConfig,
    *,
    plugins: Mapping[str, PlatformPlugin] | None = None,
    discover_plugins: bool = True,
    process_group: Step | None = None,
) -> Graph:
    """The engine's steps: ``platform``; then ``attention`` and
    ``flashinfer_comm`` (both after the platform); then
    ``allreduce_workspace`` (after the platform and flashinfer_comm). Each
    step may take ``config.step_timeout`` seconds.

    Args:
        config: what the engine is asked to start.
        plugins: third-party platform plugins to probe besides those
            registered under the entry-point group, by name.
        discover_plugins: whether to look up the entry-point group.
        process_group: a set-up step forming the ranks' process group; it
            runs first, and every other step waits for it.

    Raises:
        ValueError: a plugin name is empty, contains ``/`` or is a built-in
            plugin's name.
    """
    platform = make_platform_step(config, plugins=plugins, discover=discover_plugins)
    setup: list[Step] = []
    if process_group is not None:
        # Every rank joins the group before it probes anything: a rank that
        # fails a probe has then already met its peers, who learn of its exit
        # in their next exchange instead of waiting out the rendezvous.
        setup.append(process_group)
        platform = attrs.evolve(platform, depends_on=(*platform.depends_on, process_group.name))
    return Graph(
        "engine",
        [
            *setup,
            platform,
            make_attention_step(config),
            make_flashinfer_comm_step(config),
            make_allreduce_step(config),
        ],
    )
