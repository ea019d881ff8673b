"""The ``platform`` step: which platform is this host (SPEC §3.2)?

Built-in plugins (tpu, cuda, rocm, xpu, cpu) and third-party plugins (from
the entry-point group :data:`PLATFORM_PLUGIN_GROUP`, or handed in directly)
are probed concurrently, each as a child step ``platform/<plugin>`` of kind
``candidate``. A plugin that raises any ``Exception`` is recorded and counts
as not activated; BaseExceptions propagate.

Resolution, a pure function of the plugins' outcomes (recorded as the
``platform.select`` decision, so replay recomputes it)::

    exactly one third-party plugin activated     -> it
    two or more third-party plugins activated    -> PlatformConflictError
    none third-party, exactly one built-in       -> it
    none third-party, two or more built-in       -> PlatformConflictError
    nothing activated                            -> UnspecifiedPlatformError,
        naming every failed plugin and its exception chain, raised from the
        first failure

The cpu plugin activates when the host has no usable accelerator. On an AMD
Zen host (AuthenticAMD with AVX-512) it runs ``platform/cpu/zentorch``
under the optional-module policy: zentorch loads -> ``ZenCpuPlatform``;
absent or broken (OSError, other ImportError) -> ``CpuPlatform``; anything
else fails the cpu plugin.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence

import anyio
import attrs

from events import (
    TERMINAL_STEP_EVENTS,
    Event,
    JsonValue,
    Outcome,
    StepKind,
    StepStarted,
    StepSucceeded,
    outcome_of,
)

from .._context import StepBody, StepContext, StepResult
from .._graph import Step
from .._policy import ANY_EXCEPTION_POLICY, Action, ErrorPolicy, optional_module_policy
from ._config import EngineConfig, PlatformConflictError, UnspecifiedPlatformError
from ._conventions import PLATFORM_STEP
from ._host import is_amd_zen

__all__ = [
    "BUILTIN_PLATFORM_PLUGINS",
    "PLATFORM_PLUGIN_GROUP",
    "PLATFORM_POLICY",
    "PlatformPlugin",
    "PluginOutcome",
    "Resolution",
    "decide_platform",
    "make_platform_step",
    "resolve_platform",
]

#: The entry-point group third-party platform plugins register under. Each
#: entry point loads to a callable ``(ctx) -> str | None``: the qualified
#: name of its platform class when it activates, else ``None``.
PLATFORM_PLUGIN_GROUP = "startup_orchestrator.platform_plugins"

#: A third-party plugin: blocking (run in a worker thread) or async.
PlatformPlugin = (
    Callable[[StepContext], str | None] | Callable[[StepContext], Awaitable[str | None]]
)

#: The platform step's own errors (conflict, none) are terminal, and so is a
#: timeout: nothing after it can run without a platform.
PLATFORM_POLICY = ErrorPolicy(name="platform", on_timeout=Action.PROPAGATE)

#: Built-in plugins in priority order (priority only orders the report;
#: resolution never depends on it).
BUILTIN_PLATFORM_PLUGINS = ("tpu", "cuda", "rocm", "xpu", "cpu")


def _activation(platform_class: str | None, device: str | None) -> dict[str, JsonValue]:
    return {
        "activated": platform_class is not None,
        "platform_class": platform_class,
        "device": device if platform_class is not None else None,
    }


# --- built-in plugins ---------------------------------------------------------------


def _probe_tpu(ctx: StepContext) -> JsonValue:
    present = ctx.host.tpu_present(ctx)
    return _activation("TpuPlatform" if present else None, "tpu")


def _probe_cuda(ctx: StepContext) -> JsonValue:
    devices = ctx.host.nvidia_devices(ctx)
    return _activation("CudaPlatform" if devices else None, "cuda")


def _probe_rocm(ctx: StepContext) -> JsonValue:
    devices = ctx.host.amd_devices(ctx)
    return _activation("RocmPlatform" if devices else None, "rocm")


def _probe_xpu(ctx: StepContext) -> JsonValue:
    devices = ctx.host.xpu_devices(ctx)
    return _activation("XpuPlatform" if devices else None, "xpu")


async def _usable_accelerators(ctx: StepContext) -> list[str]:
    """The accelerator kinds the host reports as usable, asked all at once.
    A query that raises, or that has not answered by the time its own
    plugin times out (a plugin's bound), counts as "not usable": that
    plugin records the error or its timeout, and the run lands on the CPU
    with a warning instead of nowhere (a hung driver would otherwise time
    the cpu plugin out too). A slow query that answers in time still
    counts."""
    host = ctx.host
    queries: Sequence[tuple[str, Callable[[StepContext], object]]] = (
        ("nvidia", host.nvidia_devices),
        ("amd", host.amd_devices),
        ("tpu", host.tpu_present),
        ("xpu", host.xpu_devices),
    )
    usable: set[str] = set()

    async def ask(kind: str, query: Callable[[StepContext], object]) -> None:
        try:
            if await ctx.to_thread(query, ctx):
                usable.add(kind)
        except Exception:  # recorded by that accelerator's plugin
            return

    bound = _probe_timeout(ctx, 2)
    with anyio.move_on_after(math.inf if bound is None else bound):
        async with anyio.create_task_group() as group:
            for kind, query in queries:
                group.start_soon(ask, kind, query)
    return [kind for kind, _query in queries if kind in usable]


def _import_zentorch(ctx: StepContext) -> JsonValue:
    ctx.import_module("zentorch")
    return {"loaded": True}


async def _probe_cpu(ctx: StepContext) -> JsonValue:
    if await _usable_accelerators(ctx):
        return _activation(None, None)
    cpuinfo = await ctx.to_thread(ctx.host.read_cpuinfo)
    platform_class = "CpuPlatform"
    if is_amd_zen(cpuinfo):
        zentorch = await ctx.run_child(
            "zentorch",
            _import_zentorch,
            policy=optional_module_policy("zentorch"),
            timeout=_probe_timeout(ctx, 1),
        )
        if zentorch.ok:
            platform_class = "ZenCpuPlatform"
    return _activation(platform_class, "cpu")


def _probe_timeout(ctx: StepContext, levels: int) -> float | None:
    """:meth:`EngineConfig.bound` from the run's recorded configuration."""
    seconds = ctx.config.get("step_timeout")
    return float(seconds) * levels if isinstance(seconds, int | float) else None


_BUILTIN_BODIES: Mapping[str, StepBody] = {
    "tpu": _probe_tpu,
    "cuda": _probe_cuda,
    "rocm": _probe_rocm,
    "xpu": _probe_xpu,
    "cpu": _probe_cpu,
}


# --- third-party plugins ------------------------------------------------------------


def _check_result(plugin: str, value: object) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise TypeError(
        f"platform plugin {plugin!r} returned {type(value).__name__}; a plugin returns the "
        "qualified name of its platform class (str) or None"
    )


def _third_party_body(name: str, load: Callable[[], object]) -> StepBody:
    async def probe(ctx: StepContext) -> JsonValue:
        plugin = await ctx.to_thread(load)
        if not callable(plugin):
            raise TypeError(f"platform plugin {name!r} loaded {plugin!r}, which is not callable")
        if inspect.iscoroutinefunction(plugin):
            value = await plugin(ctx)
        else:
            value = await ctx.to_thread(plugin, ctx)
        return _activation(_check_result(name, value), None)

    return probe


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(
        importlib.metadata.entry_points(group=PLATFORM_PLUGIN_GROUP), key=lambda ep: ep.name
    )


def _check_plugin_name(name: str, seen: Iterable[str], origin: str) -> None:
    if not name or "/" in name:
        raise ValueError(f"platform plugin name {name!r} ({origin}) must be non-empty without '/'")
    if name in BUILTIN_PLATFORM_PLUGINS:
        raise ValueError(
            f"third-party platform plugin {name!r} ({origin}) has the name of a built-in "
            f"plugin ({', '.join(BUILTIN_PLATFORM_PLUGINS)}); rename it"
        )
    if name in seen:
        raise ValueError(f"two third-party platform plugins are named {name!r} ({origin})")


def _loaded(plugin: PlatformPlugin) -> Callable[[], object]:
    return lambda: plugin


@attrs.frozen(kw_only=True)
class _PluginSpec:
    name: str
    builtin: bool
    priority: int
    body: StepBody


def _plugin_specs(
    entry_points: Sequence[importlib.metadata.EntryPoint],
    extra: Mapping[str, PlatformPlugin],
) -> list[_PluginSpec]:
    specs = [
        _PluginSpec(name=name, builtin=True, priority=index, body=_BUILTIN_BODIES[name])
        for index, name in enumerate(BUILTIN_PLATFORM_PLUGINS)
    ]
    third: dict[str, Callable[[], object]] = {}
    for entry_point in entry_points:
        _check_plugin_name(entry_point.name, third, f"entry point {entry_point.value}")
        third[entry_point.name] = entry_point.load
    for name, plugin in extra.items():
        _check_plugin_name(name, third, "given to the engine")
        third[name] = _loaded(plugin)
    for index, name in enumerate(sorted(third), start=len(specs)):
        specs.append(
            _PluginSpec(
                name=name, builtin=False, priority=index, body=_third_party_body(name, third[name])
            )
        )
    return specs


# --- resolution ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class PluginOutcome:
    """One plugin as resolution sees it."""

    plugin: str
    builtin: bool
    priority: int
    outcome: Outcome | None
    platform_class: str | None = None
    device: str | None = None

    @property
    def activated(self) -> bool:
        """Whether the plugin ended ``ok`` and named a platform class."""
        return self.outcome is Outcome.OK and self.platform_class is not None

    @property
    def failed(self) -> bool:
        """Whether the plugin did not end ``ok`` (it raised, timed out...)."""
        return self.outcome is not Outcome.OK


@attrs.frozen(kw_only=True)
class Resolution:
    """The outcome of resolution: a selected plugin, a conflict between the
    activated plugins, or neither (no platform)."""

    selected: PluginOutcome | None = None
    conflict: tuple[str, ...] = ()


def resolve_platform(plugins: Iterable[PluginOutcome]) -> Resolution:
    """Resolve as SPEC §3.2 says; never depends on completion order."""
    ordered = sorted(plugins, key=lambda p: (p.priority, p.plugin))
    third_party = [p for p in ordered if p.activated and not p.builtin]
    builtin = [p for p in ordered if p.activated and p.builtin]
    for group in (third_party, builtin):
        if len(group) == 1:
            return Resolution(selected=group[0])
        if len(group) > 1:
            return Resolution(conflict=tuple(p.plugin for p in group))
    return Resolution()


def _plugin_outcomes(events: Iterable[Event], parent: str) -> list[PluginOutcome]:
    prefix = parent + "/"
    started: dict[str, StepStarted] = {}
    ended: dict[str, Event] = {}
    for event in events:
        step = event.step
        if not step.startswith(prefix) or "/" in step[len(prefix) :]:
            continue
        if isinstance(event, StepStarted):
            if event.kind is StepKind.CANDIDATE:
                started[step] = event
        elif isinstance(event, TERMINAL_STEP_EVENTS) and step in started:
            ended[step] = event
    outcomes = []
    for step, start in started.items():
        end = ended.get(step)
        value = end.result if isinstance(end, StepSucceeded) else None
        outcomes.append(_outcome(start.attributes, outcome_of(end) if end else None, value, step))
    return outcomes


def _outcome(
    attributes: Mapping[str, JsonValue], outcome: Outcome | None, value: JsonValue, step: str
) -> PluginOutcome:
    result: Mapping[str, JsonValue] = value if isinstance(value, dict) else {}
    platform_class = result.get("platform_class")
    device = result.get("device")
    priority = attributes.get("priority")
    return PluginOutcome(
        plugin=str(attributes.get("plugin", step.rpartition("/")[2])),
        builtin=attributes.get("builtin") is True,
        priority=priority if isinstance(priority, int) else 0,
        outcome=outcome,
        platform_class=platform_class
        if isinstance(platform_class, str) and result.get("activated") is True
        else None,
        device=device if isinstance(device, str) else None,
    )


def decide_platform(events: Sequence[Event], inputs: Mapping[str, JsonValue]) -> JsonValue:
    """The ``platform.select`` decider: resolve the plugin children of
    ``inputs["parent"]`` (default ``platform``) from their events.

    Returns:
        ``{"plugin", "platform_class"}`` of the selected plugin, or ``None``
        (conflict, or nothing activated).
    """
    parent = str(inputs.get("parent", PLATFORM_STEP))
    selected = resolve_platform(_plugin_outcomes(events, parent)).selected
    if selected is None:
        return None
    return {"plugin": selected.plugin, "platform_class": selected.platform_class}


def _failure_text(result: StepResult) -> str:
    if result.exception is not None:
        return ", caused by ".join(link.reason for link in result.exception.chain())
    return "; ".join(result.reasons) or str(result.outcome)


# --- the step -----------------------------------------------------------------------


def make_platform_step(
    config: EngineConfig,
    *,
    plugins: Mapping[str, PlatformPlugin] | None = None,
    discover: bool = True,
) -> Step:
    """The ``platform`` step.

    Args:
        config: the engine configuration (for the step timeout).
        plugins: third-party plugins to probe besides those registered under
            :data:`PLATFORM_PLUGIN_GROUP`, by name.
        discover: whether to look up the entry-point group at all.

    The step raises :class:`PlatformConflictError` or
    :class:`UnspecifiedPlatformError` (both terminal); a third-party plugin
    whose name is empty, contains ``/``, repeats another's, or is a built-in
    plugin's name is a ValueError.
    """
    extra = dict(plugins or {})
    for name in extra:
        _check_plugin_name(name, (), "given to the engine")

    async def detect_platform(ctx: StepContext) -> JsonValue:
        entry_points = await ctx.to_thread(_entry_points) if discover else []
        specs = _plugin_specs(entry_points, extra)
        results: dict[str, StepResult] = {}

        async def probe(spec: _PluginSpec) -> None:
            results[spec.name] = await ctx.run_child(
                spec.name,
                spec.body,
                kind=StepKind.CANDIDATE,
                policy=ANY_EXCEPTION_POLICY,
                # A plugin's own check; the cpu plugin waits for the other
                # plugins' device queries as long as those plugins may take,
                # then imports zentorch below it: one level more.
                timeout=config.bound(3 if spec.name == "cpu" else 2),
                attributes={
                    "plugin": spec.name,
                    "builtin": spec.builtin,
                    "priority": spec.priority,
                },
            )

        async with anyio.create_task_group() as group:
            for spec in specs:
                group.start_soon(probe, spec)

        ctx.decide("platform.select", {"parent": ctx.step})
        outcomes = [
            _outcome(
                {"plugin": s.name, "builtin": s.builtin, "priority": s.priority},
                results[s.name].outcome,
                results[s.name].value,
                s.name,
            )
            for s in specs
        ]
        resolution = resolve_platform(outcomes)
        if resolution.conflict:
            raise PlatformConflictError(list(resolution.conflict))
        selected = resolution.selected
        if selected is None:
            failed = [results[s.name] for s in specs if results[s.name].outcome is not Outcome.OK]
            error = UnspecifiedPlatformError(
                {r.step.rpartition("/")[2]: _failure_text(r) for r in failed}
            )
            cause = next((r.error for r in failed if r.error is not None), None)
            raise error from cause
        return {
            "plugin": selected.plugin,
            "platform_class": selected.platform_class,
            "device": selected.device,
            "builtin": selected.builtin,
        }

    return Step(
        name=PLATFORM_STEP,
        body=detect_platform,
        policy=PLATFORM_POLICY,
        # Plugins (the cpu plugin's queries, then its zentorch import): each
        # level times out before the one above it.
        timeout=config.bound(4),
    )
