"""The generic kernel and slices: generic messages for any graph, message
rules and columns declared as data, precedence of a slice's rules, and
``events`` and ``exporters`` kept free of the orchestrator (the engine's
own slice is tested with the engine, in its ``test_slice.py``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from events import (
    Agreement,
    Column,
    Event,
    ExceptionInfo,
    FrameInfo,
    JsonlLog,
    MessageRule,
    Messages,
    Outcome,
    RunOutcome,
    Scope,
    Severity,
    SeverityPolicy,
    Slice,
    StallReason,
    StepKind,
    fold,
    merge,
    replay,
)
from events.testing import EventStream, exception_info
from exporters import report_json, report_text

ROOT = Path(__file__).resolve().parents[2]

DENIED = exception_info("PermissionError", "[Errno 13] Permission denied: '/cache'", errno=13)
BOOM = exception_info(
    "RuntimeError", "boom", cause=exception_info("my_lib.CacheError", "disk full")
)


def custom_rank(
    rank: int = 0, *, cache: str = "ok", kernels: str = "fast", world_size: int = 1
) -> list[Event]:
    """A graph of its own: cache_dir, then kernels chosen by a candidate set
    with a fallback chain of two attempts under warmup."""
    builder = EventStream(rank=rank, world_size=world_size).run_started()
    builder.started("cache_dir")
    if cache == "ok":
        builder.succeeded("cache_dir", {"cache_dir": "/cache"})
    elif cache == "denied":
        builder.unavailable("cache_dir", cause=DENIED)
    else:
        builder.failed("cache_dir", BOOM)
        return builder.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="cache_dir")
    builder.started("kernels")
    builder.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    builder.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    if kernels == "fast":
        builder.succeeded("kernels/fast", {"candidate": "fast"})
    else:
        builder.unavailable("kernels/fast", Outcome.INVALID, reasons=["head size 7"])
    builder.succeeded("kernels/slow", {"candidate": "slow"})
    builder.succeeded("kernels", {"selected": kernels})
    builder.started("warmup")
    builder.started("warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": True})
    builder.timed_out("warmup/graph", timeout_s=2.0)
    builder.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    builder.succeeded("warmup/eager")
    builder.succeeded("warmup")
    return builder.run_finished()


MY_SLICE = Slice(
    name="mine",
    steps=("kernels/*",),
    rules=[
        MessageRule(
            code="mine.cache_denied",
            step="cache_dir",
            outcomes="unavailable",
            exception="PermissionError",
            severity=Severity.WARNING,
            text="Cache {result[missing]} denied ({error}) at {attributes[nothing]}",
        ),
        MessageRule(
            code="mine.cache_full",
            step="cache_dir",
            exception="my_lib.CacheError",
            severity=Severity.ERROR,
            text="The cache disk is full: {message}",
            args=("{step}",),
        ),
        MessageRule(code="mine.kernels", step="kernels", outcomes="ok", text="{result[selected]}"),
    ],
    columns=[
        Column(title="KERNELS", fact="kernels", step="kernels", key="selected"),
        Column(title="CACHE", fact="cache", step="cache_dir", key="cache_dir"),
    ],
    agreements=[
        Agreement(code="mine.divergence", fact="kernels", what="Kernels differ", advice="pin"),
    ],
    severities={"mine.divergence": (Severity.WARNING, Scope.GLOBAL)},
)


def codes(events: list[Event], *slices: Slice) -> list[str]:
    return [m.code for m in fold(Messages(slices=slices), events).messages()]


def test_a_graph_without_rules_gets_the_generic_messages() -> None:
    state = fold(Messages(), custom_rank(kernels="slow"))
    by_code = {m.code: m for m in state.messages()}
    assert list(by_code) == [
        "candidate.unavailable",
        "step.timed_out",
        "fallback.used",
        "run.ready",
    ]
    unavailable = by_code["candidate.unavailable"]
    assert unavailable.text == "Candidate kernels/fast is invalid: head size 7"
    assert (unavailable.severity, unavailable.step) == (Severity.DEBUG, "kernels/fast")
    fallback = by_code["fallback.used"]
    assert fallback.text == (
        "Step warmup/graph timed out (timed out after 2 s); falling back to warmup/eager."
    )
    assert (fallback.severity, fallback.step) == (Severity.WARNING, "warmup/graph")

    failed = fold(Messages(), custom_rank(cache="failed")).messages()
    assert [m.code for m in failed] == ["step.failed", "run.failed"]
    assert failed[0].text == (
        "Step cache_dir failed: RuntimeError: boom, caused by CacheError; "
        "the error propagated and stopped the startup."
    )


def test_a_candidate_without_reasons_is_said_unavailable_by_its_cause_else_its_outcome() -> None:
    def said(cause: ExceptionInfo | None) -> str:
        stream = EventStream().run_started()
        stream.started("platform").started("platform/zen", kind=StepKind.CANDIDATE)
        stream.unavailable("platform/zen", cause=cause, reasons=()).succeeded("platform")
        (message,) = [
            m
            for m in fold(Messages(), stream.run_finished()).messages()
            if m.code == "candidate.unavailable"
        ]
        return message.text

    missing = exception_info("ImportError", "No module named 'zentorch'")
    assert said(missing) == (
        "Candidate platform/zen is unavailable: ImportError: No module named 'zentorch'"
    )
    assert said(None) == "Candidate platform/zen is unavailable: unavailable"


def test_a_failure_whose_message_quotes_its_root_names_the_root_once() -> None:
    def step_failed(cause: ExceptionInfo) -> str:
        stream = EventStream().run_started()
        stream.started("load").failed("load", cause)
        events = stream.run_finished(RunOutcome.FAILED, cause=cause, failed_step="load")
        (message,) = [m for m in fold(Messages(), events).messages() if m.code == "step.failed"]
        return message.text.partition("; ")[0]

    denied = exception_info("PermissionError", "denied")
    quoting = exception_info("RuntimeError", "load failed: [PermissionError: denied]", cause=denied)
    assert step_failed(quoting) == (
        "Step load failed: RuntimeError: load failed: [PermissionError: denied]"
    )
    assert step_failed(exception_info("RuntimeError")) == "Step load failed: RuntimeError"


@pytest.mark.parametrize(
    ("code", "rule"),
    [
        ("step.failed", (Severity.ERROR, Scope.PROCESS)),
        ("step.timed_out", (Severity.ERROR, Scope.PROCESS)),
        ("step.crashed", (Severity.ERROR, Scope.PROCESS)),
        ("run.ready", (Severity.INFO, Scope.GLOBAL)),
        ("run.failed", (Severity.ERROR, Scope.PROCESS)),
        ("run.interrupted", (Severity.ERROR, Scope.PROCESS)),
    ],
)
def test_the_kernels_codes_have_the_severity_and_scope_of_the_code_table(
    code: str, rule: tuple[Severity, Scope]
) -> None:
    # SPEC §3.6: a graph without slices speaks with these.
    assert Messages().rule(code) == rule


def test_a_generic_message_gives_every_reason_and_the_last_stderr_line() -> None:
    builder = EventStream().run_started()
    builder.started("kernels/fast", kind=StepKind.CANDIDATE)
    builder.unavailable("kernels/fast", Outcome.INVALID, reasons=["head size 7", "no fp8"])
    builder.started("warmup")
    builder.crashed(
        "warmup", exit_code=1, signal=None, stderr_tail=["loading", "Illegal instruction"]
    )
    texts = {m.code: m.text for m in fold(Messages(), builder.events).messages()}
    assert texts["candidate.unavailable"] == (
        "Candidate kernels/fast is invalid: head size 7; no fp8"
    )
    assert texts["step.crashed"] == (
        "Step warmup crashed: its process exited with code 1; "
        "last stderr line: Illegal instruction."
    )


def stalled_twice(rank: int) -> list[Event]:
    """A rank of two nodes of two whose step warmup stalls twice."""
    builder = EventStream(rank=rank, world_size=4, local_world_size=2).run_started()
    builder.started("warmup").stalled("warmup", 10.0).stalled("warmup", 20.0)
    return builder.events


def test_a_step_past_the_stall_threshold_is_one_info_line_printed_once_a_node() -> None:
    state = fold(Messages(), stalled_twice(0) + stalled_twice(1) + stalled_twice(2))
    stalls = [m for m in state.messages() if m.code == "step.stalled"]
    assert [(m.rank, m.severity, m.printed) for m in stalls] == [
        (0, Severity.INFO, True),
        (1, Severity.INFO, False),
        (2, Severity.INFO, True),
    ]
    assert stalls[0].text == (
        "Step warmup is still running after 10.0 s, waiting in wait_for_fabric (fabric.py:42)."
    )


def test_where_a_timed_out_or_abandoned_step_waited_is_no_stall_message() -> None:
    builder = EventStream().run_started()
    builder.started("warmup").stalled("warmup", 5.0, why=StallReason.TIMED_OUT)
    builder.timed_out("warmup", timeout_s=5.0)
    builder.started("cache_dir").stalled("cache_dir", 1.0, why=StallReason.ABANDONED)
    builder.cancelled("cache_dir")
    messages = fold(Messages(), builder.events).messages()
    assert [m.code for m in messages] == ["step.timed_out"]
    assert "waiting in wait_for_fabric (fabric.py:42)" in messages[0].text


def test_rules_match_outcome_and_exception_type_and_render_templates() -> None:
    denied = fold(Messages(slices=[MY_SLICE]), custom_rank(cache="denied")).messages()
    (message,) = [m for m in denied if m.code == "mine.cache_denied"]
    assert message.text == (
        "Cache - denied (PermissionError: [Errno 13] Permission denied: '/cache') at -"
    )
    assert (message.severity, message.args) == (Severity.WARNING, (message.text,))
    assert message.detail is not None

    # The type anywhere in the cause chain, by its qualified name; the rule
    # speaks instead of the generic step.failed.
    failed = fold(Messages(slices=[MY_SLICE]), custom_rank(cache="failed")).messages()
    assert [m.code for m in failed] == ["mine.cache_full", "run.failed"]
    assert failed[0].text == "The cache disk is full: boom"
    assert failed[0].args == ("cache_dir",)
    assert "mine.cache_full" not in codes(custom_rank(cache="denied"), MY_SLICE)


def test_a_slice_claims_its_steps_and_a_policy_overrides_its_codes() -> None:
    derived = codes(custom_rank(kernels="slow"), MY_SLICE)
    assert "candidate.unavailable" not in derived, "kernels/* is the slice's"
    assert derived[0] == "mine.kernels"
    policy = SeverityPolicy().with_rule("mine.kernels", severity=Severity.ERROR)
    state = fold(Messages(slices=[MY_SLICE, policy.as_slice()]), custom_rank())
    (kernels,) = [m for m in state.messages() if m.code == "mine.kernels"]
    assert kernels.severity is Severity.ERROR


def test_a_qualified_exception_type_is_not_matched_by_the_same_name_elsewhere() -> None:
    elsewhere = exception_info(
        "RuntimeError", "boom", cause=exception_info("other_lib.CacheError", "disk full")
    )
    builder = EventStream().run_started()
    builder.started("cache_dir").failed("cache_dir", elsewhere)
    events = builder.run_finished(RunOutcome.FAILED, cause=elsewhere, failed_step="cache_dir")
    assert codes(events, MY_SLICE) == ["step.failed", "run.failed"]


def test_a_step_one_slice_claims_gets_no_generic_message_beside_a_slice_claiming_none() -> None:
    policy = SeverityPolicy().with_rule("mine.kernels", severity=Severity.ERROR)
    derived = codes(custom_rank(kernels="slow"), MY_SLICE, policy.as_slice())
    assert "mine.kernels" in derived
    assert "candidate.unavailable" not in derived, "kernels/* is the first slice's"


def test_a_severity_or_scope_is_taken_by_name_and_a_bad_one_is_named() -> None:
    # As a policy file writes them: "warning", "local".
    rule = MessageRule(code="mine.x", step="x", text="x", severity="warning", scope="LOCAL")
    assert (rule.severity, rule.scope) == (Severity.WARNING, Scope.LOCAL)
    policy = SeverityPolicy().with_rule("mine.x", severity="error")  # type: ignore[arg-type]
    assert policy.rules["mine.x"][0] is Severity.ERROR
    with pytest.raises(ValueError, match=r"unknown severity 'loud'; valid: debug, info, warning"):
        MessageRule(code="mine.x", step="x", text="x", severity="loud")
    with pytest.raises(ValueError, match=r"unknown scope 'everywhere'; valid: process, local"):
        MessageRule(code="mine.x", step="x", text="x", scope="everywhere")
    with pytest.raises(ValueError, match=r"unknown severity 31 in code 'mine\.x'; valid: debug"):
        Slice(name="mine", severities={"mine.x": (31, Scope.LOCAL)})
    with pytest.raises(
        ValueError, match=r"rule of code 'mine\.x' is 'error': give \(severity, scope"
    ):
        Slice(name="mine", severities={"mine.x": "error"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"is \('error',\): give \(severity, scope"):
        Slice(name="mine", severities={"mine.x": ("error",)})  # type: ignore[dict-item]


def test_a_slices_severities_entry_wins_over_its_rule_for_the_same_code() -> None:
    rule = MessageRule(code="mine.x", step="x", text="x", severity=Severity.WARNING)
    mine = Slice(name="mine", rules=(rule,), severities={"mine.x": (Severity.ERROR, Scope.GLOBAL)})

    assert mine.code_rules()["mine.x"] == (Severity.ERROR, Scope.GLOBAL)
    assert Slice(name="mine", rules=(rule,)).code_rules()["mine.x"] == (
        Severity.WARNING,
        rule.scope,
    )


def test_columns_agreements_and_the_report_come_from_the_slices() -> None:
    streams = [
        custom_rank(0, world_size=3),
        custom_rank(1, world_size=3),
        custom_rank(2, kernels="slow", world_size=3),
    ]
    result = replay(list(merge(streams)), slices=[MY_SLICE])
    assert result.states[2].facts == {"kernels": "slow", "cache": "/cache"}
    (divergence,) = result.divergences
    assert divergence.code == "mine.divergence"
    assert divergence.severity is Severity.WARNING
    assert divergence.text == "Kernels differ: fast on ranks 0-1; slow on rank 2. Pin"

    text = report_text(result)
    assert "RANKS  OUTCOME  KERNELS  CACHE   LAST STEP" in text
    assert "0-1    ready    fast     /cache  warmup" in text
    document = report_json(result)
    assert list(document["ranks"][0]) == [
        "rank",
        "outcome",
        "log",
        "kernels",
        "cache",
        "last_step",
        "in_flight",
        "process",
    ]

    bare = report_text(replay(list(merge(streams))))
    assert "RANKS  OUTCOME  LAST STEP" in bare
    assert replay(list(merge(streams))).divergences == ()


def test_replaying_a_log_with_a_slice_imports_neither_the_runtime_nor_torch(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rank-0.jsonl"
    with JsonlLog(path, run_id="test-run", rank=0) as log:
        for event in custom_rank(cache="denied"):
            log.append(event)
    code = f"""
import sys
from events import MessageRule, Severity, Slice, read_log, replay
from exporters import report_text
mine = Slice(
    name="mine",
    rules=[
        MessageRule(
            code="mine.cache_denied",
            step="cache_dir",
            outcomes="unavailable",
            severity=Severity.WARNING,
            text="Cache denied ({{error}})",
        )
    ],
)
result = replay([read_log({str(path)!r})], slices=[mine])
assert "mine.cache_denied" in [m.code for m in result.messages]
report_text(result)
loaded = sorted(
    name for name in sys.modules
    if name.split(".")[0] in ("anyio", "torch", "opentelemetry", "orchestrator")
)
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_events_and_exporters_never_import_the_orchestrator() -> None:
    for package in ("events", "exporters"):
        for path in sorted((ROOT / package).glob("*.py")):
            tops = {module.split(".")[0] for module in _imports(path)}
            assert "orchestrator" not in tops, f"{package}/{path.name}"


def test_the_first_rule_that_matches_a_candidate_speaks_alone() -> None:
    # A slice that does not claim kernels/* still has its rule for a
    # candidate there tried first: it speaks, and the kernel's
    # candidate.unavailable, tried after it, does not.
    unclaimed = Slice(
        name="unclaimed",
        rules=[
            MessageRule(
                code="mine.kernel_invalid",
                step="kernels/*",
                outcomes="invalid",
                text="{name} cannot run here: {reason}",
            )
        ],
    )
    derived = fold(Messages(slices=[unclaimed]), custom_rank(kernels="slow")).messages()
    (invalid,) = [m for m in derived if m.step == "kernels/fast"]
    assert invalid.code == "mine.kernel_invalid"
    assert invalid.text == "fast cannot run here: head size 7"


def test_a_stall_where_a_slice_says_another_process_is_awaited_says_so() -> None:
    rendezvous = FrameInfo(filename="/venv/torch/distributed/c10d.py", lineno=9, name="barrier")
    builder = EventStream().run_started()
    builder.started("group").stalled("group", 10.0, waiting_in=rendezvous)
    waits = Slice(name="group", peer_waits=("*/torch/distributed/*",))

    texts = [
        [m.text for m in fold(Messages(slices=slices), builder.events).messages()]
        for slices in ((), (waits,))
    ]
    assert texts == [
        ["Step group is still running after 10.0 s, waiting in barrier (c10d.py:9)."],
        [
            "Step group is still running after 10.0 s, "
            "waiting in barrier (c10d.py:9) for another process."
        ],
    ]


def test_a_column_labels_a_value_of_the_labels_own_type_only() -> None:
    # True == 1 in Python: a label for True is not the label of 1.
    column = Column(title="FAILED", fact="failed", labels={True: "yes", False: "no"})
    assert [column.cell(value) for value in (True, False, 1, 0, None, "x")] == [
        "yes",
        "no",
        "1",
        "0",
        "-",
        "x",
    ]
