"""Fallback chains: attempts in order, attempt-phase vs terminal outcomes."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import orchestrator
from events import (
    DecisionMade,
    JsonValue,
    MemoryLog,
    Outcome,
    RunFinished,
    RunOutcome,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepUnavailable,
)
from orchestrator import Attempt, ChainResult, Graph, Step, StepContext, Unavailable
from orchestrator._decisions import check_decisions

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only, started_steps

pytestmark = pytest.mark.anyio


def chain_graph(attempts: list[Attempt]) -> tuple[Graph, list[ChainResult]]:
    chains: list[ChainResult] = []

    async def allreduce(ctx: StepContext) -> JsonValue:
        chain = await orchestrator.run_fallback_chain(ctx, attempts)
        chains.append(chain)
        return chain.backend

    return Graph("g", [Step(name="allreduce", body=allreduce)]), chains


async def run(graph: Graph, log: MemoryLog) -> orchestrator.RunResult:
    with anyio.fail_after(DEADLINE_S):
        return await orchestrator.run(graph, log)


def no_nvlink(ctx: StepContext) -> JsonValue:
    raise OSError("custom all-reduce needs NVLink")


def workspace(ctx: StepContext) -> JsonValue:
    return {"workspace_bytes": 1 << 20}


async def test_the_first_attempt_fails_and_the_second_works() -> None:
    graph, chains = chain_graph(
        [Attempt(name="custom", body=no_nvlink), Attempt(name="nccl", body=workspace)]
    )
    log = new_log()

    result = await run(graph, log)

    assert result["allreduce"].value == "nccl"
    (chain,) = chains
    assert chain.backend == "nccl"
    assert not chain.exhausted
    assert chain.value == {"workspace_bytes": 1 << 20}
    assert [(a.step, a.outcome) for a in chain.attempts] == [
        ("allreduce/custom", Outcome.UNAVAILABLE),
        ("allreduce/nccl", Outcome.OK),
    ]
    assert only(log, StepUnavailable, "allreduce/custom").reasons == (
        "OSError: custom all-reduce needs NVLink",
    )
    assert only(log, StepSucceeded, "allreduce/nccl").result == {"workspace_bytes": 1 << 20}
    first = only(log, StepStarted, "allreduce/custom")
    second = only(log, StepStarted, "allreduce/nccl")
    assert first.kind is second.kind is StepKind.ATTEMPT
    assert first.attributes == {
        "backend": "custom",
        "attempt": 0,
        "attempts": 2,
        "fallback_left": True,
    }
    assert second.attributes == {
        "backend": "nccl",
        "attempt": 1,
        "attempts": 2,
        "fallback_left": False,
    }
    decision = only(log, DecisionMade)
    assert (decision.name, decision.value) == ("fallback.result", "nccl")
    assert check_decisions(log.read()) == []
    assert_log_contract(log)


async def test_attempts_after_the_one_that_works_do_not_run() -> None:
    graph, chains = chain_graph(
        [
            Attempt(name="custom", body=workspace),
            Attempt(name="nccl", body=workspace),
        ]
    )
    log = new_log()

    await run(graph, log)

    assert chains[0].backend == "custom"
    assert started_steps(log) == ["allreduce", "allreduce/custom"]


async def test_every_attempt_failing_exhausts_the_chain() -> None:
    async def declines(ctx: StepContext) -> Unavailable:
        return Unavailable(outcome=Outcome.INVALID, reasons=("world size 1",))

    graph, chains = chain_graph(
        [
            Attempt(name="custom", body=no_nvlink),
            Attempt(name="symm_mem", body=declines),
            Attempt(name="nccl", body=no_nvlink),
        ]
    )
    log = new_log()

    result = await run(graph, log)

    (chain,) = chains
    assert chain.exhausted
    assert chain.backend is None
    assert chain.value is None
    assert [a.outcome for a in chain.attempts] == [
        Outcome.UNAVAILABLE,
        Outcome.INVALID,
        Outcome.UNAVAILABLE,
    ]
    assert result["allreduce"].value is None
    assert only(log, DecisionMade).value is None
    last = only(log, StepStarted, "allreduce/nccl")
    assert last.attributes["fallback_left"] is False
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)


async def test_a_propagating_error_in_an_attempt_propagates() -> None:
    error = TypeError("type 'array.array' is not subscriptable")

    def broken(ctx: StepContext) -> JsonValue:
        raise error

    graph, chains = chain_graph(
        [Attempt(name="custom", body=broken), Attempt(name="nccl", body=workspace)]
    )
    log = new_log()

    with pytest.raises(TypeError) as raised:
        await run(graph, log)

    assert raised.value is error
    assert not chains
    assert started_steps(log) == ["allreduce", "allreduce/custom"]
    assert only(log, StepFailed, "allreduce/custom").cause.type == "TypeError"
    assert only(log, StepFailed, "allreduce").cause.type == "TypeError"
    assert only(log, RunFinished).failed_step == "allreduce/custom"
    assert not of_type(log, DecisionMade)
    assert_log_contract(log)


async def test_an_empty_chain_is_a_value_error() -> None:
    graph, _ = chain_graph([])
    with pytest.raises(ValueError, match="at least one attempt"):
        await run(graph, new_log())


async def test_an_attempt_may_carry_extra_attributes() -> None:
    def with_attributes(ctx: StepContext) -> Any:
        return True

    graph, _ = chain_graph(
        [Attempt(name="nccl", body=with_attributes, attributes={"world_size": 8})]
    )
    log = new_log()
    await run(graph, log)
    assert only(log, StepStarted, "allreduce/nccl").attributes["world_size"] == 8


async def test_repeated_attempt_names_are_a_value_error() -> None:
    graph, _ = chain_graph(
        [Attempt(name="nccl", body=workspace), Attempt(name="nccl", body=workspace)]
    )
    log = new_log()
    with pytest.raises(ValueError, match="unique names; repeated: \\['nccl'\\]"):
        await run(graph, log)
    assert started_steps(log) == ["allreduce"]
