"""What a fault may target in the reference engine: the modules its probes
import and the step paths its graph can have.

A fault whose target the run never reaches is never fired, and an injected
failure that silently does nothing reads as a healthy host. The launcher
checks a fault plan against this table before the run starts
(:meth:`orchestrator.FaultPlan.check`).

Modules (a package of one is a valid target too, see ``FaultPlan.check``)::

    attention backends    ATTENTION_BACKENDS[*].module (flash_attn, flashinfer, triton...)
    platform/cpu          zentorch
    platform plugins      pynvml (cuda), amdsmi (rocm), libtpu (tpu), torch (xpu)
    flashinfer_comm       flashinfer (looked up), flashinfer.comm
    allreduce_workspace   flashinfer.comm, torch (the real workspace factory)

(``process_group`` imports torch for real, never through the run's importer:
a fault on ``torch`` does not reach it; target ``process_group`` itself.
With ``engine="vllm"`` the platform plugins are vLLM's own code, which
imports its driver libraries itself: target their steps instead.)

Step paths::

    platform, platform/build, platform/<built-in plugin>, platform/cpu/zentorch,
    platform/<third-party plugin> (entry points of PLATFORM_PLUGIN_GROUP)
    (engine vllm: platform, platform/<vLLM plugin>, .../register, .../load_class,
    for vLLM's built-ins and its vllm.platform_plugins entry points)
    attention, attention/<every name in ATTENTION_BACKENDS>
    flashinfer_comm
    allreduce_workspace, allreduce_workspace/<every backend a chain can try>,
    allreduce_workspace/agree, allreduce_workspace/quant
    process_group

Every attention backend is listed, not only the candidates of this host:
which ones are probed depends on the platform the run detects, and an
explicit selection may probe any of them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from typing import Literal

import attrs

from .._group import PROCESS_GROUP_STEP
from .._importer import dotted_prefixes
from ._allreduce import WORKSPACE_MODULES
from ._attention import ATTENTION_BACKENDS
from ._config import AllreduceBackend
from ._conventions import (
    ALLREDUCE_AGREE_STEP,
    ALLREDUCE_QUANT_STEP,
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_BUILD_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)
from ._host import DRIVER_MODULES
from ._platform import BUILTIN_PLATFORM_PLUGINS, PLATFORM_PLUGIN_GROUP, _entry_points
from ._vllm import VLLM_PLUGIN_GROUP

__all__ = ["InjectionTargets", "injection_targets"]


@attrs.frozen(kw_only=True)
class InjectionTargets(Collection[str]):
    """The valid fault targets of one engine graph.

    A collection of every target (modules, then step paths), so it can be
    handed to :meth:`orchestrator.FaultPlan.check` as it is.

    Attributes:
        modules: module names probes import or look up, with their parent
            packages, sorted.
        steps: step paths the graph can have, sorted.
    """

    modules: tuple[str, ...]
    steps: tuple[str, ...]

    def __contains__(self, target: object) -> bool:
        return target in self.modules or target in self.steps

    def __iter__(self) -> Iterator[str]:
        return iter(self.modules + self.steps)

    def __len__(self) -> int:
        return len(self.modules) + len(self.steps)


def injection_targets(
    *,
    plugins: Iterable[str] = (),
    discover_plugins: bool = True,
    engine: Literal["reference", "vllm"] = "reference",
) -> InjectionTargets:
    """The modules and step paths a fault may target in the engine graph.

    Args:
        plugins: names of third-party platform plugins handed to the engine
            directly (``build_engine_graph(plugins=...)``); each adds
            ``platform/<name>``.
        discover_plugins: whether to add ``platform/<name>`` for every entry
            point registered under ``PLATFORM_PLUGIN_GROUP``. Entry points are
            listed, never loaded: a plugin's code does not run here. What a
            third-party plugin runs beneath its own step is unknown and not
            listed.
        engine: ``vllm`` lists the steps of vLLM's plugins (the names of
            vLLM's built-ins and of its ``vllm.platform_plugins`` entry
            points) in place of the reference engine's, and leaves out the
            driver modules vLLM imports itself.

    Returns:
        :class:`InjectionTargets` with ``modules`` and ``steps``.
    """
    # flashinfer_comm's flashinfer.comm is a workspace module; flashinfer,
    # which it looks up, is its package.
    imported = {backend.module for backend in ATTENTION_BACKENDS.values()} | {*WORKSPACE_MODULES}
    if engine == "reference":
        imported.update(("zentorch", *DRIVER_MODULES.values()))
    # A fault on a package breaks the import of its submodules.
    modules = {prefix for module in imported for prefix in dotted_prefixes(module)}

    steps = {PLATFORM_STEP, ATTENTION_STEP, FLASHINFER_COMM_STEP, ALLREDUCE_STEP}
    if engine == "vllm":
        entry_points = _entry_points(VLLM_PLUGIN_GROUP)
        steps.update(
            f"{PLATFORM_STEP}/{name}{child}"
            for name in (*BUILTIN_PLATFORM_PLUGINS, *(ep.name for ep in entry_points))
            for child in ("", "/register", "/load_class")
        )
    else:
        third_party = set(plugins)
        if discover_plugins:
            third_party.update(ep.name for ep in _entry_points(PLATFORM_PLUGIN_GROUP))
        # Names the platform step would refuse (empty or nested) never become
        # steps; one that shadows a built-in names the built-in's step.
        plugin_names = (*BUILTIN_PLATFORM_PLUGINS, *third_party)
        steps.update(f"{PLATFORM_STEP}/{name}" for name in plugin_names if name and "/" not in name)
        steps.update((PLATFORM_BUILD_STEP, ZENTORCH_STEP))
    steps.update(f"{ATTENTION_STEP}/{name}" for name in ATTENTION_BACKENDS)
    # Every backend a chain may attempt: each but auto, which picks among them.
    backends = [backend for backend in AllreduceBackend if backend is not AllreduceBackend.AUTO]
    steps.update(f"{ALLREDUCE_STEP}/{backend}" for backend in backends)
    steps.update((ALLREDUCE_AGREE_STEP, ALLREDUCE_QUANT_STEP, PROCESS_GROUP_STEP))
    return InjectionTargets(modules=tuple(sorted(modules)), steps=tuple(sorted(steps)))
