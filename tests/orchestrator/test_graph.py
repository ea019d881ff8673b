"""Graphs: validation before anything runs, scheduling, dependency results."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

import orchestrator
from events import (
    JsonValue,
    MemoryLog,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepFailed,
    StepStarted,
    StepSucceeded,
)
from orchestrator import (
    CycleError,
    DuplicateStepError,
    Graph,
    GraphError,
    Step,
    StepContext,
    Unavailable,
    UnknownDependencyError,
)

from .harness import DEADLINE_S, assert_log_contract, new_log, only, started_steps


async def nothing(ctx: StepContext) -> JsonValue:
    return None


def step(name: str, *depends_on: str) -> Step:
    return Step(name=name, body=nothing, depends_on=depends_on)


async def run(graph: Graph, log: MemoryLog, **options: Any) -> orchestrator.RunResult:
    with anyio.fail_after(DEADLINE_S):
        return await orchestrator.run(graph, log, **options)


# Validation --------------------------------------------------------------------------


def test_duplicate_step_names_are_rejected() -> None:
    with pytest.raises(DuplicateStepError) as raised:
        Graph("g", [step("platform"), step("attention"), step("platform")])
    assert raised.value.step == "platform"
    assert "'platform' is defined twice" in str(raised.value)


def test_an_unknown_dependency_is_rejected_with_the_known_steps() -> None:
    with pytest.raises(UnknownDependencyError) as raised:
        Graph("g", [step("platform"), step("attention", "platfrom")])
    assert raised.value.step == "attention"
    assert raised.value.dependency == "platfrom"
    assert raised.value.known == ("platform", "attention")
    assert "known steps: attention, platform" in str(raised.value)


def test_a_graph_item_that_is_not_a_step_is_named() -> None:
    with pytest.raises(TypeError, match=r"graph 'g': 'platform' is not an orchestrator\.Step"):
        Graph("g", [step("attention"), "platform"])  # type: ignore[list-item]


def test_a_dependency_given_as_a_string_is_named_not_split_into_letters() -> None:
    with pytest.raises(TypeError, match=r"depends_on is 'platform', a string: pass a list"):
        Step(name="attention", body=nothing, depends_on="platform")


def test_a_cycle_is_rejected_and_named() -> None:
    steps = [step("a", "b"), step("b", "c"), step("c", "a"), step("d", "a")]
    with pytest.raises(CycleError) as raised:
        Graph("g", steps)
    assert raised.value.cycle == ("a", "b", "c", "a")
    assert "a -> b -> c -> a" in str(raised.value)
    assert isinstance(raised.value, GraphError)


def test_a_step_depending_on_itself_is_a_cycle() -> None:
    with pytest.raises(CycleError) as raised:
        Graph("g", [step("a"), step("b", "b")])
    assert raised.value.cycle == ("b", "b")


def test_a_cycle_reached_through_a_valid_prefix_names_only_the_cycle() -> None:
    with pytest.raises(CycleError) as raised:
        Graph("g", [step("root", "x"), step("x", "y"), step("y", "x")])
    assert raised.value.cycle == ("x", "y", "x")


@pytest.mark.parametrize("name", ["", "/platform", "platform/", "platform//cpu"])
def test_bad_step_names_are_rejected(name: str) -> None:
    with pytest.raises(ValueError, match="is not a path"):
        Step(name=name, body=nothing)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan")])
def test_a_non_positive_timeout_is_rejected(timeout: float) -> None:
    with pytest.raises(ValueError, match="timeout must be > 0"):
        Step(name="platform", body=nothing, timeout=timeout)


def test_order_respects_dependencies_and_declaration_order() -> None:
    graph = Graph(
        "g",
        [step("attention", "platform"), step("platform"), step("comm"), step("fusion", "comm")],
    )
    order = graph.order
    assert sorted(order) == sorted(graph.steps)
    assert order.index("platform") < order.index("attention")
    assert order.index("comm") < order.index("fusion")
    assert graph.dependents("platform") == ("attention",)


def test_path_names_are_valid_step_names() -> None:
    graph = Graph("g", [step("platform/cpu/zentorch")])
    assert graph["platform/cpu/zentorch"].name == "platform/cpu/zentorch"


# Scheduling --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_independent_steps_run_concurrently() -> None:
    # Each waits for the other to have started: only concurrency lets both finish.
    started = {"a": anyio.Event(), "b": anyio.Event()}

    async def handshake(ctx: StepContext) -> JsonValue:
        started[ctx.step].set()
        other = "b" if ctx.step == "a" else "a"
        await started[other].wait()
        return ctx.step

    graph = Graph("g", [Step(name="a", body=handshake), Step(name="b", body=handshake)])
    log = new_log()

    result = await run(graph, log)

    assert result["a"].value == "a"
    assert result["b"].value == "b"
    assert_log_contract(log)


@pytest.mark.anyio
async def test_a_step_starts_as_soon_as_its_own_dependencies_finish() -> None:
    # "slow" only finishes once "child" has run; "child" depends on "parent"
    # alone. If child waited for slow (or for a whole level), this deadlocks.
    child_ran = anyio.Event()

    async def slow(ctx: StepContext) -> JsonValue:
        await child_ran.wait()
        return "slow"

    async def parent(ctx: StepContext) -> JsonValue:
        return {"device": "cuda"}

    async def child(ctx: StepContext) -> JsonValue:
        child_ran.set()
        return ctx.result("parent")

    graph = Graph(
        "g",
        [
            Step(name="slow", body=slow),
            Step(name="parent", body=parent),
            Step(name="child", body=child, depends_on=["parent"]),
        ],
    )
    log = new_log()

    result = await run(graph, log)

    assert result["child"].value == {"device": "cuda"}
    events = list(log.read())
    parent_done = only(log, StepSucceeded, "parent")
    child_started = only(log, StepStarted, "child")
    slow_done = only(log, StepSucceeded, "slow")
    assert events.index(parent_done) < events.index(child_started) < events.index(slow_done)
    assert child_started.depends_on == ("parent",)
    assert_log_contract(log)


@pytest.mark.anyio
async def test_dependency_results_are_readable_whatever_their_outcome() -> None:
    seen: dict[str, Any] = {}

    def platform(ctx: StepContext) -> JsonValue:
        return {"platform": "cuda", "capability": [9, 0]}

    def zentorch(ctx: StepContext) -> JsonValue:
        ctx.import_module("zentorch_is_not_installed_here")
        return None

    async def fusion(ctx: StepContext) -> Unavailable:
        return Unavailable(outcome=Outcome.INVALID, reasons=("world size 1",))

    async def attention(ctx: StepContext) -> JsonValue:
        seen["platform"] = ctx.result("platform")
        seen["zentorch"] = ctx.dependency("zentorch")
        seen["fusion"] = ctx.dependency("fusion")
        with pytest.raises(KeyError, match="not a dependency of step 'attention'"):
            ctx.dependency("attention")
        return "ok"

    graph = Graph(
        "g",
        [
            Step(name="platform", body=platform),
            Step(name="zentorch", body=zentorch, policy=orchestrator.ANY_EXCEPTION_POLICY),
            Step(name="fusion", body=fusion),
            Step(name="attention", body=attention, depends_on=["platform", "zentorch", "fusion"]),
        ],
    )
    log = new_log()

    result = await run(graph, log)

    assert result["attention"].value == "ok"
    assert seen["platform"] == {"platform": "cuda", "capability": [9, 0]}
    assert seen["zentorch"].outcome is Outcome.UNAVAILABLE
    assert seen["zentorch"].value is None
    assert seen["zentorch"].reasons == (
        "ModuleNotFoundError: No module named 'zentorch_is_not_installed_here'",
    )
    assert seen["zentorch"].exception.module_name == "zentorch_is_not_installed_here"
    assert seen["fusion"].outcome is Outcome.INVALID
    assert seen["fusion"].reasons == ("world size 1",)
    assert_log_contract(log)


@pytest.mark.anyio
async def test_a_propagating_failure_never_starts_its_dependants() -> None:
    error = RuntimeError("CUDA error: no kernel image is available")

    async def platform(ctx: StepContext) -> JsonValue:
        raise error

    graph = Graph(
        "g",
        [
            Step(name="platform", body=platform),
            step("attention", "platform"),
            step("x", "attention"),
        ],
    )
    log = new_log()

    with pytest.raises(RuntimeError) as raised:
        await run(graph, log)

    assert raised.value is error
    assert started_steps(log) == ["platform"]
    assert only(log, RunFinished).failed_step == "platform"
    assert_log_contract(log)


@pytest.mark.anyio
async def test_a_non_json_result_fails_the_step_with_type_error() -> None:
    async def returns_a_set(ctx: StepContext) -> Any:
        return {"cuda", "rocm"}

    graph = Graph("g", [Step(name="platform", body=returns_a_set)])
    log = new_log()

    with pytest.raises(TypeError) as raised:
        await run(graph, log)

    assert "step 'platform' returned set, which is not JSON serialisable" in str(raised.value)
    failed = only(log, StepFailed, "platform")
    assert failed.cause.type == "TypeError"
    assert only(log, RunFinished).outcome is RunOutcome.FAILED
    assert_log_contract(log)


@pytest.mark.anyio
async def test_the_context_exposes_identity_config_host_and_services() -> None:
    seen: dict[str, Any] = {}
    host = object()
    group = object()

    def inspect_context(ctx: StepContext) -> JsonValue:
        seen.update(
            step=ctx.step,
            run_id=ctx.run_id,
            identity=ctx.identity,
            config=dict(ctx.config),
            host=ctx.host,
            group=ctx.services["group"],
            traceparent=ctx.traceparent,
            span_id=ctx.span_id,
            trace_id=ctx.trace_id,
        )
        return None

    identity = RankIdentity(rank=1, local_rank=1, world_size=2, local_world_size=2)
    log = MemoryLog("run-ctx", 1)
    graph = Graph("g", [Step(name="platform/cuda", body=inspect_context)])

    await run(
        graph,
        log,
        identity=identity,
        config={"model": "llama"},
        host=host,
        services={"group": group},
    )

    started = only(log, StepStarted, "platform/cuda")
    assert seen["step"] == "platform/cuda"
    assert seen["run_id"] == "run-ctx"
    assert seen["identity"] == identity
    assert seen["config"] == {"model": "llama"}
    assert seen["host"] is host
    assert seen["group"] is group
    assert seen["span_id"] == started.span_id
    assert seen["trace_id"] == started.trace_id
    assert seen["traceparent"] == f"00-{started.trace_id}-{started.span_id}-01"
    run_started = only(log, RunStarted)
    assert run_started.identity == identity
    assert run_started.config == {"model": "llama"}
    assert run_started.graph == "g"


def test_a_runner_rejects_an_identity_of_another_rank() -> None:
    with pytest.raises(ValueError, match="does not match the log's rank"):
        orchestrator.Runner(new_log(), identity=RankIdentity(rank=1, world_size=2))


def test_a_step_whose_body_cannot_be_called_is_named() -> None:
    with pytest.raises(TypeError, match=r"step 'cache': body is 3, not a function of the step"):
        Step(name="cache", body=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["cache\x1b[2J", "cache\nINFO forged", "cache\u202e"])
def test_a_step_name_with_control_characters_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not a path like"):
        Step(name=name, body=lambda ctx: None)


@pytest.mark.parametrize(
    "outcome",
    [o for o in Outcome if o not in (Outcome.ABSENT, Outcome.UNAVAILABLE, Outcome.INVALID)],
)
def test_a_body_can_end_its_step_absent_unavailable_or_invalid_only(outcome: Outcome) -> None:
    with pytest.raises(ValueError, match=r"Unavailable\.outcome must not be"):
        Unavailable(outcome=outcome)


def test_a_set_up_step_runs_before_every_step_that_depended_on_nothing() -> None:
    graph = Graph(
        "g",
        [
            Step(name="platform", body=nothing),
            Step(name="attention", body=nothing, depends_on=["platform"]),
            Step(name="comm", body=nothing),
        ],
    )

    with_setup = graph.after(Step(name="group", body=nothing))

    assert with_setup.order[0] == "group"
    assert with_setup["platform"].depends_on == ("group",)
    assert with_setup["comm"].depends_on == ("group",)
    assert with_setup["attention"].depends_on == ("platform",)
    assert graph["platform"].depends_on == ()  # the graph itself is unchanged


def test_a_set_up_step_that_depends_on_steps_is_refused() -> None:
    graph = Graph("g", [Step(name="platform", body=nothing)])

    with pytest.raises(ValueError, match="set-up step 'group' cannot depend on other steps"):
        graph.after(Step(name="group", body=nothing, depends_on=["platform"]))
    with pytest.raises(DuplicateStepError):
        graph.after(Step(name="platform", body=nothing))
