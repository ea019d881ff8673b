"""The runner's guarantees: the log contract, cancellation from outside,
flushing before an error leaves, trace ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

import orchestrator
from events import (
    DecisionMade,
    Event,
    JsonlLog,
    JsonValue,
    MemoryLog,
    Redactor,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepCancelled,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    read_log,
)
from orchestrator import (
    Attempt,
    Candidate,
    Graph,
    Step,
    StepContext,
    run_fallback_chain,
    select_candidate,
)
from orchestrator._decisions import check_decisions
from orchestrator._runner import derive_trace_id

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only

pytestmark = pytest.mark.anyio


def nested_graph() -> Graph:
    """Top-level steps with candidate, attempt and plain child steps under them."""

    async def attention(ctx: StepContext) -> JsonValue:
        def fits(ctx: StepContext) -> list[str]:
            return []

        def broken(ctx: StepContext) -> list[str]:
            raise ImportError("flashinfer is not installed")

        candidates = [
            Candidate(name="FLASH_ATTN", priority=1, probe=fits),
            Candidate(name="FLASHINFER", priority=0, probe=broken),
        ]
        return (await select_candidate(ctx, candidates)).selected

    async def allreduce(ctx: StepContext) -> JsonValue:
        def unavailable(ctx: StepContext) -> JsonValue:
            raise OSError("no NVLink")

        def works(ctx: StepContext) -> JsonValue:
            return {"workspace": 1}

        chain = await run_fallback_chain(
            ctx, [Attempt(name="custom", body=unavailable), Attempt(name="nccl", body=works)]
        )
        return chain.backend

    async def platform(ctx: StepContext) -> JsonValue:
        async def cuda(ctx: StepContext) -> JsonValue:
            return "cuda"

        child = await ctx.run_child("cuda", cuda)
        return child.value

    return Graph(
        "nested",
        [
            Step(name="platform", body=platform),
            Step(name="attention", body=attention, depends_on=["platform"]),
            Step(name="allreduce", body=allreduce, depends_on=["platform"]),
        ],
    )


async def test_the_log_of_a_nested_run_keeps_the_contract() -> None:
    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(nested_graph(), log)

    assert result.outcome is RunOutcome.READY
    assert result["attention"].value == "FLASH_ATTN"
    assert result["allreduce"].value == "nccl"
    assert result["platform"].value == "cuda"
    assert result.trace_id == derive_trace_id("run-test")
    assert_log_contract(log)
    root = only(log, RunStarted).span_id
    spans = {e.step: e for e in of_type(log, StepStarted)}
    assert spans["platform"].parent_span_id == root
    assert spans["platform/cuda"].parent_span_id == spans["platform"].span_id
    assert spans["attention/FLASHINFER"].parent_span_id == spans["attention"].span_id
    assert spans["attention/FLASHINFER"].kind is StepKind.CANDIDATE
    assert spans["allreduce/nccl"].parent_span_id == spans["allreduce"].span_id
    assert spans["allreduce/nccl"].kind is StepKind.ATTEMPT
    assert only(log, RunFinished).parent_span_id is None


async def test_a_given_trace_id_and_launcher_span_are_used() -> None:
    log = new_log()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(
            nested_graph(), log, trace_id=trace_id, parent_span_id="00f067aa0ba902b7"
        )

    assert_log_contract(log, trace_id=trace_id)
    assert only(log, RunStarted).parent_span_id == "00f067aa0ba902b7"
    assert only(log, RunFinished).parent_span_id == "00f067aa0ba902b7"


async def test_a_runner_runs_once_so_a_log_holds_one_run() -> None:
    log = new_log()
    runner = orchestrator.Runner(log)
    with anyio.fail_after(DEADLINE_S):
        await runner.run(nested_graph())
        events_after_first = len(log.events)
        with pytest.raises(RuntimeError, match="already ran"):
            await runner.run(nested_graph())

    assert len(log.events) == events_after_first
    assert_log_contract(log)


def test_the_derived_trace_id_is_stable_hex_and_per_run() -> None:
    trace_id = derive_trace_id("20261129T083704-1a2b3c")
    assert len(trace_id) == 32
    assert set(trace_id) <= set("0123456789abcdef")
    assert trace_id == derive_trace_id("20261129T083704-1a2b3c")
    assert trace_id != derive_trace_id("20261129T083704-1a2b3d")


async def test_a_fixed_clock_stamps_every_event() -> None:
    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(nested_graph(), log, clock=lambda: (1_000, 2_000))
    assert {(e.wall_ns, e.mono_ns) for e in log.read()} == {(1_000, 2_000)}


async def test_cancelling_the_run_from_outside_records_interrupted_and_reraises() -> None:
    running = {name: anyio.Event() for name in ("platform", "attention/FLASH_ATTN", "comm")}
    log = new_log()
    reraised: list[BaseException] = []

    async def park(ctx: StepContext) -> JsonValue:
        running[ctx.step].set()
        await anyio.sleep_forever()
        return None  # pragma: no cover

    async def parked_probe(ctx: StepContext) -> list[str]:
        await park(ctx)
        return []  # pragma: no cover

    async def attention(ctx: StepContext) -> JsonValue:
        selection = await select_candidate(
            ctx, [Candidate(name="FLASH_ATTN", priority=0, probe=parked_probe)]
        )
        return selection.selected  # pragma: no cover

    graph = Graph(
        "g",
        [
            Step(name="platform", body=park),
            Step(name="attention", body=attention),
            Step(name="comm", body=park),
            Step(name="fusion", body=park, depends_on=["comm"]),
        ],
    )

    async def run_and_watch() -> None:
        try:
            await orchestrator.run(graph, log)
        except anyio.get_cancelled_exc_class() as cancelled:
            reraised.append(cancelled)
            raise

    with anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as group:
            group.start_soon(run_and_watch)
            for event in running.values():
                await event.wait()
            group.cancel_scope.cancel()

    assert len(reraised) == 1
    cancelled = {e.step: e for e in of_type(log, StepCancelled)}
    assert set(cancelled) == {"platform", "attention", "attention/FLASH_ATTN", "comm"}
    assert {e.reason for e in cancelled.values()} == {"the run was cancelled"}
    assert "fusion" not in {e.step for e in of_type(log, StepStarted)}
    finished = only(log, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is None
    assert list(log.read())[-1] == finished
    assert_log_contract(log)


class FlushWatchingLog(MemoryLog):
    """Remembers how many events the log held at each flush."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id, 0)
        self.flushed_at: list[int] = []

    def flush(self) -> None:
        self.flushed_at.append(self.next_seq)


async def test_the_failure_and_the_final_event_are_flushed_before_the_error_leaves() -> None:
    sibling_running = anyio.Event()

    async def sibling(ctx: StepContext) -> JsonValue:
        sibling_running.set()
        await anyio.sleep_forever()
        return None  # pragma: no cover

    async def broken(ctx: StepContext) -> JsonValue:
        await sibling_running.wait()
        raise AttributeError("module has no attribute 'get_builder_cls'")

    graph = Graph("g", [Step(name="sibling", body=sibling), Step(name="broken", body=broken)])
    log = FlushWatchingLog("run-flush")

    with pytest.raises(AttributeError), anyio.fail_after(DEADLINE_S):
        await orchestrator.run(graph, log)

    failed = only(log, StepFailed, "broken")
    finished = only(log, RunFinished)
    # Flushed right after the failure was recorded (before siblings were
    # cancelled), and again after the final event.
    assert failed.seq + 1 in log.flushed_at
    assert log.flushed_at[-1] == finished.seq + 1
    assert_log_contract(log)


async def test_a_failed_run_leaves_a_complete_replayable_file(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"

    async def broken(ctx: StepContext) -> JsonValue:
        raise RuntimeError("CUDA error: no kernel image is available")

    graph = Graph(
        "g",
        [
            Step(name="attention", body=nested_graph()["attention"].body),
            Step(name="b", body=broken),
        ],
    )
    with JsonlLog(path, run_id="run-file", durability="always") as log:
        with pytest.raises(RuntimeError), anyio.fail_after(DEADLINE_S):
            await orchestrator.run(graph, log)
        contents = read_log(path)  # read before close: what a crash would leave

    events: list[Event] = list(contents.events)
    assert contents.torn_tail is None
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.FAILED
    assert events[-1].cause is not None
    assert events[-1].cause.message == "CUDA error: no kernel image is available"
    assert len(events) == len(list(log.read()))
    assert check_decisions(events) == []


async def test_a_decision_needs_a_registered_decider() -> None:
    async def decides(ctx: StepContext) -> JsonValue:
        with pytest.raises(KeyError, match=r"no decider named 'nope'; registered: .*count"):
            ctx.decide("nope")
        return ctx.decide("count", {"of": "steps"})

    def count(events: Any, inputs: Any) -> JsonValue:
        return sum(isinstance(e, StepStarted) for e in events)

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="d", body=decides)]), log, deciders={"count": count}
        )

    assert result["d"].value == 1
    decision = only(log, DecisionMade)
    assert (decision.name, decision.value, decision.inputs) == ("count", 1, {"of": "steps"})
    assert check_decisions(log.read(), {"count": count}) == []


async def test_a_child_started_again_under_the_same_path_is_refused() -> None:
    # A path names one step of a run: a retry under the same name would make
    # two steps of one path, which no projection could tell apart.
    async def retries(ctx: StepContext) -> JsonValue:
        first = await ctx.run_child("connect", lambda ctx: "up")
        with pytest.raises(orchestrator.DuplicateStepError) as refused:
            await ctx.run_child("connect", lambda ctx: "up again")
        assert (refused.value.step, refused.value.child) == ("retry/connect", True)
        assert "give each child of 'retry' its own name" in str(refused.value)
        await ctx.run_child("connect-2", lambda ctx: "up again")
        return first.value

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(Graph("g", [Step(name="retry", body=retries)]), log)

    assert result["retry"].value == "up"
    started = [e.step for e in of_type(log, StepStarted)]
    assert started == ["retry", "retry/connect", "retry/connect-2"]
    assert_log_contract(log)


async def test_an_uncaught_repeated_child_fails_its_parent_with_the_error() -> None:
    async def repeats(ctx: StepContext) -> JsonValue:
        await ctx.run_child("probe", lambda ctx: 1)
        await ctx.run_child("probe", lambda ctx: 2)
        return None

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        with pytest.raises(orchestrator.DuplicateStepError):
            await orchestrator.run(Graph("g", [Step(name="p", body=repeats)]), log)

    failed = only(log, StepFailed, "p")
    assert failed.cause.type == "orchestrator.DuplicateStepError"
    assert "step 'p/probe' already ran in this run" in failed.cause.message


async def test_the_callers_and_the_steps_values_are_recorded_redacted() -> None:
    # A secret of the run's redactor, and a URL's password, passed in by the
    # caller and returned by steps: recorded hidden; the steps still see
    # and return the values themselves.
    secret = "planted-s3cret-value"
    url = f"https://user:{secret}x@hub.example/v1"

    async def connect(ctx: StepContext) -> JsonValue:
        assert ctx.config["token"] == secret
        child = await ctx.run_child("login", lambda _: {"endpoint": url}, attributes={"to": url})
        ctx.record_decision("endpoint.pick", url, {"offered": [url, secret]})
        return {"token": secret, "via": child.value}

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="connect", body=connect)]),
            log,
            config={"token": secret, secret: [url]},
            redactor=Redactor(secrets=(secret,)),
        )

    assert result["connect"].value == {"token": secret, "via": {"endpoint": url}}
    recorded = repr(log.events)
    assert secret not in recorded
    assert "user:" not in recorded
    assert only(log, RunStarted).config == {
        "token": "[REDACTED]",
        "[REDACTED]": ["https://[REDACTED]@hub.example/v1"],
    }
    assert only(log, StepSucceeded, "connect").result == {
        "token": "[REDACTED]",
        "via": {"endpoint": "https://[REDACTED]@hub.example/v1"},
    }
    assert_log_contract(log)


def test_a_run_abandoned_after_a_stop_records_the_stop_as_its_cause() -> None:
    # A stop that came during the caller's set-up is why the run ended, not
    # the error it left the set-up with.
    log = new_log()
    runner = orchestrator.Runner(log)
    runner.begin(nested_graph())
    runner.stopping(orchestrator.StartupInterrupted(signal="SIGTERM", reason="its launcher exited"))
    runner.abandon(RuntimeError("tracing set-up was cut short"))

    finished = only(log, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.type == "orchestrator.StartupInterrupted"
    assert finished.cause.message == "received SIGTERM: its launcher exited"
    assert finished.stop is not None
    assert finished.stop.signal == "SIGTERM"


def test_a_runner_that_began_one_graph_refuses_to_begin_another() -> None:
    log = new_log()
    runner = orchestrator.Runner(log)
    graph = nested_graph()
    runner.begin(graph)
    runner.begin(graph)  # the same graph: it already began

    with pytest.raises(RuntimeError, match="already began another graph"):
        runner.begin(nested_graph())
    assert len(of_type(log, RunStarted)) == 1


async def test_a_run_that_ran_its_graph_cannot_be_abandoned() -> None:
    log = new_log()
    runner = orchestrator.Runner(log)
    with anyio.fail_after(DEADLINE_S):
        await runner.run(nested_graph())

    with pytest.raises(RuntimeError, match=r"abandon\(\) ends a run that began and never ran"):
        runner.abandon(RuntimeError("too late"))
    assert len(of_type(log, RunFinished)) == 1


@pytest.mark.parametrize("parent", ["records", "returns", "raises"])
async def test_a_failure_that_stopped_at_its_parent_is_not_why_later_steps_are_cancelled(
    parent: str,
) -> None:
    # The child's error propagates from the child and stops at its parent:
    # the parent's policy records it, or its body catches it and returns or
    # raises an error of its own. A later failure is what cancels the rest.
    waiting = anyio.Event()

    def broken(ctx: StepContext) -> JsonValue:
        raise RuntimeError("optional plugin broke")

    async def plugins(ctx: StepContext) -> JsonValue:
        if parent == "records":
            await ctx.run_child("optional", broken, policy=orchestrator.PROBE_POLICY)
            return None
        try:
            await ctx.run_child("optional", broken)
        except Exception:
            if parent == "raises":
                await waiting.wait()
                raise ValueError("plugins failed") from None
        return None

    async def waiter(ctx: StepContext) -> JsonValue:
        waiting.set()
        await anyio.sleep_forever()

    async def late(ctx: StepContext) -> JsonValue:
        await waiting.wait()
        raise ValueError("late failure")

    policy = orchestrator.ANY_EXCEPTION_POLICY if parent == "records" else orchestrator.PROBE_POLICY
    graph = Graph(
        "g",
        [
            Step(name="plugins", body=plugins, policy=policy),
            Step(name="waiter", body=waiter),
            Step(name="late", body=late, depends_on=["plugins"]),
        ],
    )
    log = new_log()
    with (
        anyio.fail_after(DEADLINE_S),
        pytest.raises(ValueError, match=r"late failure|plugins failed"),
    ):
        await orchestrator.run(graph, log)

    failed = "'late' failed: ValueError: late failure"
    if parent == "raises":
        failed = "'plugins' failed: ValueError: plugins failed"
    assert only(log, StepCancelled, "waiter").reason == f"cancelled because step {failed}"


async def test_the_service_name_variable_wins_over_the_resource_attributes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As OpenTelemetry's SDK resolves them: OTEL_SERVICE_NAME names the
    # service whatever OTEL_RESOURCE_ATTRIBUTES says.
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,team=inference")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-engine")
    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(nested_graph(), log)

    assert only(log, RunStarted).resource == {"service.name": "my-engine", "team": "inference"}


async def test_resource_attributes_without_a_key_are_not_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "=orphan, =,no-equals,team=inference")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(nested_graph(), log)

    assert only(log, RunStarted).resource == {"team": "inference"}


async def test_a_runner_without_an_identity_is_the_last_rank_of_its_logs_world() -> None:
    log = MemoryLog("run-1", 2)
    with anyio.fail_after(DEADLINE_S):
        await orchestrator.run(Graph("g", [Step(name="s", body=lambda ctx: None)]), log)

    identity = only(log, RunStarted).identity
    assert (identity.rank, identity.world_size) == (2, 3)


@pytest.mark.parametrize("max_threads", [1, 2])
async def test_a_runner_may_run_its_steps_on_a_single_thread(max_threads: int) -> None:
    log = new_log()
    graph = Graph("g", [Step(name=name, body=lambda ctx: ctx.step) for name in ("a", "b")])
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(graph, log, max_threads=max_threads)

    assert (result["a"].value, result["b"].value) == ("a", "b")
    with pytest.raises(ValueError, match="max_threads must be at least 1, not 0"):
        orchestrator.Runner(new_log(), max_threads=0)
