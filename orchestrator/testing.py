"""Helpers for testing your own startup graphs.

::

    from orchestrator import Graph, Step
    from orchestrator.testing import faults, raise_, run_captured

    async def test_my_probe_survives_a_broken_cache():
        plan = faults(raise_("my_kernels", PermissionError, 13, "Permission denied", "/cache"))
        captured = await run_captured(my_graph, faults=plan)
        assert captured.error is None
        assert captured.outcomes()["kernels"] == "unavailable"

Everything here goes through the same importer and fault plans as
production runs; nothing patches ``builtins``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import attrs

from events import Event, MemoryLog, Outcome, RunFinished, outcome_of

from ._faults import Fault, FaultAction, FaultPlan, parse_ranks
from ._graph import Graph
from ._runner import Runner, RunResult

__all__ = ["Captured", "crash", "faults", "hang", "raise_", "run_captured"]

E = TypeVar("E", bound=Event)


def _ranks(ranks: str | Iterable[int] | None) -> frozenset[int] | None:
    if ranks is None:
        return None
    if isinstance(ranks, str):
        return parse_ranks(ranks)
    return frozenset(ranks)


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
        ValueError: ``exception`` is not a builtin exception class (faults
            are data and only name builtins).
    """
    import builtins

    if getattr(builtins, exception.__name__, None) is not exception:
        raise ValueError(f"{exception.__name__} is not a builtin exception; faults name builtins")
    return Fault(
        target=target,
        action=FaultAction.RAISE,
        exception=exception.__name__,
        args=tuple(args),
        kwargs=dict(kwargs),
        ranks=_ranks(ranks),
    )


def hang(target: str, *, ranks: str | Iterable[int] | None = None) -> Fault:
    """A fault that never returns (until the run ends): exercises timeouts."""
    return Fault(target=target, action=FaultAction.HANG, ranks=_ranks(ranks))


def crash(target: str, *, ranks: str | Iterable[int] | None = None) -> Fault:
    """A fault that kills the process: use it on process-isolated steps."""
    return Fault(target=target, action=FaultAction.CRASH, ranks=_ranks(ranks))


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
        found: dict[str, Outcome] = {}
        for event in self.events:
            outcome = outcome_of(event)
            if outcome is not None:
                found[event.step] = outcome
        return found

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
    cancellation, which always propagates."""
    log = MemoryLog(run_id, rank)
    result: RunResult | None = None
    error: BaseException | None = None
    try:
        result = await Runner(log, **options).run(graph)
    except Exception as exc:
        error = exc
    except (KeyboardInterrupt, SystemExit) as exc:
        error = exc
    return Captured(result=result, error=error, events=log.events)
