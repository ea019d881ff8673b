"""Candidate sets: the seed-000 attention-backend cases at the primitive level.

Every test runs ``select_candidate`` inside a graph step, as an engine's
attention step would, and reads the outcome back from the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import orchestrator
from events import (
    TERMINAL_STEP_EVENTS,
    DecisionMade,
    Divergence,
    Event,
    MemoryLog,
    Outcome,
    RunFinished,
    RunOutcome,
    StepCancelled,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepUnavailable,
)
from orchestrator import Candidate, Graph, Selection, Step, StepContext
from orchestrator._decisions import check_decisions

from .harness import DEADLINE_S, assert_log_contract, new_log, of_type, only, started_steps

pytestmark = pytest.mark.anyio

BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")


def valid(ctx: StepContext) -> list[str]:
    """A blocking probe that loads and accepts the configuration."""
    return []


def raising(error: BaseException) -> Callable[[StepContext], list[str]]:
    """A blocking probe that raises ``error`` (the same object every time)."""

    def probe(ctx: StepContext) -> list[str]:
        raise error

    return probe


def attention_graph(
    candidates: Sequence[Candidate], *, explicit: str | None = None, extra: Sequence[Step] = ()
) -> tuple[Graph, list[Selection]]:
    """A graph whose ``attention`` step selects among ``candidates``; the
    selection is appended to the returned list when the step succeeds."""
    selections: list[Selection] = []

    async def attention(ctx: StepContext) -> Any:
        selection = await orchestrator.select_candidate(ctx, candidates, explicit=explicit)
        selections.append(selection)
        return selection.selected

    return Graph("attention", [Step(name="attention", body=attention), *extra]), selections


async def run(graph: Graph, log: MemoryLog, **options: Any) -> orchestrator.RunResult:
    with anyio.fail_after(DEADLINE_S):
        return await orchestrator.run(graph, log, **options)


# Recorded environment failures ------------------------------------------------------

SEED_RECORDED = [
    ImportError("flashinfer is not installed"),
    PermissionError(13, "Permission denied", "/root/.cache/flashinfer"),
    OSError("libcuda.so.1: cannot open shared object file"),
]


async def test_environment_failures_are_recorded_and_nothing_valid_raises_value_error() -> None:
    errors = dict(zip(BACKENDS, SEED_RECORDED, strict=False))
    candidates = [
        Candidate(name=name, priority=i, probe=raising(error))
        for i, (name, error) in enumerate(errors.items())
    ]
    graph, _ = attention_graph(candidates)
    log = new_log()

    with pytest.raises(ValueError, match="No valid backend found") as raised:
        await run(graph, log)

    for name, error in errors.items():
        event = only(log, StepUnavailable, f"attention/{name}")
        assert event.outcome is Outcome.UNAVAILABLE
        assert event.reasons == (f"{type(error).__name__}: {error}",)
        assert event.cause is not None
        assert event.cause.type == type(error).__name__
        assert event.cause.reason == f"{type(error).__name__}: {error}"
        assert event.cause.frames, "the traceback is kept in the event"
    permission = only(log, StepUnavailable, "attention/FLASHINFER")
    assert permission.reasons == (
        "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'",
    )
    assert permission.cause is not None
    assert permission.cause.errno == 13
    assert permission.cause.filename == "/root/.cache/flashinfer"

    message = str(raised.value)
    for name, error in errors.items():
        assert f"{name}: [{type(error).__name__}: {error}]" in message
    step_failed = only(log, StepFailed, "attention")
    assert step_failed.cause.type == "orchestrator.NoValidCandidateError"
    assert step_failed.cause.message == message
    finished = only(log, RunFinished)
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == "attention"
    assert finished.cause is not None
    assert finished.cause.type == "orchestrator.NoValidCandidateError"
    assert of_type(log, DecisionMade)[0].value is None
    assert not of_type(log, StepFailed, "attention/FLASH_ATTN")
    assert_log_contract(log)


@pytest.mark.parametrize("error", SEED_RECORDED, ids=lambda e: type(e).__name__)
async def test_a_recorded_failure_lets_the_next_candidate_win(error: BaseException) -> None:
    candidates = [
        Candidate(name="FLASH_ATTN", priority=0, probe=raising(error)),
        Candidate(name="FLASHINFER", priority=1, probe=valid),
    ]
    graph, selections = attention_graph(candidates)
    log = new_log()

    result = await run(graph, log)

    assert result["attention"].value == "FLASHINFER"
    (selection,) = selections
    assert selection.selected == "FLASHINFER"
    assert not selection.explicit
    assert [(r.name, r.outcome, r.reasons) for r in selection.reports] == [
        ("FLASH_ATTN", Outcome.UNAVAILABLE, (f"{type(error).__name__}: {error}",)),
        ("FLASHINFER", Outcome.OK, ()),
    ]
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)


async def test_validation_reasons_make_a_candidate_invalid() -> None:
    async def rejects(ctx: StepContext) -> list[str]:
        return ["head size 80 is not supported", "sliding window is not supported"]

    candidates = [
        Candidate(name="FLASH_ATTN", priority=0, probe=rejects),
        Candidate(name="TRITON_ATTN", priority=1, probe=valid),
    ]
    graph, selections = attention_graph(candidates)
    log = new_log()

    await run(graph, log)

    event = only(log, StepUnavailable, "attention/FLASH_ATTN")
    assert event.outcome is Outcome.INVALID
    assert event.reasons == ("head size 80 is not supported", "sliding window is not supported")
    assert event.cause is None
    assert selections[0].selected == "TRITON_ATTN"


# Propagating errors ------------------------------------------------------------------

SEED_PROPAGATING = [
    RuntimeError("CUDA error: no kernel image is available"),
    AttributeError("module has no attribute 'get_builder_cls'"),
    KeyboardInterrupt(),
    SystemExit(3),
]


@pytest.mark.parametrize("blocking", [False, True], ids=["async-probe", "blocking-probe"])
@pytest.mark.parametrize("error", SEED_PROPAGATING, ids=lambda e: type(e).__name__)
async def test_a_propagating_error_leaves_run_with_its_own_type(
    error: BaseException, blocking: bool
) -> None:
    # Fresh object per test so a traceback from another parametrisation never leaks in.
    error = type(error)(*error.args)
    siblings = BACKENDS[1:]
    running = {name: anyio.Event() for name in (*siblings, "other")}

    async def sibling(ctx: StepContext) -> list[str]:
        running[ctx.step.rpartition("/")[2]].set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def wait_for_siblings() -> None:
        for event in running.values():
            await event.wait()

    async def failing_async(ctx: StepContext) -> list[str]:
        await wait_for_siblings()
        raise error

    loop = anyio.lowlevel.current_token()

    def failing_blocking(ctx: StepContext) -> list[str]:
        # Runs in a worker thread of its own (not anyio's, so it takes the
        # loop's token); the siblings are async tasks on the loop.
        anyio.from_thread.run(wait_for_siblings, token=loop)
        raise error

    async def other(ctx: StepContext) -> None:
        running["other"].set()
        await anyio.sleep_forever()

    candidates = [
        Candidate(
            name="FLASH_ATTN", priority=0, probe=failing_blocking if blocking else failing_async
        ),
        *(Candidate(name=name, priority=i + 1, probe=sibling) for i, name in enumerate(siblings)),
    ]
    graph, selections = attention_graph(candidates, extra=[Step(name="other", body=other)])
    log = new_log()

    # The exception is caught inside this coroutine, so on asyncio a
    # KeyboardInterrupt never reaches the event loop itself.
    with pytest.raises(type(error)) as raised:
        await run(graph, log)

    assert raised.value is error
    assert not selections
    # A KeyboardInterrupt is a stop; any other error (SystemExit included)
    # fails the run (SPEC §2).
    interrupted = isinstance(error, KeyboardInterrupt)
    candidate_failed = only(log, StepFailed, "attention/FLASH_ATTN")
    assert candidate_failed.cause.type == type(error).__name__
    assert candidate_failed.cause.message == str(error)
    assert candidate_failed.origin == "attention/FLASH_ATTN"
    step_failed = only(log, StepFailed, "attention")
    assert step_failed.cause == candidate_failed.cause
    assert step_failed.origin == "attention/FLASH_ATTN"
    cancelled = {e.step: e for e in of_type(log, StepCancelled)}
    assert set(cancelled) == {*(f"attention/{name}" for name in siblings), "other"}
    for event in cancelled.values():
        assert "'attention/FLASH_ATTN' failed" in event.reason
        assert type(error).__name__ in event.reason
    finished = only(log, RunFinished)
    assert finished.outcome is (RunOutcome.INTERRUPTED if interrupted else RunOutcome.FAILED)
    assert finished.failed_step == "attention/FLASH_ATTN"
    assert finished.cause == candidate_failed.cause
    events = list(log.read())
    assert events.index(candidate_failed) < min(events.index(e) for e in cancelled.values())
    assert events[-1] == finished
    assert not of_type(log, DecisionMade)
    assert_log_contract(log)


# Many candidates ---------------------------------------------------------------------


async def test_thirty_three_candidates_first_fails_the_other_thirty_two_are_probed() -> None:
    names = [f"BACKEND_{i:02d}" for i in range(33)]
    candidates = [
        Candidate(
            name=name,
            priority=i,
            probe=raising(OSError("libcuda.so.1: cannot open shared object file"))
            if i == 0
            else valid,
        )
        for i, name in enumerate(names)
    ]
    graph, selections = attention_graph(candidates)
    log = new_log()

    result = await run(graph, log)

    assert result["attention"].value == "BACKEND_01"
    assert only(log, StepUnavailable, "attention/BACKEND_00").reasons == (
        "OSError: libcuda.so.1: cannot open shared object file",
    )
    succeeded = {e.step for e in of_type(log, StepSucceeded) if e.step != "attention"}
    assert succeeded == {f"attention/{name}" for name in names[1:]}
    (selection,) = selections
    assert selection.considered == tuple(names)
    assert sum(r.valid for r in selection.reports) == 32
    assert_log_contract(log)


# Explicit selection ------------------------------------------------------------------


def four_candidates(**probes: Callable[[StepContext], Any]) -> list[Candidate]:
    return [
        Candidate(name=name, priority=i, probe=probes.get(name, valid))
        for i, name in enumerate(BACKENDS)
    ]


async def test_explicit_selection_failing_with_os_error_raises_value_error_from_it() -> None:
    error = OSError("libcuda.so.1: cannot open shared object file")
    graph, _ = attention_graph(four_candidates(FLASHINFER=raising(error)), explicit="FLASHINFER")
    log = new_log()

    with pytest.raises(ValueError, match=r"^Selected backend FLASHINFER is not valid") as raised:
        await run(graph, log)

    assert str(raised.value) == (
        "Selected backend FLASHINFER is not valid for this configuration. "
        "Reason: [OSError: libcuda.so.1: cannot open shared object file]"
    )
    assert raised.value.__cause__ is error
    assert only(log, StepUnavailable, "attention/FLASHINFER").reasons == (
        "OSError: libcuda.so.1: cannot open shared object file",
    )
    assert started_steps(log) == ["attention", "attention/FLASHINFER"]
    step_failed = only(log, StepFailed, "attention")
    assert step_failed.cause.cause is not None
    assert step_failed.cause.cause.type == "OSError"
    assert only(log, RunFinished).outcome is RunOutcome.FAILED
    assert_log_contract(log)


async def test_explicit_selection_rejected_by_validation_lists_the_reasons() -> None:
    def rejects(ctx: StepContext) -> list[str]:
        return ["head size 80 is not supported"]

    graph, _ = attention_graph(four_candidates(FLASH_ATTN=rejects), explicit="FLASH_ATTN")
    log = new_log()

    with pytest.raises(ValueError, match=r"^Selected backend FLASH_ATTN is not valid") as raised:
        await run(graph, log)

    assert str(raised.value) == (
        "Selected backend FLASH_ATTN is not valid for this configuration. "
        "Reason: ['head size 80 is not supported']"
    )
    assert raised.value.__cause__ is None
    assert started_steps(log) == ["attention", "attention/FLASH_ATTN"]


async def test_explicit_selection_of_an_unknown_name_lists_the_valid_names() -> None:
    graph, _ = attention_graph(four_candidates(), explicit="XFORMERS")
    log = new_log()

    with pytest.raises(ValueError, match=r"^Unknown backend 'XFORMERS'") as raised:
        await run(graph, log)

    message = str(raised.value)
    assert "'XFORMERS'" in message
    for name in BACKENDS:
        assert name in message
    assert started_steps(log) == ["attention"]


async def test_explicit_selection_probes_only_that_candidate() -> None:
    def must_not_run(ctx: StepContext) -> list[str]:
        raise AssertionError(f"{ctx.step} was probed")

    probes = {name: must_not_run for name in BACKENDS if name != "TRITON_ATTN"}
    graph, selections = attention_graph(four_candidates(**probes), explicit="TRITON_ATTN")
    log = new_log()

    result = await run(graph, log)

    assert result["attention"].value == "TRITON_ATTN"
    (selection,) = selections
    assert selection.explicit
    assert selection.considered == ("TRITON_ATTN",)
    assert started_steps(log) == ["attention", "attention/TRITON_ATTN"]
    decision = only(log, DecisionMade)
    assert decision.name == "candidates.select"
    assert decision.value == "TRITON_ATTN"
    assert decision.inputs == {"parent": "attention", "explicit": "TRITON_ATTN"}


# Completion order never changes the selection ---------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    order=st.permutations(range(len(BACKENDS))),
    validity=st.lists(st.booleans(), min_size=len(BACKENDS), max_size=len(BACKENDS)).filter(any),
)
async def test_completion_order_never_changes_the_selection(
    order: list[int], validity: list[bool]
) -> None:
    gates = {name: anyio.Event() for name in BACKENDS}
    done = {name: anyio.Event() for name in BACKENDS}

    async def gated(ctx: StepContext) -> list[str]:
        name = ctx.step.rpartition("/")[2]
        await gates[name].wait()
        if validity[BACKENDS.index(name)]:
            return []
        raise OSError(f"{name} is not built for this GPU")

    candidates = [Candidate(name=name, priority=i, probe=gated) for i, name in enumerate(BACKENDS)]
    graph, selections = attention_graph(candidates)
    log = new_log()

    def on_event(event: Event) -> None:
        if isinstance(event, TERMINAL_STEP_EVENTS) and event.step.startswith("attention/"):
            done[event.step.rpartition("/")[2]].set()

    completion: list[str] = []
    with log.subscribe(on_event), anyio.fail_after(DEADLINE_S):
        async with anyio.create_task_group() as group:
            group.start_soon(orchestrator.run, graph, log)
            for index in order:
                name = BACKENDS[index]
                gates[name].set()
                await done[name].wait()
                completion.append(name)

    expected = BACKENDS[validity.index(True)]
    assert selections[0].selected == expected
    ended = [
        e.step.rpartition("/")[2]
        for e in log.read()
        if e.step.startswith("attention/") and isinstance(e, TERMINAL_STEP_EVENTS)
    ]
    assert ended == completion == [BACKENDS[i] for i in order]
    decision = only(log, DecisionMade)
    assert decision.value == expected
    assert check_decisions(log.read()) == []


async def test_best_priority_finishing_last_is_still_selected() -> None:
    # Simulated probe latencies: the preferred backend is the slowest to load.
    latency = {"FLASH_ATTN": 0.06, "FLASHINFER": 0.0, "TRITON_ATTN": 0.02, "FLEX_ATTENTION": 0.04}

    async def slow(ctx: StepContext) -> list[str]:
        await anyio.sleep(latency[ctx.step.rpartition("/")[2]])
        return []

    candidates = [Candidate(name=name, priority=i, probe=slow) for i, name in enumerate(BACKENDS)]
    graph, selections = attention_graph(candidates)
    log = new_log()

    await run(graph, log)

    assert selections[0].selected == "FLASH_ATTN"
    assert only(log, DecisionMade).value == "FLASH_ATTN"


async def test_the_decision_replays_and_a_tampered_log_diverges() -> None:
    candidates = four_candidates(FLASH_ATTN=raising(ImportError("flashinfer is not installed")))
    graph, _ = attention_graph(candidates)
    log = new_log()
    await run(graph, log)

    decision = only(log, DecisionMade)
    assert decision.name == "candidates.select"
    assert decision.value == "FLASHINFER"
    assert decision.inputs == {"parent": "attention"}
    assert decision.step == "attention"
    assert check_decisions(log.read()) == []

    tampered = [
        attrs.evolve(e, value="TRITON_ATTN") if isinstance(e, DecisionMade) else e
        for e in log.read()
    ]
    [divergence] = check_decisions(tampered)
    assert divergence == Divergence.of_decision(
        attrs.evolve(decision, value="TRITON_ATTN"), "FLASHINFER"
    )
    assert (divergence.code, divergence.subject, divergence.ranks) == (
        Divergence.DECISION,
        "candidates.select",
        (0,),
    )
    assert (divergence.step, divergence.seq) == ("attention", decision.seq)
    assert (divergence.recorded, divergence.recomputed) == ("TRITON_ATTN", "FLASHINFER")
    assert divergence.text == (
        f"rank 0 seq {decision.seq} (attention): decision candidates.select was "
        "'TRITON_ATTN' live, replay decides 'FLASHINFER'"
    )


async def test_candidate_spans_carry_name_priority_and_nest_under_the_step() -> None:
    graph, _ = attention_graph(four_candidates())
    log = new_log()
    await run(graph, log)

    step = only(log, StepStarted, "attention")
    for i, name in enumerate(BACKENDS):
        started = only(log, StepStarted, f"attention/{name}")
        assert started.kind is StepKind.CANDIDATE
        assert started.attributes == {"candidate": name, "priority": i}
        assert started.parent_span_id == step.span_id
    assert_log_contract(log)


async def test_no_candidates_is_a_value_error() -> None:
    graph, _ = attention_graph([])
    with pytest.raises(ValueError, match="no backend candidates"):
        await run(graph, new_log())


async def test_repeated_candidate_names_are_a_value_error() -> None:
    candidates = [
        Candidate(name="FLASH_ATTN", priority=0, probe=valid),
        Candidate(name="FLASH_ATTN", priority=1, probe=valid),
    ]
    graph, _ = attention_graph(candidates)
    log = new_log()
    with pytest.raises(ValueError, match="unique names; repeated: \\['FLASH_ATTN'\\]"):
        await run(graph, log)
    assert started_steps(log) == ["attention"]


async def test_a_parent_policy_may_absorb_a_candidate_error() -> None:
    # A plugin step whose probe broke is a failed plugin, not a failed run.
    error = RuntimeError("CUDA error: no kernel image is available")
    sibling_running = anyio.Event()

    async def sibling(ctx: StepContext) -> list[str]:
        sibling_running.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def failing(ctx: StepContext) -> list[str]:
        await sibling_running.wait()
        raise error

    async def plugin(ctx: StepContext) -> Any:
        candidates = [
            Candidate(name="FLASH_ATTN", priority=0, probe=failing),
            Candidate(name="FLASHINFER", priority=1, probe=sibling),
        ]
        # The probes propagate RuntimeError; the step itself records anything.
        selection = await orchestrator.select_candidate(
            ctx, candidates, policy=orchestrator.PROBE_POLICY
        )
        return selection.selected

    graph = Graph("g", [Step(name="plugin", body=plugin, policy=orchestrator.ANY_EXCEPTION_POLICY)])
    log = new_log()

    result = await run(graph, log)

    assert result["plugin"].outcome is Outcome.UNAVAILABLE
    assert result["plugin"].reasons == ("RuntimeError: CUDA error: no kernel image is available",)
    assert result["plugin"].error is error
    assert only(log, StepFailed, "plugin/FLASH_ATTN").cause.type == "RuntimeError"
    assert only(log, StepCancelled, "plugin/FLASHINFER")
    assert (
        only(log, StepUnavailable, "plugin").cause
        == only(log, StepFailed, "plugin/FLASH_ATTN").cause
    )
    assert only(log, RunFinished).outcome is RunOutcome.READY
    assert_log_contract(log)


async def test_reports_and_reasons_are_in_priority_order_whatever_the_order_given() -> None:
    candidates = [
        Candidate(name="TRITON_ATTN", priority=2, probe=lambda ctx: ["head size 80"]),
        Candidate(name="FLASH_ATTN", priority=0, probe=lambda ctx: ["sm 7.5"]),
        Candidate(name="FLASHINFER", priority=1, probe=lambda ctx: ["fp8 kv cache"]),
    ]
    graph, _ = attention_graph(candidates)

    with pytest.raises(orchestrator.NoValidCandidateError) as raised:
        await run(graph, new_log())

    assert list(raised.value.reasons) == ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN"]
    assert str(raised.value) == (
        "No valid backend found for this configuration. Reasons: {FLASH_ATTN: [sm 7.5], "
        "FLASHINFER: [fp8 kv cache], TRITON_ATTN: [head size 80]}."
    )


async def test_a_selection_reports_every_candidate_in_priority_order() -> None:
    candidates = [
        Candidate(name="TRITON_ATTN", priority=2, probe=valid),
        Candidate(name="FLASH_ATTN", priority=0, probe=lambda ctx: ["sm 7.5"]),
        Candidate(name="FLASHINFER", priority=1, probe=valid),
    ]
    graph, selections = attention_graph(candidates)

    await run(graph, new_log())

    (selection,) = selections
    assert selection.selected == "FLASHINFER"
    assert selection.considered == ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN")
    assert selection.valid == ("FLASHINFER", "TRITON_ATTN")
