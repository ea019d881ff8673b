"""The ``platform`` step: which platform is this host (SPEC §3.2)?

Platform plugins are probed concurrently, each as a child step
``platform/<plugin>`` of kind ``candidate``. A plugin answers in one of three
ways:

* **activated** — it returns the qualified name of its platform class; the
  step ends ``ok`` with ``{"activated": true, "platform_class", "device"}``;
* **declined** — it returns :func:`decline` with what it looked for and did
  not find (``NVML Shared Library Not Found``); the step ends ``absent``
  with that reason (``platform.plugin_declined``, DEBUG). A decline whose
  hardware is evidently there but unusable (GPU device nodes, no NVML) ends
  ``unavailable`` (``platform.device_unusable``, WARNING). ``None`` is a
  decline that gives no reason;
* **failed** — it raises an ``Exception``: recorded (``unavailable`` with
  the cause) and not activated. BaseExceptions propagate.

Whose plugins run is the engine's choice: the reference engine's built-ins
(tpu, cuda, rocm, xpu, cpu, below) and the third-party plugins of the
entry-point group :data:`PLATFORM_PLUGIN_GROUP` (or handed in directly), or
vLLM's own (:mod:`orchestrator.engine._vllm`, ``engine="vllm"``).

Resolution, a pure function of the plugins' outcomes (recorded as the
``platform.select`` decision, so replay recomputes it), as vLLM's::

    exactly one third-party plugin activated     -> it
    two or more third-party plugins activated    -> PlatformConflictError
    none third-party, exactly one built-in       -> it
    none third-party, two or more built-in       -> PlatformConflictError
    nothing activated                            -> UnspecifiedPlatformError,
        naming every plugin's reason (declined) or exception chain (failed),
        raised from the first failure

The reference built-ins. First ``platform/build`` records what the build
targets (:meth:`HostFacts.build_target`; ``EngineConfig.target_device``
wins): the cpu plugin activates only for a CPU build, and the cuda plugin
declines on one, as vLLM's do. A target named explicitly as ``cpu`` (as
``VLLM_TARGET_DEVICE=cpu``) probes the cpu plugin alone, vLLM's fast path.
The accelerator plugins activate when their device query finds devices. On
an AMD Zen host (AuthenticAMD with AVX-512) the cpu plugin runs
``platform/cpu/zentorch`` under the optional-module policy: zentorch loads
-> ``ZenCpuPlatform``; absent or broken (OSError, other ImportError) ->
``CpuPlatform``; anything else fails the cpu plugin.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Protocol

import anyio
import attrs

from events import JsonValue, Outcome, StepKind

from .._context import StepBody, StepContext, StepResult, Unavailable
from .._graph import Step
from .._policy import ANY_EXCEPTION_POLICY, Action, ErrorPolicy, optional_module_policy
from ._config import CPU_TARGET_HINT, EngineConfig, PlatformConflictError, UnspecifiedPlatformError
from ._conventions import PLATFORM_BUILD_STEP, PLATFORM_STEP
from ._host import BuildTarget, Devices, is_amd_zen
from ._resolution import PluginOutcome, _outcome, resolve_platform

__all__ = [
    "BUILTIN_PLATFORM_PLUGINS",
    "PLATFORM_PLUGIN_GROUP",
    "PLATFORM_POLICY",
    "PlatformPlugin",
    "PluginSet",
    "PluginSpec",
    "check_plugin_name",
    "decline",
    "make_platform_step",
]

#: The entry-point group third-party platform plugins register under. Each
#: entry point loads to a callable ``(ctx) -> str | Unavailable | None``: the
#: qualified name of its platform class when it activates, else
#: :func:`decline` with the reason (or ``None``, a decline without one).
PLATFORM_PLUGIN_GROUP = "startup_orchestrator.platform_plugins"

#: A third-party plugin: blocking (run in a worker thread) or async.
PlatformPlugin = (
    Callable[[StepContext], str | Unavailable | None]
    | Callable[[StepContext], Awaitable[str | Unavailable | None]]
)

#: The platform step's own errors (conflict, none) are terminal, and so is a
#: timeout: nothing after it can run without a platform.
PLATFORM_POLICY = ErrorPolicy(name="platform", on_timeout=Action.PROPAGATE)

#: Built-in plugins in priority order (priority only orders the report;
#: resolution never depends on it).
BUILTIN_PLATFORM_PLUGINS = ("tpu", "cuda", "rocm", "xpu", "cpu")


def decline(reason: str, *, present: bool = False) -> Unavailable:
    """What a platform plugin returns when it does not activate.

    Args:
        reason: what it looked for and did not find, in the terms a user can
            act on (``libtpu is not installed``).
        present: the hardware is evidently there but cannot be used (the
            step then ends ``unavailable`` and the run warns), rather than
            simply absent.
    """
    return Unavailable(
        outcome=Outcome.UNAVAILABLE if present else Outcome.ABSENT, reasons=(reason,)
    )


def _activated(platform_class: str, device: str | None) -> dict[str, JsonValue]:
    return {"activated": True, "platform_class": platform_class, "device": device}


@attrs.frozen(kw_only=True)
class PluginSpec:
    """One plugin of a platform step: its name, whether it is a built-in
    (third-party plugins win over built-ins), its report order and what it
    runs (a step body whose value is an activation, or a decline)."""

    name: str
    builtin: bool
    priority: int
    body: StepBody
    #: Extra attributes of its ``platform/<name>`` step.
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)


class PluginSet(Protocol):
    """Whose plugins a platform step runs (the reference engine's, or a real
    engine's own), and what it does around them."""

    #: Attributes of the ``platform`` step (which engine's code it runs).
    attributes: Mapping[str, JsonValue]

    def session(self) -> contextlib.AbstractContextManager[object]:
        """Held while the plugins run (capture what they log)."""
        ...

    async def specs(self, ctx: StepContext) -> list[PluginSpec]:
        """The plugins to probe (may record child steps first)."""
        ...

    async def adopt(
        self, ctx: StepContext, selected: PluginOutcome, results: Mapping[str, StepResult]
    ) -> Mapping[str, JsonValue]:
        """Act on the selected plugin (hand the decision back); what to add
        to the step's result."""
        ...


# --- the reference engine's built-in plugins -----------------------------------------


#: Accelerator plugin (its device) -> the host query it asks, its platform class.
_ACCELERATORS = {
    "tpu": ("tpu_devices", "TpuPlatform"),
    "cuda": ("nvidia_devices", "CudaPlatform"),
    "rocm": ("amd_devices", "RocmPlatform"),
    "xpu": ("xpu_devices", "XpuPlatform"),
}


def _accelerator(device: str, build: BuildTarget | None) -> StepBody:
    query, platform_class = _ACCELERATORS[device]

    def probe(ctx: StepContext) -> JsonValue | Unavailable:
        # vLLM's cuda plugin declines on a CPU build whatever the GPUs say.
        if device == "cuda" and build is not None and build.device == "cpu":
            return decline(f"this build targets cpu ({build.source})")
        devices: Devices = getattr(ctx.host, query)(ctx)
        if devices.found:
            return _activated(platform_class, device)
        return decline(devices.reason or "no devices found", present=devices.present)

    return probe


def _device_capability(ctx: StepContext, device: str | None) -> tuple[int, int] | None:
    # Only CUDA and ROCm devices report a compute capability.
    if device not in ("cuda", "rocm"):
        return None
    devices: Devices = getattr(ctx.host, _ACCELERATORS[device][0])(ctx)
    return devices.found[0].capability if devices.found else None


def _import_zentorch(ctx: StepContext) -> JsonValue:
    ctx.import_module("zentorch")
    return {"loaded": True}


def _cpu(config: EngineConfig, build: BuildTarget | None, unknown: str) -> StepBody:
    async def probe(ctx: StepContext) -> JsonValue | Unavailable:
        if build is None:
            return decline(f"the build target is unknown ({unknown})")
        if build.device != "cpu":
            return decline(f"this build targets {build.device} ({build.source}; {CPU_TARGET_HINT})")
        platform_class = "CpuPlatform"
        if is_amd_zen(await ctx.to_thread(ctx.host.read_cpuinfo)):
            zentorch = await ctx.run_child(
                "zentorch",
                _import_zentorch,
                policy=optional_module_policy("zentorch"),
                timeout=config.step_timeout,
            )
            if zentorch.ok:
                platform_class = "ZenCpuPlatform"
        return _activated(platform_class, "cpu")

    return probe


def _third_party_body(name: str, load: Callable[[], object]) -> StepBody:
    async def probe(ctx: StepContext) -> JsonValue | Unavailable:
        plugin = await ctx.to_thread(load)
        if not callable(plugin):
            raise TypeError(f"platform plugin {name!r} loaded {plugin!r}, which is not callable")
        if inspect.iscoroutinefunction(plugin):
            value = await plugin(ctx)
        else:
            value = await ctx.to_thread(plugin, ctx)
        if value is None:
            return decline(f"platform plugin {name!r} declined without a reason (returned None)")
        if isinstance(value, Unavailable):
            return value
        if isinstance(value, str):
            return _activated(value, None)
        raise TypeError(
            f"platform plugin {name!r} returned {type(value).__name__}; a plugin returns the "
            "qualified name of its platform class (str), decline(reason), or None"
        )

    return probe


def _entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=group), key=lambda ep: ep.name)


def check_plugin_name(name: str, seen: Iterable[str], origin: str) -> None:
    """Refuse a third-party plugin name that cannot be a step of its own
    (empty, nested, a built-in's, or another plugin's).

    Raises:
        ValueError: naming the plugin and where it came from.
    """
    if not name or "/" in name:
        raise ValueError(f"platform plugin name {name!r} ({origin}) must be non-empty without '/'")
    if name in BUILTIN_PLATFORM_PLUGINS or name == PLATFORM_BUILD_STEP.rpartition("/")[2]:
        raise ValueError(
            f"third-party platform plugin {name!r} ({origin}) has the name of a built-in "
            f"plugin or step ({', '.join(BUILTIN_PLATFORM_PLUGINS)}, build); rename it"
        )
    if name in seen:
        raise ValueError(f"two third-party platform plugins are named {name!r} ({origin})")


def _given(plugin: object) -> Callable[[], object]:
    """A loader for a plugin already at hand (not an entry point)."""
    return lambda: plugin


@attrs.define
class _ReferencePlugins:
    """The reference engine's built-ins, after ``platform/build``, and the
    third-party plugins."""

    config: EngineConfig
    extra: Mapping[str, PlatformPlugin]
    discover: bool
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)

    def session(self) -> contextlib.AbstractContextManager[object]:
        return contextlib.nullcontext()

    async def specs(self, ctx: StepContext) -> list[PluginSpec]:
        build, unknown = await self.build(ctx)
        bodies = {name: _accelerator(name, build) for name in _ACCELERATORS}
        bodies["cpu"] = _cpu(self.config, build, unknown)
        specs = [
            PluginSpec(name=name, builtin=True, priority=index, body=bodies[name])
            for index, name in enumerate(BUILTIN_PLATFORM_PLUGINS)
        ]
        if build is not None and build.explicit and build.device == "cpu":
            # vLLM's fast path: an explicit CPU target is authoritative.
            return [spec for spec in specs if spec.name == "cpu"]
        entry_points = (
            await ctx.to_thread(_entry_points, PLATFORM_PLUGIN_GROUP) if self.discover else []
        )
        third: dict[str, Callable[[], object]] = {}
        for entry_point in entry_points:
            check_plugin_name(entry_point.name, third, f"entry point {entry_point.value}")
            third[entry_point.name] = entry_point.load
        for name, plugin in self.extra.items():
            check_plugin_name(name, third, "given to the engine")
            third[name] = _given(plugin)
        return specs + [
            PluginSpec(name=name, builtin=False, priority=index, body=_third_party_body(name, load))
            for index, (name, load) in enumerate(sorted(third.items()), start=len(specs))
        ]

    async def build(self, ctx: StepContext) -> tuple[BuildTarget | None, str]:
        """Record ``platform/build``: the build target, or why it is unknown."""
        named = self.config.target_device
        found: list[BuildTarget] = []

        def find(child: StepContext) -> JsonValue:
            target = (
                BuildTarget(device=named, source="named by --target-device", explicit=True)
                if named is not None
                else child.host.build_target(child)
            )
            found.append(target)
            return attrs.asdict(target)

        result = await ctx.run_child(
            PLATFORM_BUILD_STEP.rpartition("/")[2],
            find,
            policy=ANY_EXCEPTION_POLICY,
            timeout=self.config.step_timeout,
        )
        if not result.ok:
            return None, _why(result)
        return found[0], ""

    async def adopt(
        self, ctx: StepContext, selected: PluginOutcome, results: Mapping[str, StepResult]
    ) -> Mapping[str, JsonValue]:
        return {}


def _why(result: StepResult) -> str:
    return "; ".join(result.reasons) or str(result.outcome)


def _reason(result: StepResult) -> str:
    if result.exception is not None:
        return ", caused by ".join(link.reason for link in result.exception.chain())
    return _why(result)


# --- the step -----------------------------------------------------------------------


def make_platform_step(
    config: EngineConfig,
    *,
    plugins: Mapping[str, PlatformPlugin] | None = None,
    discover: bool = True,
    plugin_set: PluginSet | None = None,
) -> Step:
    """The ``platform`` step.

    Args:
        config: the engine configuration (step timeout, target device).
        plugins: third-party plugins to probe besides those registered under
            :data:`PLATFORM_PLUGIN_GROUP`, by name.
        discover: whether to look up the entry-point group at all.
        plugin_set: whose plugins run instead of the reference engine's
            (vLLM's: :class:`orchestrator.engine._vllm.VllmPlugins`).

    The step raises :class:`PlatformConflictError` or
    :class:`UnspecifiedPlatformError` (both terminal); a third-party plugin
    whose name is empty, contains ``/``, repeats another's, or is a built-in
    plugin's name is a ValueError.
    """
    extra = dict(plugins or {})
    for name in extra:
        check_plugin_name(name, (), "given to the engine")
    if plugin_set is None:
        plugin_set = _ReferencePlugins(config, extra, discover)

    async def detect_platform(ctx: StepContext) -> JsonValue:
        results: dict[str, StepResult] = {}
        # Resolved from what each plugin's step recorded, as the replayed
        # platform.select decision is.
        outcomes: list[PluginOutcome] = []
        with plugin_set.session():
            specs = await plugin_set.specs(ctx)

            async def probe(spec: PluginSpec) -> None:
                attributes = {
                    "plugin": spec.name,
                    "builtin": spec.builtin,
                    "priority": spec.priority,
                    **spec.attributes,
                }
                result = results[spec.name] = await ctx.run_child(
                    spec.name,
                    spec.body,
                    kind=StepKind.CANDIDATE,
                    policy=ANY_EXCEPTION_POLICY,
                    # A plugin's own check, and one level below it (the cpu
                    # plugin's zentorch; vLLM's register, then load_class).
                    timeout=config.bound(2),
                    attributes=attributes,
                )
                outcomes.append(_outcome(attributes, result.outcome, result.value, spec.name))

            async with anyio.create_task_group() as group:
                for spec in specs:
                    group.start_soon(probe, spec)

        ctx.decide("platform.select", {"parent": ctx.step})
        selected, conflict = resolve_platform(outcomes)
        if conflict:
            raise PlatformConflictError(list(conflict))
        if selected is None:
            # A decline (absent, or unusable hardware: unavailable with no
            # exception) is not a failure; an exception or a timeout is.
            failed = [
                s.name
                for s in specs
                if results[s.name].exception is not None
                or results[s.name].outcome not in (Outcome.ABSENT, Outcome.UNAVAILABLE)
            ]
            error = UnspecifiedPlatformError(
                {s.name: _reason(results[s.name]) for s in specs}, failed=failed
            )
            cause = next((results[name].error for name in failed if results[name].error), None)
            raise error from cause
        return {
            "plugin": selected.plugin,
            "platform_class": selected.platform_class,
            "device": selected.device,
            "builtin": selected.builtin,
            **(await plugin_set.adopt(ctx, selected, results)),
        }

    return Step(
        name=PLATFORM_STEP,
        body=detect_platform,
        policy=PLATFORM_POLICY,
        # The build target, then the plugins (the cpu plugin imports
        # zentorch below its own check): each level times out before the
        # one above it.
        timeout=config.bound(4),
        attributes=dict(plugin_set.attributes),
    )
