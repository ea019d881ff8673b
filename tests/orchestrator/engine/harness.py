"""What the engine tests share: running the engine graph into a captured log
and picking events out of it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import anyio
import attrs

from events import (
    TERMINAL_STEP_EVENTS,
    DecisionMade,
    Event,
    MemoryLog,
    Outcome,
    RunFinished,
    StepStarted,
    outcome_of,
)
from orchestrator import FaultPlan, RunResult
from orchestrator.engine import EngineConfig, Profile, load_profile, prepare_engine

E = TypeVar("E", bound=Event)

#: Upper bound for one engine run in these tests: a run that takes longer is
#: hung, and failing beats blocking the suite.
DEADLINE_S = 30.0


@attrs.frozen(kw_only=True)
class EngineRun:
    """A finished engine run: its result or the error it raised, and its log."""

    log: MemoryLog
    result: RunResult | None
    error: BaseException | None

    @property
    def events(self) -> list[Event]:
        """Every event, in log order."""
        return list(self.log.read())

    def of_type(self, cls: type[E], step: str | None = None) -> list[E]:
        """The events of type ``cls`` (of ``step``, if given)."""
        return [e for e in self.events if isinstance(e, cls) and (step is None or e.step == step)]

    def started(self, step: str) -> StepStarted:
        """The ``step.started`` event of ``step`` (exactly one)."""
        found = self.of_type(StepStarted, step)
        assert len(found) == 1, f"expected one start of {step!r}, found {found}"
        return found[0]

    def terminal(self, step: str) -> Event:
        """The terminal event of ``step`` (exactly one)."""
        found = [e for e in self.events if isinstance(e, TERMINAL_STEP_EVENTS) and e.step == step]
        assert len(found) == 1, f"expected one terminal event for {step!r}, found {found}"
        return found[0]

    def outcome(self, step: str) -> Outcome | None:
        """How ``step`` ended."""
        return outcome_of(self.terminal(step))

    def steps(self, prefix: str = "") -> list[str]:
        """The steps that started under ``prefix``, in log order."""
        return [e.step for e in self.of_type(StepStarted) if e.step.startswith(prefix)]

    def decision(self, name: str) -> DecisionMade:
        """The single ``decision.made`` event named ``name``."""
        found = [e for e in self.of_type(DecisionMade) if e.name == name]
        assert len(found) == 1, f"expected one decision {name!r}, found {found}"
        return found[0]

    @property
    def finished(self) -> RunFinished:
        """The run's final event."""
        last = self.events[-1]
        assert isinstance(last, RunFinished), f"the run did not finish: last event {last.TYPE}"
        return last

    def value(self, step: str) -> Any:
        """The JSON result of top-level ``step`` (the run must be ready)."""
        assert self.result is not None, f"the run failed: {self.error!r}"
        return self.result[step].value


def plan(faults: FaultPlan | Sequence[str] | None) -> FaultPlan | None:
    """A fault plan from specs like ``zentorch=OSError:message``."""
    if faults is None or isinstance(faults, FaultPlan):
        return faults
    return FaultPlan.parse(faults)


async def run(
    profile: str | Profile | None,
    *,
    config: EngineConfig | None = None,
    faults: FaultPlan | Sequence[str] | None = None,
    **options: Any,
) -> EngineRun:
    """Run the engine graph on ``profile`` (a built-in name, a profile, or
    ``None`` for the real host) and capture it. What the run raised is kept
    in ``error`` (cancellation still propagates)."""
    if isinstance(profile, str):
        profile = load_profile(profile)
    log = MemoryLog("engine-test", 0)
    result: RunResult | None = None
    error: BaseException | None = None
    with anyio.fail_after(DEADLINE_S):
        try:
            runner, graph = prepare_engine(
                config or EngineConfig(), log, profile=profile, faults=plan(faults), **options
            )
            result = await runner.run(graph)
        except Exception as exc:
            error = exc
        except (KeyboardInterrupt, SystemExit) as exc:
            error = exc
    return EngineRun(log=log, result=result, error=error)
