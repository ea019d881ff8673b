"""Platform resolution (SPEC §3.2) and the engine's decider: which plugin a
rank's platform step selects, recomputed from its events.

Pure: imports only ``events`` and attrs, so replay checks the engine's
recorded decisions without the engine's runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from events import Event, JsonValue, Outcome, StepKind, StepSucceeded, outcome_of
from events._model import child_steps

from ._conventions import PLATFORM_STEP

__all__ = ["ENGINE_DECIDERS", "PluginOutcome", "decide_platform", "resolve_platform"]


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


def resolve_platform(
    plugins: Iterable[PluginOutcome],
) -> tuple[PluginOutcome | None, tuple[str, ...]]:
    """Resolve as SPEC §3.2 says; never depends on completion order.

    Returns:
        ``(selected, conflict)``: the selected plugin, or the activated
        plugins that conflict, or neither (no platform).
    """
    ordered = sorted(plugins, key=lambda p: (p.priority, p.plugin))
    third_party = [p for p in ordered if p.activated and not p.builtin]
    builtin = [p for p in ordered if p.activated and p.builtin]
    for group in (third_party, builtin):
        if len(group) == 1:
            return group[0], ()
        if len(group) > 1:
            return None, tuple(p.plugin for p in group)
    return None, ()


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
    selected, _conflict = resolve_platform(
        _outcome(
            started.attributes,
            outcome_of(end) if end else None,
            end.result if isinstance(end, StepSucceeded) else None,
            started.step,
        )
        for started, end in child_steps(events, parent, StepKind.CANDIDATE)
    )
    if selected is None:
        return None
    return {"plugin": selected.plugin, "platform_class": selected.platform_class}


#: The deciders (each an ``orchestrator.Decider``) the engine's steps call
#: through ``StepContext.decide`` besides the runner's defaults; replay needs
#: them to recompute the engine's decisions.
ENGINE_DECIDERS: Mapping[str, Callable[[Sequence[Event], Mapping[str, JsonValue]], JsonValue]] = {
    "platform.select": decide_platform
}
