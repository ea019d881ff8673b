"""Startup graphs: named steps with dependencies, validated before they run."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from events import JsonValue

from ._context import StepBody
from ._errors import CycleError, DuplicateStepError, UnknownDependencyError
from ._policy import PROBE_POLICY, ErrorPolicy

__all__ = ["Graph", "Isolation", "Step"]


class Isolation(enum.StrEnum):
    """Where a step's body runs.

    ``none``     async bodies on the event loop, blocking ones in a worker
                 thread (abandoned, not waited for, if the step times out);
    ``process``  in a fresh Python subprocess: a segfault, abort or
                 ``os._exit`` there is recorded as ``crashed`` and a hang is
                 killed at the timeout. The body must be a module-level
                 function (it is imported by name in the child).
    """

    NONE = "none"
    PROCESS = "process"


def _step_names(names: Iterable[str]) -> tuple[str, ...]:
    # A typed converter: with the bare ``tuple`` builtin, type checkers see
    # the constructor parameter as an unsolved generic and reject a list.
    if isinstance(names, str):  # not one dependency per letter
        raise TypeError(f"depends_on is {names!r}, a string: pass a list of step names")
    return tuple(names)


def _check_name(_instance: object, _attribute: object, value: str) -> None:
    if not (value and all(value.split("/")) and value.isprintable()):
        raise ValueError(
            f"step name {value!r} is not a path like 'platform' or 'platform/cpu/zentorch' "
            "(printable characters, segments joined by '/')"
        )


def _check_body(instance: Step, _attribute: object, value: Any) -> None:
    if not callable(value):
        raise TypeError(
            f"step {instance.name!r}: body is {value!r}, not a function of the step's context "
            "(def probe(ctx): ... or async def probe(ctx): ...)"
        )


@attrs.frozen(kw_only=True)
class Step:
    """One unit of startup work.

    Attributes:
        name: its path, unique in the graph (``platform/cpu``).
        body: what it does (see :data:`StepBody`).
        depends_on: steps that must finish first; their results are readable
            through the context.
        policy: which exceptions are recorded and which propagate.
        timeout: seconds, or ``None`` for no limit.
        isolation: where the body runs.
        attributes: descriptive facts recorded on the step's span.
    """

    name: str = attrs.field(validator=_check_name)
    body: StepBody = attrs.field(validator=_check_body)
    depends_on: tuple[str, ...] = attrs.field(default=(), converter=_step_names)
    policy: ErrorPolicy = PROBE_POLICY
    timeout: float | None = None
    isolation: Isolation = Isolation.NONE
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.timeout is not None and not self.timeout > 0:
            raise ValueError(f"step {self.name!r}: timeout must be > 0 seconds, not {self.timeout}")


class Graph:
    """A validated set of steps.

    Raises (from the constructor, before anything runs):
        TypeError: an item of ``steps`` is not a :class:`Step`.
        DuplicateStepError: two steps share a name.
        UnknownDependencyError: a dependency names no step.
        CycleError: the dependencies form a cycle (the error names it).
    """

    def __init__(self, name: str, steps: Iterable[Step]) -> None:
        self.name = name
        by_name: dict[str, Step] = {}
        for step in steps:
            if not isinstance(step, Step):
                raise TypeError(f"graph {name!r}: {step!r} is not an orchestrator.Step")
            if step.name in by_name:
                raise DuplicateStepError(step.name)
            by_name[step.name] = step
        for step in by_name.values():
            for dependency in step.depends_on:
                if dependency not in by_name:
                    raise UnknownDependencyError(step.name, dependency, tuple(by_name))
        self._steps = by_name
        self._order = _topological_order(by_name)

    @property
    def steps(self) -> Mapping[str, Step]:
        """Steps by name, in declaration order."""
        return dict(self._steps)

    @property
    def order(self) -> tuple[str, ...]:
        """A dependency-respecting order (declaration order among equals)."""
        return self._order

    def __getitem__(self, name: str) -> Step:
        return self._steps[name]

    def __len__(self) -> int:
        return len(self._steps)

    def after(self, setup: Step) -> Graph:
        """A copy of this graph that runs ``setup`` first: every step that
        depended on nothing now waits for it (a process group every probe
        needs, say).

        Raises:
            DuplicateStepError: the graph already has a step of that name.
            ValueError: ``setup`` itself depends on steps.
        """
        if setup.depends_on:
            raise ValueError(f"set-up step {setup.name!r} cannot depend on other steps")
        steps = [
            step if step.depends_on else attrs.evolve(step, depends_on=(setup.name,))
            for step in self._steps.values()
        ]
        return Graph(self.name, [setup, *steps])

    def dependents(self, name: str) -> tuple[str, ...]:
        """Steps that depend on ``name`` directly."""
        return tuple(s.name for s in self._steps.values() if name in s.depends_on)


def _topological_order(steps: Mapping[str, Step]) -> tuple[str, ...]:
    # Depth-first without recursion. The path is a dict in walking order, so
    # that a cycle can be named; its last step is the one being walked.
    done: dict[str, None] = {}  # each step after its dependencies
    for root in steps:
        path = {root: iter(steps[root].depends_on)}
        while path:
            name = next(reversed(path))
            dependency = next((d for d in path[name] if d not in done), None)
            if dependency is None:
                path.popitem()
                done[name] = None
            elif dependency in path:
                cycle = list(path)
                raise CycleError([*cycle[cycle.index(dependency) :], dependency])
            else:
                path[dependency] = iter(steps[dependency].depends_on)
    return tuple(done)
