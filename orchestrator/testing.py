"""Helpers for testing your own startup graphs.

::

    from orchestrator import Graph, Step
    from orchestrator.testing import faults, raise_, run_captured

    async def test_my_probe_survives_a_broken_cache():
        plan = faults(raise_("my_kernels", PermissionError, 13, "Permission denied", "/cache"))
        captured = await run_captured(my_graph, faults=plan)
        assert captured.error is None
        assert captured.outcomes()["kernels"] == "unavailable"

A fake host answers the probes' imports (and, through ``ctx.host``, their
questions about the machine) the way a simulated host profile answers the
reference engine's, so a graph can be tested against a machine the test
machine is not::

    import types
    from orchestrator.testing import fake_host, run_captured

    async def test_my_probe_on_a_host_without_kernels():
        host = fake_host({
            "my_kernels": None,                                   # not installed
            "my_kernels_v2": OSError("libkernels.so: cannot open shared object"),
            "my_runtime": types.ModuleType("my_runtime"),         # imports this
        })
        captured = await run_captured(my_graph, host=host)
        assert captured.outcomes()["kernels"] == "absent"

    # On top of another importer: this interpreter's, or a host profile's.
    from orchestrator import RealImporter
    from orchestrator.engine import SimulatedHost, SimulatedImporter, load_profile

    host = fake_host({"my_kernels": None}, base=RealImporter())
    zen4 = load_profile("zen4")
    host = fake_host(
        {"zentorch": OSError("undefined symbol")},
        base=SimulatedImporter(zen4),
        facts=SimulatedHost(zen4),
        name="zen4",
    )

Everything here goes through the same importer and fault plans as
production runs; nothing patches ``builtins``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any, TypeVar

import attrs

from events import Event, MemoryLog, Outcome, RunFinished, outcome_of

from ._faults import BUILTIN_EXCEPTIONS, Fault, FaultAction, FaultPlan
from ._graph import Graph
from ._importer import Importer, TableImporter
from ._runner import Runner, RunResult

__all__ = ["Captured", "FakeHost", "crash", "fake_host", "faults", "hang", "raise_", "run_captured"]

E = TypeVar("E", bound=Event)


def raise_(
    target: str,
    exception: type[BaseException],
    *args: str | int | float | bool | None,
    ranks: str | Iterable[int] | None = None,
    **kwargs: str,
) -> Fault:
    """A fault raising ``exception(*args, **kwargs)`` when ``target`` (a module
    or a step path) is imported or run, on ``ranks`` (default: all).

    Raises:
        ValueError: ``exception`` is not a builtin exception class (an
            instance, or a class of your own: faults are data and only name
            builtins).
    """
    name = getattr(exception, "__name__", repr(exception))  # an instance has none
    if BUILTIN_EXCEPTIONS.get(name) is not exception:
        raise ValueError(
            f"{name} is not a builtin exception class; faults name builtins "
            "(raise_(target, OSError, *args))"
        )
    return Fault(target=target, exception=name, args=args, kwargs=kwargs, ranks=ranks)


def hang(target: str, *, ranks: str | Iterable[int] | None = None) -> Fault:
    """A fault that never returns (until the run ends): exercises timeouts."""
    return Fault(target=target, action=FaultAction.HANG, ranks=ranks)


def crash(target: str, *, ranks: str | Iterable[int] | None = None) -> Fault:
    """A fault that kills the process: use it on process-isolated steps."""
    return Fault(target=target, action=FaultAction.CRASH, ranks=ranks)


def faults(*items: Fault) -> FaultPlan:
    """A fault plan of ``items``, first match wins."""
    return FaultPlan(faults=tuple(items))


@attrs.frozen(kw_only=True)
class Captured:
    """A finished run: its result or error, and every event it wrote."""

    result: RunResult | None
    error: BaseException | None
    events: tuple[Event, ...]

    def of_type(self, cls: type[E]) -> list[E]:
        """The events of one type, in order."""
        return [event for event in self.events if isinstance(event, cls)]

    def outcomes(self) -> Mapping[str, Outcome]:
        """Each step's outcome by path (children included)."""
        ended = ((event.step, outcome_of(event)) for event in self.events)
        return {step: outcome for step, outcome in ended if outcome is not None}

    def for_step(self, step: str) -> list[Event]:
        """The events of one step."""
        return [event for event in self.events if event.step == step]

    @property
    def finished(self) -> RunFinished:
        """The run's final event."""
        last = self.events[-1]
        assert isinstance(last, RunFinished), f"the run did not finish: last event {last.TYPE}"
        return last


async def run_captured(
    graph: Graph, *, run_id: str = "test-run", rank: int = 0, **options: Any
) -> Captured:
    """Run ``graph`` into a fresh in-memory log and capture the outcome;
    never raises what the run raised (it is in ``Captured.error``), except
    cancellation, which always propagates.

    ``options`` go to :class:`~orchestrator.Runner` (``faults``,
    ``identity``, ``deciders``...). ``host`` may be a :class:`FakeHost`:
    its importer answers the probes' imports, its facts are ``ctx.host``,
    and ``run.started`` records the run as simulated on it.

    Raises:
        TypeError: ``host`` is a :class:`FakeHost` and ``importer`` is given
            too (the fake host is the importer).
    """
    host = options.get("host")
    if isinstance(host, FakeHost):
        if options.get("importer") is not None:
            raise TypeError("run_captured() takes a FakeHost or an importer, not both")
        options.update(importer=host.importer, host=host.facts)
        options.setdefault("simulated", host.name)
    log = MemoryLog(run_id, rank)
    try:
        result = await Runner(log, **options).run(graph)
    except (Exception, KeyboardInterrupt, SystemExit) as exc:
        return Captured(result=None, error=exc, events=log.events)
    return Captured(result=result, error=None, events=log.events)


# --- a fake host ---------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class FakeHost:
    """A simulated machine for :func:`run_captured` (build one with
    :func:`fake_host`).

    Attributes:
        name: how ``run.started`` names the simulated host.
        importer: answers the probes' imports (``ctx.import_module``,
            ``ctx.find_spec``).
        facts: what steps see as ``ctx.host`` (any object your probes ask
            about the machine, such as the reference engine's
            :class:`~orchestrator.engine.SimulatedHost`).
    """

    name: str
    importer: Importer
    facts: Any = None


def fake_host(
    modules: Mapping[str, ModuleType | BaseException | None] | None = None,
    *,
    base: Importer | None = None,
    facts: Any = None,
    name: str = "fake",
) -> FakeHost:
    """A fake host whose imports answer from ``modules``.

    ``modules`` maps a module name (``my_kernels``, ``pkg.sub``) to the
    module an import returns, the exception an import raises (a copy of it,
    each time) or ``None`` for a module that is not installed
    (``ModuleNotFoundError``, and ``find_spec`` returns ``None``). As with
    importlib, importing ``pkg.sub`` imports ``pkg`` first: a ``pkg`` that
    raises or is missing breaks ``pkg.sub`` too, and a ``pkg`` not listed is
    an empty package.

    Modules not listed are not installed, unless ``base`` answers them: an
    :class:`~orchestrator.Importer` such as :class:`~orchestrator.RealImporter`
    (this interpreter's modules) or the reference engine's
    ``SimulatedImporter`` of a host profile (its device facts and modules,
    as ``--simulate`` serves them). ``facts`` is what steps see as
    ``ctx.host``; ``name`` is how ``run.started`` names the simulated host.

    Faults given to :func:`run_captured` fire in front of this importer as
    in front of a real one. A process-isolated step imports through
    ``base`` in its process (when ``base`` can be rebuilt there), never
    through ``modules``, which do not cross processes: with ``modules``
    given, such a step fails with :class:`TypeError`.

    Raises:
        TypeError: a ``modules`` value is none of the three answers.
    """
    answers = dict(modules or {})
    for module, answer in answers.items():
        if not (answer is None or isinstance(answer, ModuleType | BaseException)):
            raise TypeError(
                f"fake_host() module {module!r}: expected a module, an exception or None, "
                f"not {type(answer).__name__}"
            )
    return FakeHost(name=name, importer=TableImporter(answers, base), facts=facts)
