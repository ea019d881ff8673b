"""The messages projection: every code of SPEC §3.6 from its pattern, once per
rank, scope, grouping, step severity and policies."""

from __future__ import annotations

import json

import attrs
import pytest

from events import (
    Composite,
    Event,
    Message,
    Messages,
    MessagesState,
    Outcome,
    PolicyError,
    RankStates,
    RunOutcome,
    Scope,
    Severity,
    SeverityPolicy,
    StepKind,
    format_ranks,
    group_messages,
    step_severity,
    step_severity_hook,
)
from events import fold as fold_events
from events.testing import EventStream
from orchestrator.engine import (
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    ENGINE,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)

from .streams import (
    COMM_TYPE_ERROR,
    FLASHINFER_PERMISSION,
    MNNVL_UNSUPPORTED,
    TRTLLM_FAILED,
    ZENTORCH_RUNTIME,
    RankBuilder,
    eight_ranks_two_nodes,
    exception,
    healthy_rank,
    zentorch_rank,
)

#: SPEC §3.6, as the contract states it.
SPEC_TABLE = {
    "platform.plugin_failed": ("DEBUG", "process"),
    "platform.detected": ("INFO", "local"),
    "platform.fallback": ("WARNING", "process"),
    "platform.conflict": ("ERROR", "process"),
    "platform.unspecified": ("ERROR", "process"),
    "zentorch.loaded": ("INFO", "local"),
    "zentorch.absent": ("DEBUG", "local"),
    "zentorch.broken": ("WARNING", "local"),
    "attention.backend_unavailable": ("DEBUG", "process"),
    "attention.backend_invalid": ("DEBUG", "process"),
    "attention.selected": ("INFO", "local"),
    "attention.explicit_selected": ("INFO", "local"),
    "attention.explicit_invalid": ("ERROR", "process"),
    "attention.none_valid": ("ERROR", "process"),
    "flashinfer_comm.unavailable": ("DEBUG", "local"),
    "allreduce.attempt_failed": ("WARNING", "local"),
    "allreduce.workspace_ready": ("INFO", "local"),
    "allreduce.workspace_failed": ("ERROR", "process"),
    "allreduce.divergence": ("ERROR", "global"),
    "step.failed": ("ERROR", "process"),
    "step.timed_out": ("ERROR", "process"),
    "step.crashed": ("ERROR", "process"),
    "run.ready": ("INFO", "global"),
    "run.failed": ("ERROR", "process"),
    "run.interrupted": ("ERROR", "process"),
}

#: Codes this release adds to the table (adding is allowed, changing is not).
ADDED_CODES = {
    # SPEC §3.2 names it; the §3.6 table does not list it.
    "platform.plugin_declined": ("DEBUG", "process"),
    "allreduce.quant_workspace_failed": ("ERROR", "process"),
}


#: The engine slice's severities as a policy to change one code of.
ENGINE_POLICY = SeverityPolicy(rules=ENGINE.code_rules())


def derive(events: list[Event], policy: SeverityPolicy | None = None) -> MessagesState:
    slices = [ENGINE] if policy is None else [ENGINE, policy.as_slice()]
    return fold_events(Messages(slices=slices), events)


def only(state: MessagesState, code: str, rank: int = 0) -> Message:
    found = [m for m in state.messages(rank) if m.code == code]
    assert len(found) == 1, f"{code}: {[m.code for m in state.messages(rank)]}"
    return found[0]


def assert_rule(message: Message) -> None:
    severity, scope = {**SPEC_TABLE, **ADDED_CODES}[message.code]
    assert message.severity is Severity[severity]
    assert message.scope is Scope(scope)


def codes_of(state: MessagesState, rank: int = 0) -> list[str]:
    return [m.code for m in state.messages(rank)]


# -- the policy ----------------------------------------------------------------


def test_the_engine_slice_has_the_spec_table_plus_added_codes() -> None:
    table = {
        code: (severity.name, scope.value)
        for code, (severity, scope) in ENGINE.code_rules().items()
        if code in SPEC_TABLE or code in ADDED_CODES
    }
    assert table == {**SPEC_TABLE, **ADDED_CODES}
    assert not set(ADDED_CODES) & set(SPEC_TABLE)


def test_policy_json_round_trip() -> None:
    text = ENGINE_POLICY.to_json()
    assert json.loads(text)["rules"]["zentorch.broken"] == {
        "severity": "warning",
        "scope": "local",
    }
    assert SeverityPolicy.from_json(text) == ENGINE_POLICY


def test_policy_file_may_name_only_the_codes_it_changes() -> None:
    newer = SeverityPolicy.from_json(
        {"version": 2, "rules": {"zentorch.broken": {"severity": "error"}}}, base=ENGINE_POLICY
    )
    assert newer.version == 2
    assert newer.rules["zentorch.broken"] == (Severity.ERROR, Scope.LOCAL)
    assert newer.rules["run.ready"] == ENGINE_POLICY.rules["run.ready"]
    # Without a base, a file names only its own codes; a code it leaves out
    # keeps its slice's severity when the policy is laid over the slices.
    alone = SeverityPolicy.from_json(
        {"version": 2, "rules": {"zentorch.broken": {"severity": "error", "scope": "local"}}}
    )
    messages = Messages(slices=[ENGINE, alone.as_slice()])
    assert messages.rule("zentorch.broken") == (Severity.ERROR, Scope.LOCAL)
    assert messages.rule("zentorch.absent") == Messages(slices=[ENGINE]).rule("zentorch.absent")


@pytest.mark.parametrize(
    ("document", "match"),
    [
        ("{", "not JSON"),
        ('{"rules": {}}', "missing field\\(s\\) 'version'"),
        ('{"version": 0}', "field 'version': must be a positive integer"),
        ('{"version": 2, "rules": {"x.y": {"severity": "loud", "scope": "local"}}}', "x.y"),
        ('{"version": 2, "rules": {"x.y": {"severity": "info", "scope": "rack"}}}', "rack"),
        ('{"version": 2, "rules": {"x.y": {"severity": "info"}}}', "needs a 'scope'"),
    ],
)
def test_bad_policy_documents_are_named(document: str, match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        SeverityPolicy.from_json(document)


def test_a_changed_rule_bumps_the_policy_version_unless_one_is_given() -> None:
    policy = SeverityPolicy(version=3)
    assert policy.with_rule("zentorch.broken", severity=Severity.ERROR).version == 4
    assert policy.with_rule("zentorch.broken", scope=Scope.GLOBAL, version=9).version == 9


def test_a_policy_file_may_write_severities_and_scopes_in_any_case_and_spacing() -> None:
    policy = SeverityPolicy.from_json(
        {"version": 2, "rules": {"zentorch.broken": {"severity": " Error ", "scope": " LOCAL "}}}
    )
    assert policy.rules["zentorch.broken"] == (Severity.ERROR, Scope.LOCAL)


def test_unknown_code_has_no_rule() -> None:
    with pytest.raises(KeyError, match=r"no\.such"):
        Messages(slices=[ENGINE]).rule("no.such")


# -- platform ------------------------------------------------------------------


def test_platform_detected_and_a_failed_plugin_is_debug_then_a_fallback_warning() -> None:
    broken = exception("RuntimeError", "libtpu.so: cannot open shared object file")
    builder = RankBuilder(0).run_started().cuda_platform(broken_plugin=broken)
    state = derive(builder.run_finished())

    failed = only(state, "platform.plugin_failed")
    assert_rule(failed)
    assert failed.text == (
        "Platform plugin tpu failed: RuntimeError: libtpu.so: cannot open shared object file"
    )
    assert failed.step == "platform/tpu"
    assert failed.detail is not None
    assert "RuntimeError: libtpu.so" in failed.detail

    detected = only(state, "platform.detected")
    assert_rule(detected)
    assert detected.text == "Automatically detected platform CudaPlatform."
    assert detected.step == PLATFORM_STEP

    fallback = only(state, "platform.fallback")
    assert_rule(fallback)
    assert fallback.text == (
        "Platform plugin tpu failed (RuntimeError: libtpu.so: cannot open shared object file); "
        "continuing on CudaPlatform. Fix or uninstall the plugin if tpu was expected."
    )
    plugin_end = next(
        e.seq for e in builder.events if e.step == "platform/tpu" and e.TYPE != "step.started"
    )
    platform_end = next(
        e.seq for e in builder.events if e.step == PLATFORM_STEP and e.TYPE == "step.succeeded"
    )
    assert fallback.seqs == (plugin_end, platform_end)


def test_no_fallback_warning_when_every_plugin_answered() -> None:
    state = derive(RankBuilder(0).run_started().cuda_platform().run_finished())
    assert "platform.fallback" not in codes_of(state)
    assert "platform.plugin_failed" not in codes_of(state)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (
            exception(
                "orchestrator.engine._config.PlatformConflictError",
                "Only one platform plugin can be activated, but got: ['cuda', 'rocm']",
            ),
            "platform.conflict",
        ),
        (
            exception(
                "orchestrator.engine._config.UnspecifiedPlatformError",
                "Failed to infer device type: no platform plugin activated. "
                "Failed plugins: cpu: RuntimeError: unknown zentorch failure",
                cause=ZENTORCH_RUNTIME,
            ),
            "platform.unspecified",
        ),
    ],
)
def test_terminal_platform_errors(error: object, code: str) -> None:
    from events import ExceptionInfo

    assert isinstance(error, ExceptionInfo)
    builder = RankBuilder(0).run_started()
    builder.started(PLATFORM_STEP)
    builder.plugin("cuda", activated="CudaPlatform")
    builder.failed(PLATFORM_STEP, error)
    state = derive(builder.run_finished(RunOutcome.FAILED, cause=error, failed_step=PLATFORM_STEP))

    message = only(state, code)
    assert_rule(message)
    assert message.text == error.message
    assert message.step == PLATFORM_STEP
    # The specific code says it; no generic step.failed on top.
    assert codes_of(state) == [code, "run.failed"]


# -- zentorch ------------------------------------------------------------------


def test_zentorch_loaded() -> None:
    message = only(derive(zentorch_rank("loaded").events), "zentorch.loaded")
    assert_rule(message)
    assert message.text == "Loaded zentorch; using ZenCpuPlatform."
    assert message.step == ZENTORCH_STEP


def test_zentorch_absent_is_debug_only() -> None:
    state = derive(zentorch_rank("absent").events)
    message = only(state, "zentorch.absent")
    assert_rule(message)
    assert message.text == "zentorch is not installed; using CpuPlatform."
    assert max(m.severity for m in state.messages(0)) is Severity.INFO


def test_zentorch_broken_is_a_warning_with_the_traceback() -> None:
    message = only(derive(zentorch_rank("broken").events), "zentorch.broken")
    assert_rule(message)
    assert message.text.startswith(
        "zentorch failed to import (OSError: libzentorch.so: undefined symbol: "
        "_ZN3c104impl8GPUTrace); the zentorch build probably does not match the installed "
        "torch 2.13.0. Falling back to CpuPlatform"
    )
    assert message.detail is not None
    assert "Traceback (most recent call last):" in message.detail
    assert "OSError: libzentorch.so: undefined symbol" in message.detail


def test_zentorch_runtime_error_fails_the_plugin_and_names_the_cause() -> None:
    state = derive(zentorch_rank("failed").events)
    # The cpu plugin absorbed the zentorch failure: no step.failed for it.
    assert codes_of(state) == ["platform.plugin_failed", "platform.unspecified", "run.failed"]
    assert only(state, "platform.plugin_failed").text == (
        "Platform plugin cpu failed: RuntimeError: unknown zentorch failure"
    )
    run_failed = only(state, "run.failed")
    assert run_failed.text.startswith(
        "Startup failed: UnspecifiedPlatformError: Failed to infer device type"
    )
    assert "RuntimeError: unknown zentorch failure" in run_failed.text
    assert run_failed.text.endswith("(step platform)")


# -- attention -----------------------------------------------------------------


def test_attention_candidates_and_automatic_selection() -> None:
    events = healthy_rank(0)
    state = derive(events)
    unavailable = only(state, "attention.backend_unavailable")
    assert_rule(unavailable)
    assert unavailable.text == (
        "Attention backend FLASHINFER is unavailable: "
        "PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'"
    )
    assert unavailable.step == "attention/FLASHINFER"

    invalid = only(state, "attention.backend_invalid")
    assert_rule(invalid)
    assert invalid.text == (
        "Attention backend FLEX_ATTENTION does not support this configuration: "
        "head size 80 is not supported"
    )

    selected = only(state, "attention.selected")
    assert_rule(selected)
    assert selected.text == (
        "Using FLASH_ATTN attention backend out of potential backends: "
        "['FLASH_ATTN', 'FLASHINFER', 'TRITON_ATTN', 'FLEX_ATTENTION']"
    )
    assert selected.step == ATTENTION_STEP


def test_automatic_selection_lists_the_valid_backends_where_the_log_has_them() -> None:
    # vLLM 0.33 lists the valid candidates beside every one probed.
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP, attributes={"explicit": None, "candidates": ["A", "B", "C"]})
    builder.succeeded(
        ATTENTION_STEP,
        {"backend": "B", "explicit": False, "considered": ["A", "B", "C"], "valid": ["B", "C"]},
    )
    selected = only(derive(builder.run_finished()), "attention.selected")
    assert selected.text == "Using B attention backend out of potential backends: ['B', 'C']"


def explicit_rank(outcome: str) -> list[Event]:
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP, attributes={"explicit": "FLASHINFER", "candidates": []})
    builder.started(
        "attention/FLASHINFER",
        kind=StepKind.CANDIDATE,
        attributes={"candidate": "FLASHINFER", "priority": 1},
    )
    if outcome == "ok":
        builder.succeeded("attention/FLASHINFER", {"candidate": "FLASHINFER", "priority": 1})
        builder.succeeded(
            ATTENTION_STEP,
            {"backend": "FLASHINFER", "explicit": True, "considered": ["FLASHINFER"]},
        )
        return builder.run_finished()
    builder.unavailable("attention/FLASHINFER", cause=FLASHINFER_PERMISSION)
    error = exception(
        "ValueError",
        "Selected backend FLASHINFER is not valid for this configuration. "
        f"Reason: [{FLASHINFER_PERMISSION.reason}]",
        cause=FLASHINFER_PERMISSION,
    )
    builder.failed(ATTENTION_STEP, error)
    return builder.run_finished(RunOutcome.FAILED, cause=error, failed_step=ATTENTION_STEP)


def test_explicit_selection() -> None:
    message = only(derive(explicit_rank("ok")), "attention.explicit_selected")
    assert_rule(message)
    assert message.text == "Using FLASHINFER backend."


def test_explicit_selection_invalid_is_one_error_with_the_message() -> None:
    state = derive(explicit_rank("invalid"))
    message = only(state, "attention.explicit_invalid")
    assert_rule(message)
    assert message.text.startswith("Selected backend FLASHINFER is not valid")
    assert codes_of(state) == [
        "attention.backend_unavailable",
        "attention.explicit_invalid",
        "run.failed",
    ]


def test_no_valid_backend() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP, attributes={"explicit": None, "candidates": ["FLASH_ATTN"]})
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.unavailable("attention/FLASH_ATTN", Outcome.INVALID, reasons=["fp8 kv cache"])
    error = exception(
        "ValueError",
        "No valid backend found for this configuration. Reasons: {FLASH_ATTN: ['fp8 kv cache']}",
    )
    builder.failed(ATTENTION_STEP, error)
    state = derive(builder.run_finished(RunOutcome.FAILED, cause=error, failed_step=ATTENTION_STEP))
    message = only(state, "attention.none_valid")
    assert_rule(message)
    assert message.text == error.message
    assert "step.failed" not in codes_of(state)


def test_a_propagating_candidate_error_is_one_step_failed_on_the_candidate() -> None:
    boom = exception("RuntimeError", "CUDA driver version is insufficient")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.started("attention/FLASHINFER", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.cancelled("attention/FLASHINFER")
    builder.failed(ATTENTION_STEP, boom)
    events = builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN")
    state = derive(events)

    assert codes_of(state) == ["step.failed", "run.failed"]
    failed = only(state, "step.failed")
    assert_rule(failed)
    assert failed.step == "attention/FLASH_ATTN"
    assert failed.text == (
        "Step attention/FLASH_ATTN failed: RuntimeError: CUDA driver version is insufficient; "
        "the error propagated and stopped the startup."
    )
    # Linked to the deepest failure and to every enclosing step it failed.
    assert failed.seqs == tuple(e.seq for e in events if e.TYPE == "step.failed")
    assert step_severity(state, 0, "attention/FLASH_ATTN") is Severity.ERROR
    run_failed = only(state, "run.failed")
    assert run_failed.text == (
        "Startup failed: RuntimeError: CUDA driver version is insufficient "
        "(step attention/FLASH_ATTN)"
    )


# -- flashinfer.comm -----------------------------------------------------------


def test_flashinfer_comm_import_failure_is_debug_with_the_message() -> None:
    builder = RankBuilder(0).run_started().flashinfer_comm("broken")
    message = only(derive(builder.run_finished()), "flashinfer_comm.unavailable")
    assert_rule(message)
    assert message.text == "flashinfer.comm import failed: type 'array.array' is not subscriptable"
    assert message.step == FLASHINFER_COMM_STEP
    assert message.detail is not None
    assert COMM_TYPE_ERROR.reason in message.detail


def test_flashinfer_comm_missing_symbol_and_absent() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(FLASHINFER_COMM_STEP)
    builder.unavailable(
        FLASHINFER_COMM_STEP, reasons=["flashinfer.comm has no create_allreduce_fusion_workspace"]
    )
    message = only(derive(builder.run_finished()), "flashinfer_comm.unavailable")
    assert message.text == (
        "flashinfer.comm is unavailable: flashinfer.comm has no create_allreduce_fusion_workspace"
    )
    # flashinfer not installed at all is the expected case: no message.
    absent = RankBuilder(0).run_started().flashinfer_comm("absent").run_finished()
    assert codes_of(derive(absent)) == ["run.ready"]


# -- all-reduce ----------------------------------------------------------------


def test_attempt_failure_with_fallback_is_a_warning_naming_the_next_backend() -> None:
    state = derive(healthy_rank(0))
    warning = only(state, "allreduce.attempt_failed")
    assert_rule(warning)
    assert warning.text == (
        "FlashInfer allreduce workspace with backend=mnnvl unavailable "
        f"({MNNVL_UNSUPPORTED.reason}; likely no NVSwitch multicast support for mnnvl); "
        "falling back to trtllm."
    )
    assert warning.step == "allreduce_workspace/mnnvl"
    ready = only(state, "allreduce.workspace_ready")
    assert_rule(ready)
    assert ready.text == "Initialized FlashInfer allreduce fusion workspace with backend=trtllm"
    assert "allreduce.workspace_failed" not in codes_of(state)


def test_step_severity_marks_the_failed_attempt_not_its_parent() -> None:
    events = healthy_rank(0)
    state = derive(events)
    assert step_severity(state, 0, "allreduce_workspace/mnnvl") is Severity.WARNING
    assert step_severity(state, 0, "allreduce_workspace/trtllm") is None
    parent = step_severity(state, 0, ALLREDUCE_STEP)
    assert parent is not None
    assert parent <= Severity.INFO
    assert step_severity(state, 0, "attention/FLASHINFER") is Severity.DEBUG
    assert step_severity(state, 3, ALLREDUCE_STEP) is None

    # Already right when the attempt's own terminal event has been folded
    # (when the live span ends), before the next attempt starts.
    end = next(
        i
        for i, e in enumerate(events)
        if e.step == "allreduce_workspace/mnnvl" and e.TYPE == "step.unavailable"
    )
    partial = derive(events[: end + 1])
    assert step_severity(partial, 0, "allreduce_workspace/mnnvl") is Severity.WARNING
    assert "allreduce.attempt_failed" not in codes_of(partial)


def test_exhausted_chain_is_an_error_and_fusion_is_disabled() -> None:
    builder = RankBuilder(0).run_started()
    builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED)], requested="mnnvl")
    state = derive(builder.run_finished())
    failed = only(state, "allreduce.workspace_failed")
    assert_rule(failed)
    assert failed.text.startswith(
        "Failed to initialize FlashInfer allreduce fusion workspace with backend=mnnvl "
        f"({MNNVL_UNSUPPORTED.reason}); allreduce fusion is disabled"
    )
    # An explicit backend has no fallback: no attempt-phase WARNING.
    assert "allreduce.attempt_failed" not in codes_of(state)
    assert codes_of(state)[-1] == "run.ready"


def test_two_failed_attempts_warn_then_error_on_the_last_backend() -> None:
    builder = RankBuilder(0).run_started()
    builder.allreduce([("mnnvl", MNNVL_UNSUPPORTED), ("trtllm", TRTLLM_FAILED)])
    state = derive(builder.run_finished())
    assert codes_of(state) == [
        "allreduce.attempt_failed",
        "allreduce.workspace_failed",
        "run.ready",
    ]
    assert (
        "backend=trtllm (RuntimeError: trtllm workspace"
        in only(state, "allreduce.workspace_failed").text
    )


def test_no_attempt_no_workspace_message() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ALLREDUCE_STEP)
    builder.succeeded(ALLREDUCE_STEP, {"enabled": False, "backend": None, "reason": "tp == 1"})
    assert codes_of(derive(builder.run_finished())) == ["run.ready"]


def test_a_timed_out_attempt_with_fallback_is_a_warning_not_an_error() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ALLREDUCE_STEP)
    builder.started(
        "allreduce_workspace/mnnvl",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "mnnvl", "fallback_left": True},
    )
    builder.timed_out("allreduce_workspace/mnnvl", 30)
    builder.started(
        "allreduce_workspace/trtllm",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "trtllm", "fallback_left": False},
    )
    builder.succeeded("allreduce_workspace/trtllm")
    builder.succeeded(ALLREDUCE_STEP, {"enabled": True, "backend": "trtllm"})
    state = derive(builder.run_finished())
    assert codes_of(state) == [
        "allreduce.attempt_failed",
        "allreduce.workspace_ready",
        "run.ready",
    ]
    assert (
        "backend=mnnvl timed out (timed out after 30 s"
        in only(state, "allreduce.attempt_failed").text
    )
    assert step_severity(state, 0, "allreduce_workspace/mnnvl") is Severity.WARNING


def test_an_attempt_no_other_follows_claims_no_fallback_and_keeps_its_warning() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ALLREDUCE_STEP)
    builder.started(
        "allreduce_workspace/mnnvl",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "mnnvl", "fallback_left": True},
    )
    builder.unavailable("allreduce_workspace/mnnvl", cause=MNNVL_UNSUPPORTED)
    builder.cancelled(ALLREDUCE_STEP, "the run was interrupted")
    state = derive(builder.run_finished(RunOutcome.INTERRUPTED))
    assert codes_of(state) == ["run.interrupted"]
    assert step_severity(state, 0, "allreduce_workspace/mnnvl") is Severity.WARNING


QUANT_STEP = "allreduce_workspace/quant"
QUANT_FAILED = exception("RuntimeError", "quant workspace creation failed", frame="create")
QUANT_TEXT = (
    "Failed to initialize FlashInfer allreduce quantization fusion workspace with "
    "backend=trtllm (RuntimeError: quant workspace creation failed); quantization fusion is "
    "disabled and startup continues with the plain allreduce fusion on backend=trtllm. Fix what "
    "stopped the workspace from being created, or turn quantization fusion off in the engine "
    "configuration."
)


def quant_rank(
    rank: int, outcome: str, *, attributes: bool = True, catch_up: bool = False
) -> list[Event]:
    """A rank whose plain workspace is trtllm and whose quantization
    workspace ends ``outcome`` (ok, unavailable, timed_out, crashed,
    cancelled), as the engine writes it. With ``catch_up``, the rank's own
    chain stopped at mnnvl and it built trtllm late, as the ranks agreed."""
    builder = RankBuilder(rank, world_size=2).run_started()
    requested = "auto" if catch_up else "trtllm"
    builder.started(ALLREDUCE_STEP, attributes={"requested": requested, "tp": 2})
    position = {"attempt": 0, "attempts": 1, "fallback_left": False}
    if catch_up:
        builder.started(
            "allreduce_workspace/mnnvl",
            kind=StepKind.ATTEMPT,
            attributes={"backend": "mnnvl", "attempt": 0, "attempts": 2, "fallback_left": True},
        )
        builder.succeeded("allreduce_workspace/mnnvl", {"backend": "mnnvl"})
        position = {"attempt": 1, "attempts": 2, "fallback_left": False, "catch_up": True}
    builder.started(
        "allreduce_workspace/trtllm",
        kind=StepKind.ATTEMPT,
        attributes={"backend": "trtllm", **position},
    )
    builder.succeeded("allreduce_workspace/trtllm", {"backend": "trtllm"})
    builder.started(QUANT_STEP, attributes={"backend": "trtllm"} if attributes else None)
    if outcome == "ok":
        builder.succeeded(QUANT_STEP, {"backend": "trtllm", "reused": True})
    elif outcome == "unavailable":
        builder.unavailable(QUANT_STEP, cause=QUANT_FAILED)
    elif outcome == "timed_out":
        builder.timed_out(QUANT_STEP, 30)
    elif outcome == "crashed":
        builder.crashed(QUANT_STEP, signal=11, stderr_tail=("Killed",))
    else:
        builder.cancelled(QUANT_STEP, "the run was interrupted")
        builder.cancelled(ALLREDUCE_STEP, "the run was interrupted")
        return builder.run_finished(RunOutcome.INTERRUPTED)
    failed = outcome != "ok"
    builder.succeeded(
        ALLREDUCE_STEP,
        {
            "enabled": True,
            "backend": "trtllm",
            "quant_backend": None if failed else "trtllm",
            "reason": None,
            "quant_reason": "the quantization fusion workspace failed" if failed else None,
            "nodes": 1,
        },
    )
    return builder.run_finished()


def test_a_failed_quantization_workspace_is_one_error_and_the_fusion_stays_ready() -> None:
    state = derive(quant_rank(0, "unavailable"))

    assert codes_of(state) == [
        "allreduce.quant_workspace_failed",
        "allreduce.workspace_ready",
        "run.ready",
    ]
    error = only(state, "allreduce.quant_workspace_failed")
    assert_rule(error)
    assert error.severity is Severity.ERROR
    assert error.scope is Scope.PROCESS
    assert error.text == QUANT_TEXT
    assert error.step == QUANT_STEP
    assert error.args == ("trtllm", "RuntimeError: quant workspace creation failed")
    assert error.printed
    assert error.detail is not None
    assert "quant workspace creation failed" in error.detail
    # Red on the quantization workspace's span; its parent is not.
    assert step_severity(state, 0, QUANT_STEP) is Severity.ERROR
    parent = step_severity(state, 0, ALLREDUCE_STEP)
    assert parent is not None
    assert parent <= Severity.INFO


def test_the_quantization_error_is_derived_when_its_step_ends() -> None:
    events = quant_rank(0, "unavailable")
    end = next(i for i, e in enumerate(events) if e.step == QUANT_STEP and e.TYPE != "step.started")
    partial = derive(events[: end + 1])
    assert codes_of(partial) == ["allreduce.quant_workspace_failed"]
    assert step_severity(partial, 0, QUANT_STEP) is Severity.ERROR


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [("timed_out", "timed out after 30 s"), ("crashed", "its process was killed by signal 11")],
)
def test_a_quantization_workspace_that_stopped_is_the_same_one_error(
    outcome: str, reason: str
) -> None:
    state = derive(quant_rank(0, outcome))

    errors = [m for m in state.messages(0) if m.severity is Severity.ERROR]
    assert [m.code for m in errors] == ["allreduce.quant_workspace_failed"]
    assert f"backend=trtllm ({reason}" in errors[0].text
    assert errors[0].detail is None
    assert codes_of(state)[-1] == "run.ready"


@pytest.mark.parametrize("outcome", ["ok", "cancelled"])
def test_a_quantization_workspace_that_worked_or_was_cancelled_says_nothing(outcome: str) -> None:
    state = derive(quant_rank(0, outcome))
    assert "allreduce.quant_workspace_failed" not in codes_of(state)
    assert step_severity(state, 0, QUANT_STEP) is None


def test_every_rank_prints_its_quantization_error_and_a_report_groups_them() -> None:
    state = derive([*quant_rank(0, "unavailable"), *quant_rank(1, "unavailable")])

    for rank in (0, 1):
        assert codes_of(state, rank).count("allreduce.quant_workspace_failed") == 1
        assert only(state, "allreduce.quant_workspace_failed", rank).printed
    [group] = [
        g for g in group_messages(state.messages()) if g.code == "allreduce.quant_workspace_failed"
    ]
    assert group.ranks == (0, 1)
    assert group.describe() == f"ERROR [ranks 0-1] {QUANT_TEXT}"


@pytest.mark.parametrize("catch_up", [False, True], ids=["own-chain", "caught-up"])
def test_an_older_log_without_the_backend_attribute_names_the_plain_backend(
    catch_up: bool,
) -> None:
    # The plain workspace is the last one this rank built: after a catch-up,
    # the backend the ranks agreed on, not the one its own chain found.
    state = derive(quant_rank(0, "unavailable", attributes=False, catch_up=catch_up))
    assert only(state, "allreduce.quant_workspace_failed").text == QUANT_TEXT


# -- generic step and run codes ------------------------------------------------


def test_timed_out_and_crashed_steps() -> None:
    builder = RankBuilder(0).run_started()
    builder.started("custom/probe")
    builder.timed_out("custom/probe", 2.5)
    builder.started("custom/isolated")
    builder.crashed("custom/isolated", signal=9, stderr_tail=("Killed",))
    state = derive(builder.run_finished())
    timed_out = only(state, "step.timed_out")
    assert_rule(timed_out)
    assert timed_out.text.startswith("Step custom/probe timed out after 2.5 s")
    crashed = only(state, "step.crashed")
    assert_rule(crashed)
    assert crashed.text == (
        "Step custom/isolated crashed: its process was killed by signal 9; "
        "last stderr line: Killed."
    )


def test_a_propagated_timeout_is_not_reported_twice() -> None:
    timeout = exception(
        "orchestrator._errors.StepTimeoutError", "step 'custom/probe' timed out after 2.5 s"
    )
    builder = RankBuilder(0).run_started()
    builder.started("custom")
    builder.started("custom/probe")
    builder.timed_out("custom/probe", 2.5)
    builder.failed("custom", timeout)
    state = derive(
        builder.run_finished(RunOutcome.FAILED, cause=timeout, failed_step="custom/probe")
    )
    assert codes_of(state) == ["step.timed_out", "run.failed"]


def test_run_outcomes() -> None:
    ready = derive(healthy_rank(0))
    message = only(ready, "run.ready")
    assert_rule(message)
    assert message.text == "Startup ready."
    assert message.step == ""

    builder = RankBuilder(0).run_started()
    builder.started(PLATFORM_STEP)
    interrupt = exception("KeyboardInterrupt", "")
    builder.failed(PLATFORM_STEP, interrupt)
    state = derive(
        builder.run_finished(RunOutcome.INTERRUPTED, cause=interrupt, failed_step="platform")
    )
    # An interruption is not a failed step.
    assert codes_of(state) == ["run.interrupted"]
    message = only(state, "run.interrupted")
    assert_rule(message)
    assert message.text.startswith("Startup interrupted by KeyboardInterrupt (step platform)")


# -- once per rank, scope ------------------------------------------------------


def test_the_same_message_twice_on_a_rank_appears_once() -> None:
    builder = RankBuilder(0).run_started()
    builder.flashinfer_comm("broken")
    builder.flashinfer_comm("broken")
    state = derive(builder.run_finished())
    assert codes_of(state).count("flashinfer_comm.unavailable") == 1
    # On another rank it is that rank's own first time.
    other = RankBuilder(1).run_started().flashinfer_comm("broken").run_finished()
    both = derive([*builder.events, *other])
    assert [m.rank for m in both.messages() if m.code == "flashinfer_comm.unavailable"] == [0, 1]


def test_two_hundred_distinct_messages_never_evict_each_other() -> None:
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    names = [f"BACKEND_{i:03d}" for i in range(200)]
    for name in names:
        builder.started(f"attention/{name}", kind=StepKind.CANDIDATE)
        builder.unavailable(f"attention/{name}", Outcome.INVALID, reasons=["no"])
    # ... and again: none of the 200 is derived a second time.
    for name in names:
        builder.started(f"attention/{name}", kind=StepKind.CANDIDATE)
        builder.unavailable(f"attention/{name}", Outcome.INVALID, reasons=["no"])
    state = derive(builder.events)
    invalid = [m for m in state.messages(0) if m.code == "attention.backend_invalid"]
    assert [m.args[0] for m in invalid] == names
    assert len(state.ranks[0].seen) == 200


def test_local_scope_prints_on_local_rank_zero_of_each_node() -> None:
    state = derive(eight_ranks_two_nodes())
    broken = [m for m in state.messages() if m.code == "zentorch.broken"]
    assert sorted(m.rank for m in broken) == list(range(8))
    assert sorted(m.rank for m in broken if m.printed) == [0, 4]


def test_global_scope_prints_on_rank_zero_only() -> None:
    state = derive(eight_ranks_two_nodes())
    ready = [m for m in state.messages() if m.code == "run.ready"]
    assert len(ready) == 8
    assert [m.rank for m in ready if m.printed] == [0]


def test_an_error_on_rank_five_prints_on_rank_five() -> None:
    # A generic failure (process scope) ...
    boom = exception("RuntimeError", "boom")
    builder = RankBuilder(5).run_started()
    builder.started("custom")
    builder.failed("custom", boom)
    state = derive(builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="custom"))
    assert all(m.printed for m in state.messages(5))
    # ... and an ERROR whose scope would hide it on rank 5 (local rank 1).
    policy = ENGINE_POLICY.with_rule("zentorch.broken", severity=Severity.ERROR)
    raised = derive(zentorch_rank("broken", rank=5).events, policy)
    assert only(raised, "zentorch.broken", rank=5).printed


def test_process_scope_prints_on_every_rank() -> None:
    # platform.fallback is a WARNING of process scope: no rank's place hides it.
    events: list[Event] = []
    for rank in range(8):
        builder = RankBuilder(rank).run_started()
        builder.cuda_platform(broken_plugin=ZENTORCH_RUNTIME)
        events.extend(builder.run_finished())
    fallbacks = [m for m in derive(events).messages() if m.code == "platform.fallback"]
    assert sorted(m.rank for m in fallbacks if m.printed) == list(range(8))


def test_a_rank_prints_every_message_until_it_knows_its_place() -> None:
    # Rank 5 is local rank 1, where zentorch.broken (local scope) is not
    # printed; before its run.started says so, the rank prints it.
    projection = Messages(slices=[ENGINE])
    events = zentorch_rank("broken", rank=5).events
    assert events[0].TYPE == "run.started"
    unplaced = projection.apply_many(projection.initial(), events[1:])
    assert only(unplaced, "zentorch.broken", rank=5).printed
    assert not only(derive(events), "zentorch.broken", rank=5).printed


def test_a_newer_policy_re_derives_from_the_same_events() -> None:
    events = eight_ranks_two_nodes()
    old = derive(events)
    newer = SeverityPolicy.from_json(
        json.dumps({"version": 2, "rules": {"zentorch.broken": {"severity": "error"}}}),
        base=ENGINE_POLICY,
    )
    new = derive(events, newer)
    before = [m for m in old.messages() if m.code == "zentorch.broken"]
    after = [m for m in new.messages() if m.code == "zentorch.broken"]
    assert {m.severity for m in before} == {Severity.WARNING}
    assert {m.severity for m in after} == {Severity.ERROR}
    assert [m.text for m in before] == [m.text for m in after]
    assert all(m.printed for m in after)
    assert step_severity(new, 3, ZENTORCH_STEP) is Severity.ERROR


# -- grouping ------------------------------------------------------------------


def test_grouping_identical_messages_across_ranks() -> None:
    groups = group_messages(derive(eight_ranks_two_nodes()).messages())
    broken = next(g for g in groups if g.code == "zentorch.broken")
    assert broken.ranks == tuple(range(8))
    assert broken.rank_text == "ranks 0-7"
    assert broken.describe().startswith("WARNING [ranks 0-7] zentorch failed to import")
    severities = [g.severity for g in groups]
    assert severities == sorted(severities, reverse=True)


def test_grouping_orders_by_severity_then_first_appearance() -> None:
    def message(code: str, severity: Severity, rank: int, text: str) -> Message:
        return Message(code=code, severity=severity, scope=Scope.PROCESS, rank=rank, text=text)

    groups = group_messages(
        [
            message("a", Severity.INFO, 0, "first info"),
            message("b", Severity.WARNING, 3, "a warning"),
            message("c", Severity.INFO, 1, "second info"),
            message("b", Severity.WARNING, 5, "a warning"),
            message("a", Severity.INFO, 2, "first info"),
        ]
    )
    assert [(g.code, g.ranks) for g in groups] == [("b", (3, 5)), ("a", (0, 2)), ("c", (1,))]


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([5], "rank 5"),
        (range(8), "ranks 0-7"),
        ([5, 0, 1, 2, 3], "ranks 0-3,5"),
        ([1, 3, 4], "ranks 1,3-4"),
        ([], "no ranks"),
    ],
)
def test_format_ranks(ranks: list[int], text: str) -> None:
    assert format_ranks(ranks) == text


def test_format_ranks_options() -> None:
    # Bare ranges (fault specs, the report's rank column) and prose.
    assert format_ranks([5, 0, 1, 2, 3], label=False) == "0-3,5"
    assert format_ranks([], label=False) == ""
    assert format_ranks([3, 0, 1, 5], separator=", ") == "ranks 0-1, 3, 5"
    # Inclusive ranges are merged with ranks and each other, never expanded.
    assert format_ranks([(4, 9), (2, 6), 11, (0, 10**12)], label=False) == "0-1000000000000"
    assert format_ranks([(0, 1), (2, 3), 5]) == "ranks 0-3,5"
    assert format_ranks([(7, 7)]) == "rank 7"


# -- folding -------------------------------------------------------------------


def test_composite_fold_equals_folding_alone() -> None:
    from events import Timeline, merge

    streams = [healthy_rank(rank) for rank in range(4)]
    merged = list(merge(streams))
    composite = fold_events(
        Composite(
            messages=Messages(slices=[ENGINE]),
            engine=RankStates([ENGINE]),
            timeline=Timeline(),
        ),
        merged,
    )
    assert composite["messages"] == fold_events(Messages(slices=[ENGINE]), merged)
    assert composite["engine"] == fold_events(RankStates([ENGINE]), merged)
    assert composite["timeline"] == fold_events(Timeline(), merged)


def test_messages_do_not_depend_on_how_ranks_interleave() -> None:
    from events import merge

    streams = [healthy_rank(rank) for rank in range(3)]
    merged = derive(list(merge(streams)))
    one_after_another = derive([event for stream in streams for event in stream])
    assert merged.ranks == one_after_another.ranks


def test_messages_of_the_same_moment_are_in_rank_order_whichever_rank_came_first() -> None:
    streams = []
    for rank in (1, 0):
        stream = EventStream(rank=rank, world_size=2).run_started()
        stream.started("probe").succeeded("probe")
        streams.extend(stream.run_finished())
    messages = fold_events(Messages(), streams).messages()
    assert len({m.wall_ns for m in messages}) == 1
    assert [m.rank for m in messages] == [0, 1]


def test_apply_never_changes_the_state_it_was_given() -> None:
    events = healthy_rank(0)
    projection = Messages(slices=[ENGINE])
    state = projection.initial()
    for event in events:
        before = attrs.evolve(state)
        snapshot = (dict(state.ranks), {r: s.messages for r, s in state.ranks.items()})
        state = projection.apply(state, event)
        assert (dict(before.ranks), {r: s.messages for r, s in before.ranks.items()}) == snapshot


def test_span_severity_falls_back_to_the_outcome() -> None:
    boom = exception("RuntimeError", "boom")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.started("attention/TRITON_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.cancelled("attention/TRITON_ATTN")
    builder.failed(ATTENTION_STEP, boom)
    events = builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN")
    state = derive(events)
    ends = {e.step: e for e in events if e.TYPE in {"step.failed", "step.cancelled"}}
    hook = step_severity_hook(events, slices=[ENGINE])
    for step, expected in [
        ("attention/FLASH_ATTN", Severity.ERROR),  # its step.failed message
        ("attention", Severity.ERROR),  # failed, no message of its own
        ("attention/TRITON_ATTN", None),  # cancelled
    ]:
        assert Messages(slices=[ENGINE]).span_severity(state, 0, step, ends[step]) is expected
        assert hook(0, step, ends[step]) is expected
    assert step_severity(state, 0, ATTENTION_STEP) is None


def test_a_step_keeps_the_highest_severity_derived_for_it() -> None:
    # The platform step says platform.detected (INFO), then platform.fallback
    # (WARNING): the later, higher one counts, and a later, lower one does not
    # lower what an earlier one raised.
    builder = RankBuilder(0).run_started()
    builder.cuda_platform(broken_plugin=ZENTORCH_RUNTIME)
    events = builder.run_finished()
    state = derive(events)
    said = [(m.code, m.severity) for m in state.messages(0) if m.step == PLATFORM_STEP]
    assert said == [("platform.detected", Severity.INFO), ("platform.fallback", Severity.WARNING)]
    assert step_severity(state, 0, PLATFORM_STEP) is Severity.WARNING
    loud = derive(events, ENGINE_POLICY.with_rule("platform.detected", severity=Severity.ERROR))
    assert step_severity(loud, 0, PLATFORM_STEP) is Severity.ERROR


def test_a_plugin_that_timed_out_is_a_failed_plugin_not_a_step_error() -> None:
    from events import fold

    builder = RankBuilder(0, world_size=1).run_started()
    builder.started(PLATFORM_STEP)
    builder.started(
        f"{PLATFORM_STEP}/tpu",
        kind=StepKind.CANDIDATE,
        attributes={"plugin": "tpu", "builtin": True, "priority": 0},
    )
    builder.timed_out(f"{PLATFORM_STEP}/tpu", timeout_s=2.0)
    builder.plugin("cpu", activated="CpuPlatform", priority=4)
    builder.platform_ok("cpu", "CpuPlatform")
    messages = fold(Messages(slices=[ENGINE]), builder.run_finished()).messages()

    by_code = {message.code: message for message in messages}
    assert "step.timed_out" not in by_code
    assert by_code["platform.plugin_failed"].text == (
        "Platform plugin tpu failed: timed out after 2 s"
    )
    fallback = by_code["platform.fallback"]
    assert fallback.severity is Severity.WARNING
    assert fallback.text.startswith(
        "Platform plugin tpu failed (timed out after 2 s); continuing on CpuPlatform."
    )


def test_a_build_target_check_that_timed_out_is_a_step_error_not_silence() -> None:
    # The build target is no plugin: its timeout (the start lost that long,
    # and the cpu plugin declined without it) is the kernel's step.timed_out.
    from events import fold

    builder = RankBuilder(0, world_size=1).run_started()
    builder.started(PLATFORM_STEP)
    builder.started(f"{PLATFORM_STEP}/build")
    builder.timed_out(f"{PLATFORM_STEP}/build", timeout_s=5.0)
    builder.plugin("cuda", activated="CudaPlatform", priority=1)
    builder.platform_ok("cuda", "CudaPlatform")
    messages = fold(Messages(slices=[ENGINE]), builder.run_finished()).messages()

    by_code = {message.code: message for message in messages}
    assert "platform.plugin_failed" not in by_code
    timed_out = by_code["step.timed_out"]
    assert timed_out.severity is Severity.ERROR
    assert timed_out.text.startswith("Step platform/build timed out after 5 s")


def test_span_severity_of_an_outcome_follows_the_last_slice() -> None:
    # A failed step no message speaks for takes step.failed's severity from
    # the slices, a severity policy laid last included.
    boom = exception("RuntimeError", "boom")
    builder = RankBuilder(0).run_started()
    builder.started(ATTENTION_STEP)
    builder.started("attention/FLASH_ATTN", kind=StepKind.CANDIDATE)
    builder.failed("attention/FLASH_ATTN", boom)
    builder.failed(ATTENTION_STEP, boom)
    events = builder.run_finished(RunOutcome.FAILED, cause=boom, failed_step="attention/FLASH_ATTN")
    end = next(e for e in events if e.TYPE == "step.failed" and e.step == ATTENTION_STEP)
    quiet = ENGINE_POLICY.with_rule("step.failed", severity=Severity.WARNING)
    for slices, expected in [
        ([ENGINE], Severity.ERROR),
        ([ENGINE, quiet.as_slice()], Severity.WARNING),
    ]:
        hook = step_severity_hook(events, slices=slices)
        assert hook(0, ATTENTION_STEP, end) is expected
