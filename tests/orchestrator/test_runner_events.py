"""The projections over events the real runner writes (not hand-built)."""

from __future__ import annotations

import contextlib

import pytest

from events import JsonValue, MemoryLog, StepFailed
from events import replay as replay_events
from orchestrator import Graph, Runner, Step, StepContext

pytestmark = pytest.mark.anyio


#: What the probe below fails with: one object, that a parent may raise again.
PROBE_ERROR = ValueError("no such setting")


def failing_probe(_context: StepContext) -> JsonValue:
    raise PROBE_ERROR


async def caught_and_raised_again(context: StepContext) -> JsonValue:
    # As the recording of a real engine does: the child's failure is caught
    # (the parent goes on), and the engine's code later lets the very same
    # exception leave the parent too.
    with contextlib.suppress(Exception):
        await context.run_child("probe", failing_probe)
    raise PROBE_ERROR


async def caught_and_replaced(context: StepContext) -> JsonValue:
    with contextlib.suppress(Exception):
        await context.run_child("probe", failing_probe)
    raise RuntimeError("the probe gave up") from PROBE_ERROR


@pytest.mark.parametrize(
    ("body", "origin"),
    [(caught_and_raised_again, "outer/probe"), (caught_and_replaced, "outer")],
)
async def test_a_failure_records_the_step_it_started_at(body: object, origin: str) -> None:
    # Raising a child's own exception again goes on with the child's
    # failure; raising a new one (even "from" it) starts a failure here.
    log = MemoryLog("origins", 0)
    with pytest.raises(ValueError if origin != "outer" else RuntimeError):
        await Runner(log).run(Graph("mine", [Step(name="outer", body=body)]))  # type: ignore[arg-type]

    failed = {e.step: e for e in log.events if isinstance(e, StepFailed)}
    assert failed["outer/probe"].origin == "outer/probe"
    assert failed["outer"].origin == origin
    cause = replay_events(log.events).root_cause
    assert cause is not None
    assert cause.step == origin
