"""Timeouts: recorded per policy; stuck worker threads are abandoned."""

from __future__ import annotations

import threading
import time

import anyio
import anyio.to_thread
import attrs
import pytest

import orchestrator
from events import (
    JsonValue,
    Outcome,
    RunFinished,
    RunOutcome,
    StepCancelled,
    StepTimedOut,
)
from orchestrator import PROBE_POLICY, Action, Graph, Step, StepContext, StepTimeoutError

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only

pytestmark = pytest.mark.anyio

TIMEOUT_S = 0.05


async def test_a_blocking_step_that_never_returns_is_abandoned_and_the_run_goes_on() -> None:
    release = threading.Event()
    returned = threading.Event()

    def stuck(ctx: StepContext) -> JsonValue:
        # A driver call that never comes back; nothing can interrupt a thread.
        try:
            release.wait()
        finally:
            returned.set()
        return "late"

    async def after(ctx: StepContext) -> JsonValue:
        return str(ctx.dependency("driver").outcome)

    graph = Graph(
        "g",
        [
            Step(name="driver", body=stuck, timeout=TIMEOUT_S),
            Step(name="after", body=after, depends_on=["driver"]),
        ],
    )
    log = new_log()
    try:
        with anyio.fail_after(DEADLINE_S):
            result = await orchestrator.run(graph, log)
        assert not returned.is_set(), "the run did not wait for the stuck thread"
    finally:
        release.set()
        await anyio.to_thread.run_sync(returned.wait, DEADLINE_S)

    timed_out = only(log, StepTimedOut, "driver")
    assert timed_out.timeout_s == TIMEOUT_S
    assert timed_out.elapsed_ns >= TIMEOUT_S * 1e9
    assert result["driver"].outcome is Outcome.TIMED_OUT
    assert result["driver"].reasons == ("timed out after 0.05 s",)
    assert result["after"].value == "timed_out"
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)


async def test_an_async_step_timing_out_is_recorded() -> None:
    async def waits_forever(ctx: StepContext) -> JsonValue:
        await anyio.sleep_forever()
        return None  # pragma: no cover

    log = new_log()
    began_ns = time.monotonic_ns()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="probe", body=waits_forever, timeout=TIMEOUT_S)]), log
        )
    ended_ns = time.monotonic_ns()

    timed_out = only(log, StepTimedOut, "probe")
    assert timed_out.timeout_s == TIMEOUT_S
    # How long the step ran: at least its timeout, at most the whole run.
    assert TIMEOUT_S * 1e9 <= timed_out.elapsed_ns <= ended_ns - began_ns
    assert result["probe"].outcome is Outcome.TIMED_OUT
    assert not of_type(log, StepCancelled)
    assert_log_contract(log)


async def test_a_child_step_timeout_is_its_own() -> None:
    async def waits_forever(ctx: StepContext) -> JsonValue:
        await anyio.sleep_forever()
        return None  # pragma: no cover

    async def parent(ctx: StepContext) -> JsonValue:
        child = await ctx.run_child("slow", waits_forever, timeout=TIMEOUT_S)
        return str(child.outcome)

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(Graph("g", [Step(name="parent", body=parent)]), log)

    assert result["parent"].value == "timed_out"
    assert only(log, StepTimedOut, "parent/slow").timeout_s == TIMEOUT_S
    assert_log_contract(log)


async def test_a_policy_that_propagates_timeouts_fails_the_run() -> None:
    strict = attrs.evolve(PROBE_POLICY, name="strict", on_timeout=Action.PROPAGATE)
    sibling_running = anyio.Event()

    async def sibling(ctx: StepContext) -> JsonValue:
        sibling_running.set()
        await anyio.sleep_forever()
        return None  # pragma: no cover

    async def waits_forever(ctx: StepContext) -> JsonValue:
        await sibling_running.wait()
        await anyio.sleep_forever()
        return None  # pragma: no cover

    graph = Graph(
        "g",
        [
            Step(name="sibling", body=sibling),
            Step(name="workspace", body=waits_forever, timeout=TIMEOUT_S, policy=strict),
        ],
    )
    log = new_log()

    with pytest.raises(StepTimeoutError) as raised, anyio.fail_after(DEADLINE_S):
        await orchestrator.run(graph, log)

    assert raised.value.step == "workspace"
    assert raised.value.timeout_s == TIMEOUT_S
    assert isinstance(raised.value, TimeoutError)
    assert only(log, StepTimedOut, "workspace").timeout_s == TIMEOUT_S
    assert "'workspace' failed" in only(log, StepCancelled, "sibling").reason
    finished = only(log, RunFinished)
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == "workspace"
    assert finished.cause is not None
    assert finished.cause.name == "StepTimeoutError"
    assert_log_contract(log)
