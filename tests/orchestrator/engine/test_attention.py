"""SPEC §3.1: the attention-backend probe, through the real engine graph."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from events import Outcome, RunOutcome, StepCancelled, StepFailed, StepUnavailable
from orchestrator import FaultPlan
from orchestrator._decisions import check_decisions
from orchestrator.engine import (
    ATTENTION_BACKENDS,
    ATTENTION_STEP,
    ENGINE_DECIDERS,
    EngineConfig,
    attention_candidates,
)

from .harness import run

pytestmark = pytest.mark.anyio

CUDA_LIST = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"]
PERMISSION = PermissionError(13, "Permission denied", "/root/.cache/flashinfer")

# The upstream test's values: environment failures a probe must survive.
ENVIRONMENT_FAILURES: list[tuple[BaseException, dict[str, Any]]] = [
    (
        ImportError("flashinfer is not installed"),
        {"exception": "ImportError", "args": ["flashinfer is not installed"]},
    ),
    (
        PERMISSION,
        {
            "exception": "PermissionError",
            "args": [13, "Permission denied", "/root/.cache/flashinfer"],
        },
    ),
    (
        OSError("libcuda.so.1: cannot open shared object file"),
        {"exception": "OSError", "args": ["libcuda.so.1: cannot open shared object file"]},
    ),
]


@pytest.mark.parametrize("target", ["flashinfer", "attention/FLASHINFER"])
@pytest.mark.parametrize(
    ("error", "fault"), ENVIRONMENT_FAILURES, ids=["ImportError", "PermissionError", "OSError"]
)
async def test_environment_failure_is_recorded_and_the_others_are_still_probed(
    target: str, error: BaseException, fault: dict[str, Any]
) -> None:
    faults = FaultPlan.from_json([{"target": target, **fault}])
    engine = await run("h200x8", faults=faults)

    assert engine.error is None
    reason = f"{type(error).__name__}: {error}"
    failed = engine.terminal("attention/FLASHINFER")
    assert isinstance(failed, StepUnavailable)
    assert failed.outcome is Outcome.UNAVAILABLE
    assert failed.reasons == (reason,)
    assert failed.cause is not None
    assert failed.cause.type == type(error).__name__
    assert failed.cause.frames, "the traceback is kept in the event"
    if isinstance(error, PermissionError):
        assert reason == "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
        assert (failed.cause.errno, failed.cause.filename) == (13, "/root/.cache/flashinfer")
    for other in ("FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"):
        assert engine.outcome(f"attention/{other}") is Outcome.OK
    assert engine.value(ATTENTION_STEP) == {
        "backend": "FLASH_ATTN",
        "explicit": False,
        "considered": CUDA_LIST,
        "valid": [name for name in CUDA_LIST if name != "FLASHINFER"],
    }
    assert engine.decision("candidates.select").value == "FLASH_ATTN"
    assert check_decisions(engine.events, ENGINE_DECIDERS) == []


async def test_a_failing_first_candidate_does_not_stop_the_others() -> None:
    engine = await run("h200x8", faults=["flash_attn=OSError:libcuda.so.1: cannot open"])

    assert engine.outcome("attention/FLASH_ATTN") is Outcome.UNAVAILABLE
    assert engine.value(ATTENTION_STEP)["backend"] == "FLASHINFER"
    assert [engine.outcome(f"attention/{name}") for name in CUDA_LIST[1:]] == [Outcome.OK] * 3


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("CUDA error: no kernel image is available"),
        AttributeError("module has no attribute 'get_builder_cls'"),
        KeyboardInterrupt(),
    ],
    ids=["RuntimeError", "AttributeError", "KeyboardInterrupt"],
)
async def test_programming_errors_propagate_with_their_own_type(error: BaseException) -> None:
    name = type(error).__name__
    faults = FaultPlan.from_json(
        [
            {"target": "flash_attn", "exception": name, "args": list(error.args)},
            # A sibling still running when the error propagates is cancelled.
            {"target": "attention/TRITON_ATTN", "exception": "hang"},
        ]
    )
    engine = await run("h200x8", faults=faults)

    assert type(engine.error) is type(error)
    assert engine.error.args == error.args
    failed = engine.terminal("attention/FLASH_ATTN")
    assert isinstance(failed, StepFailed)
    assert failed.cause.type == name
    assert isinstance(engine.terminal("attention/TRITON_ATTN"), StepCancelled)
    assert isinstance(engine.terminal(ATTENTION_STEP), StepFailed)
    for candidate in CUDA_LIST:
        engine.terminal(f"attention/{candidate}")  # every probe ended, one way or another
    finished = engine.finished
    interrupted = isinstance(error, KeyboardInterrupt)
    assert finished.outcome is (RunOutcome.INTERRUPTED if interrupted else RunOutcome.FAILED)
    assert finished.failed_step == "attention/FLASH_ATTN"
    assert finished.cause is not None
    assert finished.cause.type == name


async def test_explicit_backend_failing_in_the_environment_raises_value_error_from_it() -> None:
    engine = await run(
        "h200x8",
        config=EngineConfig(attention_backend="FLASHINFER"),
        faults=["flashinfer=OSError:libcuda.so.1: cannot open shared object file"],
    )

    error = engine.error
    assert isinstance(error, ValueError)
    # The seed's form: the reason in brackets, not a quoted list.
    assert str(error) == (
        "Selected backend FLASHINFER is not valid for this configuration. "
        "Reason: [OSError: libcuda.so.1: cannot open shared object file]"
    )
    assert type(error.__cause__) is OSError
    assert str(error.__cause__) == "libcuda.so.1: cannot open shared object file"
    assert engine.steps("attention/") == ["attention/FLASHINFER"], "no fallback"
    assert engine.started(ATTENTION_STEP).attributes == {"explicit": "FLASHINFER"}
    cause = engine.terminal(ATTENTION_STEP)
    assert isinstance(cause, StepFailed)
    assert cause.cause.cause is not None
    assert cause.cause.cause.type == "OSError"
    assert engine.finished.outcome is RunOutcome.FAILED


async def test_explicit_backend_rejecting_the_configuration_lists_its_reasons() -> None:
    engine = await run("h200x8", config=EngineConfig(attention_backend="FLASHINFER", head_size=80))

    assert isinstance(engine.error, ValueError)
    # Validation reasons stay the list they are, as in the seed.
    assert str(engine.error) == (
        "Selected backend FLASHINFER is not valid for this configuration. "
        "Reason: ['head_size 80 not supported']"
    )
    assert engine.error.__cause__ is None
    assert engine.outcome("attention/FLASHINFER") is Outcome.INVALID


@pytest.mark.parametrize(
    ("backend", "config", "reasons"),
    [
        # Any multiple of 8 up to 256, inclusive.
        ("FLASH_ATTN", EngineConfig(head_size=256), None),
        ("FLASH_ATTN", EngineConfig(head_size=264), ["head_size 264 not supported"]),
        # Any multiple of 16.
        ("FLASH_ATTN", EngineConfig(block_size=32), None),
        ("FLASH_ATTN", EngineConfig(block_size=24), ["block_size 24 not supported"]),
        # An MLA backend needs an MLA model, whatever its head size.
        ("TRITON_MLA", EngineConfig(head_size=576), ["non-MLA not supported"]),
        ("FLASH_ATTN", EngineConfig(use_mla=True), ["MLA not supported"]),
    ],
    ids=["head-256", "head-264", "block-32", "block-24", "mla-backend", "mla-model"],
)
async def test_explicit_backend_validates_the_configuration(
    backend: str, config: EngineConfig, reasons: list[str] | None
) -> None:
    engine = await run("h200x8", config=attrs.evolve(config, attention_backend=backend))

    if reasons is None:
        assert engine.error is None
        assert engine.value(ATTENTION_STEP)["backend"] == backend
    else:
        assert isinstance(engine.error, ValueError)
        assert str(engine.error) == (
            f"Selected backend {backend} is not valid for this configuration. Reason: {reasons!r}"
        )


@pytest.mark.parametrize(
    ("device", "capability", "use_mla", "candidates"),
    [
        ("cuda", (9, 0), False, tuple(CUDA_LIST)),
        ("cuda", None, False, tuple(CUDA_LIST)),
        ("cuda", (10, 0), False, ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")),
        ("cuda", (10, 0), True, ("CUTLASS_MLA", "FLASHINFER_MLA", "FLASH_ATTN_MLA", "TRITON_MLA")),
        ("cuda", (9, 0), True, ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")),
        ("cuda", (8, 0), True, ("TRITON_MLA",)),
        ("rocm", (9, 4), False, ("ROCM_AITER_FA", "ROCM_ATTN", "TRITON_ATTN")),
        ("rocm", (9, 4), True, ("TRITON_MLA",)),
        ("cpu", None, False, ("CPU_ATTN",)),
        ("tpu", None, False, ("PALLAS",)),
        ("xpu", None, False, ("XPU_ATTN", "TRITON_ATTN")),
        (None, None, False, ()),
        ("acme", None, False, ()),
    ],
)
def test_the_candidates_depend_on_the_platform_and_the_configuration(
    device: str | None,
    capability: tuple[int, int] | None,
    use_mla: bool,
    candidates: tuple[str, ...],
) -> None:
    assert attention_candidates(device, capability, use_mla) == candidates


async def test_explicit_backend_that_works_is_the_only_one_probed() -> None:
    engine = await run("h200x8", config=EngineConfig(attention_backend="TRITON_ATTN"))

    assert engine.value(ATTENTION_STEP) == {
        "backend": "TRITON_ATTN",
        "explicit": True,
        "considered": ["TRITON_ATTN"],
        "valid": ["TRITON_ATTN"],
    }
    assert engine.steps("attention/") == ["attention/TRITON_ATTN"]
    assert check_decisions(engine.events, ENGINE_DECIDERS) == []


async def test_explicit_backend_of_another_platform_says_why() -> None:
    engine = await run("h200x8", config=EngineConfig(attention_backend="CPU_ATTN"))

    assert isinstance(engine.error, ValueError)
    assert "device cuda not supported" in str(engine.error)


async def test_unknown_explicit_backend_lists_the_valid_names() -> None:
    engine = await run("h200x8", config=EngineConfig(attention_backend="FLASH_ATTENTION_9000"))

    assert isinstance(engine.error, ValueError)
    message = str(engine.error)
    assert "'FLASH_ATTENTION_9000'" in message
    for name in ATTENTION_BACKENDS:
        assert name in message
    assert engine.steps("attention/") == []
    assert engine.finished.outcome is RunOutcome.FAILED


@pytest.mark.parametrize(
    ("profile", "config", "backend", "considered"),
    [
        ("h200x8", EngineConfig(), "FLASH_ATTN", CUDA_LIST),
        ("a100x4", EngineConfig(), "FLASH_ATTN", CUDA_LIST),
        (
            "b200x8",
            EngineConfig(),
            "FLASHINFER",
            ["FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"],
        ),
        (
            "b200x8",
            EngineConfig(use_mla=True, head_size=576, block_size=64),
            "FLASHINFER_MLA",
            ["CUTLASS_MLA", "FLASHINFER_MLA", "FLASH_ATTN_MLA", "TRITON_MLA"],
        ),
        (
            "h200x8",
            EngineConfig(use_mla=True, head_size=576),
            "FLASH_ATTN_MLA",
            ["FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA"],
        ),
        ("a100x4", EngineConfig(use_mla=True, head_size=576), "TRITON_MLA", ["TRITON_MLA"]),
        ("a100x4", EngineConfig(dtype="float32"), "TRITON_ATTN", CUDA_LIST),
        ("zen4", EngineConfig(), "CPU_ATTN", ["CPU_ATTN"]),
        ("xeon", EngineConfig(), "CPU_ATTN", ["CPU_ATTN"]),
    ],
    ids=[
        "h200x8",
        "a100x4",
        "b200x8",
        "b200x8-mla",
        "h200x8-mla",
        "a100x4-mla",
        "fp32",
        "zen4",
        "xeon",
    ],
)
async def test_automatic_selection_takes_the_best_valid_candidate(
    profile: str, config: EngineConfig, backend: str, considered: list[str]
) -> None:
    engine = await run(profile, config=config)

    valid = [name for name in considered if engine.outcome(f"attention/{name}") is Outcome.OK]
    assert engine.value(ATTENTION_STEP) == {
        "backend": backend,
        "explicit": False,
        "considered": considered,
        "valid": valid,
    }
    assert valid[0] == backend
    assert engine.started(ATTENTION_STEP).attributes == {"explicit": None}
    for priority, name in enumerate(considered):
        assert engine.started(f"attention/{name}").attributes == {
            "candidate": name,
            "priority": priority,
        }


async def test_a_backend_whose_module_is_missing_is_unavailable() -> None:
    # CUTLASS_MLA imports `cutlass`, which the b200x8 profile does not have.
    engine = await run("b200x8", config=EngineConfig(use_mla=True, head_size=576, block_size=128))

    missing = engine.terminal("attention/CUTLASS_MLA")
    assert isinstance(missing, StepUnavailable)
    assert missing.reasons == ("ModuleNotFoundError: No module named 'cutlass'",)
    assert engine.value(ATTENTION_STEP)["backend"] == "TRITON_MLA"


async def test_no_valid_candidate_is_a_terminal_value_error_listing_every_reason() -> None:
    engine = await run("h200x8", config=EngineConfig(head_size=7))

    assert isinstance(engine.error, ValueError)
    message = str(engine.error)
    # vLLM 0.33's words: the device, the selector's configuration, then
    # each backend's reasons as {NAME: [reason, ...], ...}.
    assert message.startswith(
        "No valid backend found for attention on cuda with AttentionSelectorConfig("
        "head_size=7, dtype=torch.bfloat16, kv_cache_dtype=auto, block_size=16, "
        "use_mla=False). Reasons: {FLASH_ATTN: [head_size 7 not supported], "
    )
    assert message.endswith("}.")
    for name in CUDA_LIST:
        assert f"{name}: [" in message
        invalid = engine.terminal(f"attention/{name}")
        assert isinstance(invalid, StepUnavailable)
        assert invalid.outcome is Outcome.INVALID
        assert "head_size 7 not supported" in invalid.reasons
    assert engine.decision("candidates.select").value is None
    assert engine.finished.outcome is RunOutcome.FAILED
    assert engine.finished.failed_step == ATTENTION_STEP


async def test_a_hanging_candidate_times_out_and_the_others_are_selected() -> None:
    # The candidate's bound is the step timeout; the attention step's is
    # twice that, so the probe that hangs is the one that times out. The
    # bound leaves the probes that do not hang time on a loaded machine.
    engine = await run(
        "h200x8",
        config=EngineConfig(step_timeout=1.0),
        faults=["attention/FLEX_ATTENTION=hang"],
    )

    assert engine.error is None
    assert engine.outcome("attention/FLEX_ATTENTION") is Outcome.TIMED_OUT
    assert engine.outcome(ATTENTION_STEP) is Outcome.OK
    assert engine.finished.outcome is RunOutcome.READY


@pytest.mark.slow
async def test_an_attention_step_that_hangs_itself_times_out() -> None:
    from orchestrator import StepTimeoutError

    # The platform step before it must not time out on a loaded machine.
    engine = await run("h200x8", config=EngineConfig(step_timeout=1.0), faults=["attention=hang"])

    assert isinstance(engine.error, StepTimeoutError)
    assert engine.outcome(ATTENTION_STEP) is Outcome.TIMED_OUT
    assert engine.finished.outcome is RunOutcome.FAILED
