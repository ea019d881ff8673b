"""Typed candidate errors: new runs record their public type, message rules
match the type, and logs of earlier releases (a plain ValueError) still
derive the same messages."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from events import StepFailed, read_log, replay
from orchestrator import ExplicitCandidateInvalidError, NoValidCandidateError
from orchestrator.engine import ATTENTION_STEP, ENGINE, EngineConfig

from .harness import run

pytestmark = pytest.mark.anyio

FIXTURES = Path(__file__).resolve().parents[2] / "events" / "fixtures"


def codes(events: list[object]) -> list[str]:
    return [m.code for m in replay(events, slices=[ENGINE]).messages]  # type: ignore[arg-type]


def test_the_errors_are_public_value_errors_that_survive_pickling() -> None:
    none_valid = NoValidCandidateError("backend", {"A": ["too small"], "B": []})
    explicit = ExplicitCandidateInvalidError("backend", "A", "['too small']")
    for error in (none_valid, explicit):
        assert isinstance(error, ValueError)
        assert type(error).__module__ == "orchestrator"
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error)
        assert str(copy) == str(error)
    assert str(none_valid) == (
        "No valid backend found for this configuration. Reasons: {A: [too small], B: []}."
    )
    assert none_valid.reasons == {"A": ("too small",), "B": ()}
    assert str(explicit) == (
        "Selected backend A is not valid for this configuration. Reason: ['too small']"
    )


async def test_a_new_run_records_the_type_and_the_rule_matches_it() -> None:
    engine = await run("h200x8", config=EngineConfig(head_size=7))

    assert isinstance(engine.error, NoValidCandidateError)
    failed = engine.terminal(ATTENTION_STEP)
    assert isinstance(failed, StepFailed)
    assert failed.cause.type == "orchestrator.NoValidCandidateError"
    derived = codes(engine.events)
    assert "attention.none_valid" in derived
    assert "step.failed" not in derived


async def test_an_explicit_backend_failing_records_its_type() -> None:
    engine = await run(
        "h200x8",
        config=EngineConfig(attention_backend="FLASHINFER"),
        faults=["flashinfer=OSError:libcuda.so.1: cannot open shared object file"],
    )

    assert isinstance(engine.error, ExplicitCandidateInvalidError)
    failed = engine.terminal(ATTENTION_STEP)
    assert isinstance(failed, StepFailed)
    assert failed.cause.type == "orchestrator.ExplicitCandidateInvalidError"
    derived = codes(engine.events)
    assert "attention.explicit_invalid" in derived
    assert "step.failed" not in derived


@pytest.mark.parametrize(
    ("fixture", "code", "start"),
    [
        ("legacy-attention-none-valid.jsonl", "attention.none_valid", "No valid backend"),
        (
            "legacy-attention-explicit-invalid.jsonl",
            "attention.explicit_invalid",
            "Selected backend FLASHINFER is not valid",
        ),
    ],
)
def test_a_log_of_an_earlier_release_derives_the_same_messages(
    fixture: str, code: str, start: str
) -> None:
    # Written before the typed errors: the failure is a plain ValueError.
    contents = read_log(FIXTURES / fixture)
    failed = next(
        e for e in contents.events if isinstance(e, StepFailed) and e.step == ATTENTION_STEP
    )
    assert failed.cause.type == "ValueError"

    result = replay([contents], slices=[ENGINE])
    (message,) = [m for m in result.messages if m.code == code]
    assert message.text == failed.cause.message
    assert message.text.startswith(start)
    assert message.args == (failed.cause.message,)
    assert message.detail == failed.cause.format()
    assert "step.failed" not in [m.code for m in result.messages]
    assert result.root_cause is not None
    assert result.root_cause.exception is not None
    assert result.root_cause.exception.type == "ValueError"
