"""Error policies: the defaults of SPEC §3, for live exceptions and for
exceptions that came back as MRO names."""

from __future__ import annotations

import anyio
import pytest

import orchestrator
from events import JsonValue, Outcome, StepUnavailable
from orchestrator import (
    ANY_EXCEPTION_POLICY,
    PROBE_POLICY,
    Action,
    ErrorPolicy,
    FaultPlan,
    Graph,
    Rule,
    Step,
    StepContext,
    When,
    optional_module_policy,
)
from orchestrator._policy import qualified_name

from .harness import DEADLINE_S, new_log, only

ZENTORCH = optional_module_policy("zentorch")

RECORD_UNAVAILABLE = (Action.RECORD, Outcome.UNAVAILABLE)
PROPAGATE = (Action.PROPAGATE, Outcome.FAILED)


class CustomError(Exception):
    pass


class Driver:
    class Error(Exception):
        """An exception class nested in another, as a binding's often are."""


CASES: list[tuple[ErrorPolicy, BaseException, tuple[Action, Outcome]]] = [
    (PROBE_POLICY, ImportError("flashinfer is not installed"), RECORD_UNAVAILABLE),
    (PROBE_POLICY, ModuleNotFoundError("No module named 'x'", name="x"), RECORD_UNAVAILABLE),
    (PROBE_POLICY, PermissionError(13, "Permission denied"), RECORD_UNAVAILABLE),
    (PROBE_POLICY, OSError("libcuda.so.1: cannot open shared object file"), RECORD_UNAVAILABLE),
    (PROBE_POLICY, TimeoutError("driver"), RECORD_UNAVAILABLE),
    (PROBE_POLICY, RuntimeError("CUDA error: no kernel image is available"), PROPAGATE),
    (PROBE_POLICY, AttributeError("module has no attribute 'get_builder_cls'"), PROPAGATE),
    (PROBE_POLICY, TypeError("bad"), PROPAGATE),
    (PROBE_POLICY, CustomError("x"), PROPAGATE),
    (PROBE_POLICY, KeyboardInterrupt(), PROPAGATE),
    (PROBE_POLICY, SystemExit(1), PROPAGATE),
    (
        ANY_EXCEPTION_POLICY,
        TypeError("type 'array.array' is not subscriptable"),
        RECORD_UNAVAILABLE,
    ),
    (ANY_EXCEPTION_POLICY, RuntimeError("x"), RECORD_UNAVAILABLE),
    (ANY_EXCEPTION_POLICY, CustomError("x"), RECORD_UNAVAILABLE),
    (ANY_EXCEPTION_POLICY, OSError("x"), RECORD_UNAVAILABLE),
    (ANY_EXCEPTION_POLICY, KeyboardInterrupt(), PROPAGATE),
    (ANY_EXCEPTION_POLICY, SystemExit(0), PROPAGATE),
    (
        ZENTORCH,
        ModuleNotFoundError("No module named 'zentorch'", name="zentorch"),
        (Action.RECORD, Outcome.ABSENT),
    ),
    (
        optional_module_policy("zentorch.ops"),
        ModuleNotFoundError("No module named 'zentorch'", name="zentorch"),
        (Action.RECORD, Outcome.ABSENT),
    ),
    (
        ZENTORCH,
        ModuleNotFoundError("No module named 'torch'", name="torch"),
        RECORD_UNAVAILABLE,
    ),
    (
        ZENTORCH,
        ModuleNotFoundError("No module named 'zentorch._C'", name="zentorch._C"),
        RECORD_UNAVAILABLE,
    ),
    (ZENTORCH, ModuleNotFoundError("no name given"), RECORD_UNAVAILABLE),
    (ZENTORCH, ImportError("undefined symbol", name="zentorch"), RECORD_UNAVAILABLE),
    (ZENTORCH, OSError("libzentorch.so: undefined symbol: x"), RECORD_UNAVAILABLE),
    (ZENTORCH, RuntimeError("x"), PROPAGATE),
    (ZENTORCH, KeyboardInterrupt(), PROPAGATE),
]


def case_id(case: tuple[ErrorPolicy, BaseException, tuple[Action, Outcome]]) -> str:
    policy, error, _ = case
    name = getattr(error, "name", None)
    return f"{policy.name}-{type(error).__name__}" + (f"-{name}" if name else "")


@pytest.mark.parametrize(("policy", "error", "verdict"), CASES, ids=[case_id(c) for c in CASES])
def test_live_and_named_classification_agree(
    policy: ErrorPolicy, error: BaseException, verdict: tuple[Action, Outcome]
) -> None:
    live = policy.classify(error)
    assert (live.action, live.outcome) == verdict
    assert live.record is (verdict[0] is Action.RECORD)

    mro = [qualified_name(cls) for cls in type(error).__mro__]
    name = getattr(error, "name", None) if isinstance(error, ImportError) else None
    named = policy.classify_names(mro, module_name=name)
    assert named == live


def test_base_exceptions_propagate_even_with_a_rule_for_them() -> None:
    greedy = ErrorPolicy(
        name="greedy", rules=(Rule(exception="BaseException"), Rule(exception="Exception"))
    )
    assert greedy.classify(KeyboardInterrupt()).action is Action.PROPAGATE
    assert greedy.classify(SystemExit(0)).action is Action.PROPAGATE
    names = ["KeyboardInterrupt", "BaseException", "object"]
    assert greedy.classify_names(names).action is Action.PROPAGATE
    assert greedy.classify(RuntimeError("x")).action is Action.RECORD


def test_the_first_matching_rule_wins_and_may_propagate() -> None:
    policy = ErrorPolicy(
        name="custom",
        rules=(
            Rule(exception="PermissionError", action=Action.PROPAGATE),
            Rule(exception="OSError", outcome=Outcome.INVALID),
        ),
    )
    permission = policy.classify(PermissionError(13, "Permission denied"))
    assert permission.action is Action.PROPAGATE
    assert permission.rule == policy.rules[0]
    other = policy.classify(FileNotFoundError(2, "No such file"))
    assert (other.action, other.outcome, other.rule) == (
        Action.RECORD,
        Outcome.INVALID,
        policy.rules[1],
    )


def test_rules_match_qualified_names_of_non_builtin_types() -> None:
    policy = ErrorPolicy(name="custom", rules=(Rule(exception=qualified_name(CustomError)),))
    assert qualified_name(CustomError) == f"{__name__}.CustomError"
    assert qualified_name(PermissionError) == "PermissionError"
    assert policy.classify(CustomError("x")).record


def test_rules_match_a_nested_class_by_its_qualified_name() -> None:
    assert qualified_name(Driver.Error) == f"{__name__}.Driver.Error"
    policy = ErrorPolicy(name="custom", rules=(Rule(exception=f"{__name__}.Driver.Error"),))
    assert policy.classify(Driver.Error("x")).record
    # The class's own name alone names no class of this module.
    loose = ErrorPolicy(name="loose", rules=(Rule(exception=f"{__name__}.Error"),))
    assert not loose.classify(Driver.Error("x")).record


def test_a_recording_rule_needs_a_recorded_outcome() -> None:
    with pytest.raises(ValueError, match="absent, unavailable or invalid"):
        Rule(exception="OSError", outcome=Outcome.FAILED)
    assert Rule(exception="OSError", action=Action.PROPAGATE, outcome=Outcome.FAILED)


def test_policies_describe_themselves() -> None:
    assert ZENTORCH.describe().splitlines() == [
        "policy optional module zentorch:",
        "  ModuleNotFoundError when names_probed_module -> absent",
        "  ImportError -> unavailable",
        "  OSError -> unavailable",
        "  anything else -> propagate",
        "  timeout -> record, crash -> record",
    ]
    assert ZENTORCH.rules[0].when is When.NAMES_PROBED_MODULE


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("spec", "outcome", "reason"),
    [
        ("zentorch=ModuleNotFoundError", Outcome.ABSENT, "No module named 'zentorch'"),
        ("zentorch=OSError:libzentorch.so: undefined symbol: x", Outcome.UNAVAILABLE, "x"),
    ],
)
async def test_a_step_records_what_its_policy_says(
    spec: str, outcome: Outcome, reason: str
) -> None:
    def probe_zentorch(ctx: StepContext) -> JsonValue:
        ctx.import_module("zentorch")
        return True

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="platform/cpu/zentorch", body=probe_zentorch, policy=ZENTORCH)]),
            log,
            faults=FaultPlan.parse([spec]),
        )

    event = only(log, StepUnavailable, "platform/cpu/zentorch")
    assert event.outcome is outcome
    assert event.reasons[0].endswith(reason)
    assert result["platform/cpu/zentorch"].outcome is outcome


@pytest.mark.anyio
async def test_a_child_step_without_a_policy_follows_its_steps_policy() -> None:
    def broken(ctx: StepContext) -> JsonValue:
        raise RuntimeError("comm backend broke")

    async def comm(ctx: StepContext) -> JsonValue:
        child = await ctx.run_child("flashinfer", broken)
        return child.outcome.value

    log = new_log()
    with anyio.fail_after(DEADLINE_S):
        result = await orchestrator.run(
            Graph("g", [Step(name="comm", body=comm, policy=ANY_EXCEPTION_POLICY)]), log
        )

    # ANY_EXCEPTION_POLICY records the RuntimeError that PROBE_POLICY would propagate.
    assert only(log, StepUnavailable, "comm/flashinfer").outcome is Outcome.UNAVAILABLE
    assert result["comm"].value == "unavailable"
