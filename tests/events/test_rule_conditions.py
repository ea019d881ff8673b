"""Message rules with conditions on what a step recorded (``when``), with
defaults for the values a log lacks, tried in order (the first that matches
speaks). Built on ``events.testing`` alone: no engine."""

from __future__ import annotations

import attrs
import pytest

from events import (
    Event,
    JsonValue,
    Message,
    MessageRule,
    Messages,
    Outcome,
    RunOutcome,
    Severity,
    Slice,
    StepKind,
    StepStarted,
    StepUnavailable,
    fold,
    replay,
)
from events.testing import EventStream, exception_info

BOOM = exception_info("RuntimeError", "boom")


def workspace(result: JsonValue, *, attributes: dict[str, JsonValue] | None = None) -> list[Event]:
    stream = EventStream().run_started()
    stream.started("workspace", attributes=attributes)
    stream.succeeded("workspace", result)
    return stream.run_finished()


def loader(*, cause: bool, attributes: dict[str, JsonValue] | None = None) -> list[Event]:
    stream = EventStream().run_started()
    stream.started("loader", attributes=attributes)
    if cause:
        stream.unavailable("loader", cause=exception_info("ImportError", "no module named x"))
    else:
        stream.unavailable("loader", reasons=["not configured"])
    return stream.run_finished()


def messages(events: list[Event], *rules: MessageRule) -> list[Message]:
    slice_ = Slice(name="mine", steps=("workspace", "loader", "model"), rules=rules)
    found = fold(Messages(slices=[slice_]), events).messages()
    return [m for m in found if not m.code.startswith("run.")]


READY = MessageRule(
    code="mine.ready",
    step="workspace",
    outcomes=Outcome.OK,
    when={"result.enabled": True},
    text="Workspace ready on {result[backend]}",
    defaults={"result.backend": "an unknown backend"},
)


def test_a_result_condition_speaks_only_when_the_result_says_so() -> None:
    (ready,) = messages(workspace({"enabled": True, "backend": "nccl"}), READY)
    assert ready.text == "Workspace ready on nccl"
    assert messages(workspace({"enabled": False, "backend": "nccl"}), READY) == []
    assert messages(workspace({"backend": "nccl"}), READY) == []
    assert messages(workspace(None), READY) == []


def test_a_bool_condition_is_not_met_by_a_number() -> None:
    # JSON's true and 1 are different values, though Python's True == 1.
    assert messages(workspace({"enabled": 1, "backend": "nccl"}), READY) == []


def test_a_default_stands_for_a_missing_empty_or_non_text_value() -> None:
    for result in (
        {"enabled": True},
        {"enabled": True, "backend": ""},
        {"enabled": True, "backend": 7},
    ):
        (ready,) = messages(workspace(result), READY)
        assert ready.text == "Workspace ready on an unknown backend", result


def test_a_default_is_a_template_over_the_event_fields() -> None:
    rule = MessageRule(
        code="mine.plugin",
        step="loader",
        outcomes=Outcome.UNAVAILABLE,
        text="Plugin {attributes[plugin]} is unavailable: {reason}",
        defaults={"attributes.plugin": "{name}"},
    )
    (named,) = messages(loader(cause=False, attributes={"plugin": "acme"}), rule)
    assert named.text == "Plugin acme is unavailable: not configured"
    (unnamed,) = messages(loader(cause=False), rule)
    assert unnamed.text == "Plugin loader is unavailable: not configured"


def test_an_attribute_condition_reads_the_steps_start() -> None:
    rule = MessageRule(
        code="mine.fast_ready",
        step="workspace",
        outcomes=Outcome.OK,
        when={"attributes.mode": "fast"},
        text="Fast workspace ready",
    )
    assert [m.code for m in messages(workspace(None, attributes={"mode": "fast"}), rule)] == [
        "mine.fast_ready"
    ]
    assert messages(workspace(None, attributes={"mode": "slow"}), rule) == []
    assert messages(workspace(None), rule) == []


def test_the_first_rule_that_matches_speaks_and_the_later_ones_do_not() -> None:
    with_cause = MessageRule(
        code="mine.loader_broken",
        step="loader",
        outcomes=Outcome.UNAVAILABLE,
        when={"cause": True},
        text="Loader import failed: {message}",
    )
    general = MessageRule(
        code="mine.loader_unavailable",
        step="loader",
        outcomes=Outcome.UNAVAILABLE,
        text="Loader unavailable: {reason}",
    )
    (broken,) = messages(loader(cause=True), with_cause, general)
    assert (broken.code, broken.text) == (
        "mine.loader_broken",
        "Loader import failed: no module named x",
    )
    (plain,) = messages(loader(cause=False), with_cause, general)
    assert (plain.code, plain.text) == (
        "mine.loader_unavailable",
        "Loader unavailable: not configured",
    )
    # In the other order the general rule always speaks first.
    assert [m.code for m in messages(loader(cause=True), general, with_cause)] == [
        "mine.loader_unavailable"
    ]


def test_a_cause_condition_of_false_speaks_only_without_an_exception() -> None:
    rule = MessageRule(
        code="mine.declined",
        step="loader",
        outcomes=Outcome.UNAVAILABLE,
        when={"cause": False},
        text="Loader declined: {reason}",
    )
    assert [m.code for m in messages(loader(cause=False), rule)] == ["mine.declined"]
    assert messages(loader(cause=True), rule) == []


def failed_model(attributes: dict[str, JsonValue] | None) -> list[Event]:
    stream = EventStream().run_started()
    stream.started("model", attributes=attributes)
    stream.failed("model", BOOM)
    return stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="model")


def test_a_failure_rule_whose_condition_fails_leaves_the_failure_to_step_failed() -> None:
    rule = MessageRule(
        code="mine.gpu_model_failed",
        step="model",
        when={"attributes.device": "gpu"},
        exception="RuntimeError",
        text="The GPU model failed: {message}",
        severity=Severity.ERROR,
    )
    assert [m.code for m in messages(failed_model({"device": "gpu"}), rule)] == [
        "mine.gpu_model_failed"
    ]
    # The rule does not speak for a CPU model, so the generic message does.
    assert [m.code for m in messages(failed_model({"device": "cpu"}), rule)] == ["step.failed"]


def test_a_message_condition_matches_the_causes_message_as_a_pattern() -> None:
    # A log whose exception type alone does not tell which failure it was.
    rule = MessageRule(
        code="mine.model_missing",
        step="model",
        exception="RuntimeError",
        when={"message": "bo*"},
        text="{message}",
        severity=Severity.ERROR,
    )
    (said,) = messages(failed_model(None), rule)
    assert (said.code, said.text, said.detail) == ("mine.model_missing", "boom", BOOM.format())
    other = attrs.evolve(rule, when={"message": "boo?m"})
    assert [m.code for m in messages(failed_model(None), other)] == ["step.failed"]
    # Without a cause there is no message to match.
    declined = attrs.evolve(
        rule, step="loader", outcomes=Outcome.UNAVAILABLE, exception=None, when={"message": "*"}
    )
    assert messages(loader(cause=False), declined) == []
    assert [m.code for m in messages(loader(cause=True), declined)] == ["mine.model_missing"]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("when", {"enabled": True}, "'enabled'"),
        ("when", {"result.a.b": 1}, "'result.a.b'"),
        ("when", {"cause": "yes"}, "when['cause'] is 'yes'"),
        ("when", {"message": 3}, "when['message'] is 3"),
        ("defaults", {"reason": "x"}, "'reason'"),
        ("defaults", {"cause": "x"}, "'cause'"),
    ],
)
def test_a_condition_or_default_on_something_not_recorded_is_named(
    field: str, value: dict[str, JsonValue], named: str
) -> None:
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        MessageRule(code="mine.x", step="x", text="x", **{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("template", "fault"),
    [
        ("{nope", "expected '}' before end of string"),
        ("{result.platform}", "{result.platform} names no field"),
        ("{nosuch}", "{nosuch} names no field"),
        ("{}", "{} names no field"),
        ("{result[a][b]}", "only result and attributes take a key, and one"),
        ("{step[0]}", "only result and attributes take a key, and one"),
        ("{reason:>10}", "a field takes no format spec"),
    ],
)
def test_a_template_that_cannot_render_is_refused_when_the_rule_is_made(
    template: str, fault: str
) -> None:
    with pytest.raises(ValueError, match=r"MessageRule 'mine\.x': text ") as caught:
        MessageRule(code="mine.x", step="loader", text=template)
    assert fault in str(caught.value)
    for where in ({"args": (template,)}, {"defaults": {"attributes.plugin": template}}):
        with pytest.raises(ValueError, match=r"MessageRule 'mine\.x': (args|defaults)"):
            MessageRule(code="mine.x", step="loader", text="x", **where)  # type: ignore[arg-type]


def test_every_field_a_template_may_name_renders() -> None:
    rule = MessageRule(
        code="mine.all",
        step="loader",
        outcomes=Outcome.UNAVAILABLE,
        text="{step}|{name}|{parent}|{outcome}|{verb}|{reason}|{error}|{message!r}|"
        "{result[x]}|{attributes[plugin]}",
    )
    (message,) = messages(loader(cause=True, attributes={"plugin": "acme"}), rule)
    assert message.text == (
        "loader|loader||unavailable|unavailable|ImportError: no module named x|"
        "ImportError: no module named x|'no module named x'|-|acme"
    )


def test_a_slice_of_something_else_is_named_where_it_is_made_or_passed() -> None:
    with pytest.raises(
        TypeError, match=r"Slice rules\[1\] is 'mine\.x', not an events\.MessageRule"
    ):
        Slice(name="mine", rules=[READY, "mine.x"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"Slice columns\[0\] is 'KERNELS', not an events\.Column"):
        Slice(name="mine", columns=["KERNELS"])  # type: ignore[list-item]
    # An import path, as the command line's --slice takes it, is not a slice.
    with pytest.raises(TypeError, match=r"slices\[0\] is 'my_engine\.slices:MINE', not an"):
        replay(workspace(None), slices=["my_engine.slices:MINE"])  # type: ignore[list-item]


def test_two_rules_for_one_code_with_different_severities_are_refused() -> None:
    # A code has one severity: the second rule's would silently be the first's too.
    loud = MessageRule(code="mine.x", step="a", text="a", severity=Severity.ERROR)
    quiet = MessageRule(code="mine.x", step="b", text="b", severity=Severity.DEBUG)
    with pytest.raises(ValueError, match=r"two rules for code 'mine\.x' differ .*ERROR.*DEBUG"):
        Slice(name="mine", rules=[loud, quiet])
    # The same code for several steps, with one severity, is fine.
    same = MessageRule(code="mine.x", step="b", text="b", severity=Severity.ERROR)
    assert Slice(name="mine", rules=[loud, same]).code_rules() == {
        "mine.x": (Severity.ERROR, loud.scope)
    }


def test_an_unknown_or_empty_outcomes_is_refused_with_the_valid_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown outcome 'exploded' in MessageRule outcomes; valid: ok,"
    ):
        MessageRule(code="mine.x", step="x", text="x", outcomes=["failed", "exploded"])
    with pytest.raises(ValueError, match=r"outcomes is empty: the rule would never speak"):
        MessageRule(code="mine.x", step="x", text="x", outcomes=[])


def test_a_rule_without_a_code_is_refused() -> None:
    for code in ("", "  ", None):
        with pytest.raises(ValueError, match=r"MessageRule code is .*: give the stable code"):
            MessageRule(code=code, step="x", text="x")  # type: ignore[arg-type]


def test_a_kind_condition_speaks_for_candidates_and_not_for_their_siblings() -> None:
    stream = EventStream().run_started()
    stream.started("backend")
    stream.started("backend/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    stream.unavailable("backend/fast", Outcome.ABSENT, reasons=["not installed"])
    stream.started("backend/build")
    stream.unavailable("backend/build", Outcome.ABSENT, reasons=["no target"])
    stream.succeeded("backend")
    rule = MessageRule(
        code="mine.declined",
        step="backend/*",
        outcomes=Outcome.ABSENT,
        when={"kind": "candidate"},
        text="Backend {attributes[candidate]} declined: {reason}",
    )
    slice_ = Slice(name="mine", steps=("backend", "backend/*"), rules=(rule,))
    found = fold(Messages(slices=[slice_]), stream.run_finished()).messages()
    assert [m.text for m in found if m.code == "mine.declined"] == [
        "Backend fast declined: not installed"
    ]
    with pytest.raises(ValueError, match=r"when\['kind'\] is 'probe': give one of 'step'"):
        MessageRule(code="mine.x", step="x", text="x", when={"kind": "probe"})


def chain(first: str, *, then: bool = True, cause: bool = False, left: bool = True) -> list[Event]:
    """A fallback chain under ``warmup``: ``graph`` ends ``first`` with a
    fallback left (unless ``left`` is false), then ``eager`` runs (unless
    ``then`` is false: the run is interrupted between the two)."""
    stream = EventStream().run_started()
    stream.started("warmup")
    stream.started(
        "warmup/graph", kind=StepKind.ATTEMPT, attributes={"fallback_left": left, "mode": "cuda"}
    )
    if first == "timed_out":
        stream.timed_out("warmup/graph", timeout_s=2.0)
    else:
        stream.unavailable(
            "warmup/graph",
            Outcome(first),
            cause=BOOM if cause else None,
            reasons=[] if cause else ["no graphs here"],
        )
    if not then:
        stream.cancelled("warmup", "interrupted")
        return stream.run_finished(RunOutcome.INTERRUPTED)
    stream.started("warmup/eager", kind=StepKind.ATTEMPT, attributes={"fallback_left": False})
    stream.succeeded("warmup/eager")
    stream.succeeded("warmup")
    return stream.run_finished()


FALLBACK = MessageRule(
    code="mine.eager",
    fallback=True,
    step="warmup/*",
    outcomes=(Outcome.UNAVAILABLE, Outcome.INVALID, Outcome.TIMED_OUT),
    text="{attributes[mode]} graphs {verb} ({reason}); running {next_name} ({next}) instead",
    args=("{name}", "{next_name}"),
    severity=Severity.WARNING,
)


def test_a_fallback_rule_speaks_when_the_next_attempt_starts_and_names_it() -> None:
    events = chain("unavailable")
    slice_ = Slice(name="mine", rules=(FALLBACK,))
    state = fold(Messages(slices=[slice_]), events)
    (message,) = [m for m in state.messages() if not m.code.startswith("run.")]
    assert message.code == "mine.eager"
    assert message.text == (
        "cuda graphs unavailable (no graphs here); running eager (warmup/eager) instead"
    )
    assert (message.step, message.args, message.severity) == (
        "warmup/graph",
        ("graph", "eager"),
        Severity.WARNING,
    )
    ended = next(e for e in events if isinstance(e, StepUnavailable))
    next_started = next(
        e for e in events if isinstance(e, StepStarted) and e.step == "warmup/eager"
    )
    assert message.seqs == (ended.seq, next_started.seq)
    # The slice's rule speaks instead of the kernel's, though the slice
    # claims no step; the kernel's speaks without it, and not on a step a
    # slice claims.
    assert "fallback.used" not in [m.code for m in state.messages()]
    claimed = Slice(name="mine", steps=("warmup/*",))
    assert "fallback.used" not in [
        m.code for m in fold(Messages(slices=[claimed]), events).messages()
    ]
    (generic,) = [m for m in fold(Messages(), events).messages() if m.code == "fallback.used"]
    assert generic.text == (
        "Step warmup/graph unavailable (no graphs here); falling back to warmup/eager."
    )
    assert generic.args == ("warmup/graph", "no graphs here", "warmup/eager")


def test_a_fallback_rule_leaves_timeouts_to_step_timed_out_and_unmatched_outcomes_alone() -> None:
    slice_ = Slice(name="mine", rules=(FALLBACK,))
    timed_out = fold(Messages(slices=[slice_]), chain("timed_out")).messages()
    assert [m.code for m in timed_out] == ["step.timed_out", "mine.eager", "run.ready"]
    assert timed_out[1].text.startswith("cuda graphs timed out (timed out after 2 s)")
    # An outcome the rule does not name is the kernel's again.
    absent = fold(Messages(slices=[slice_]), chain("absent")).messages()
    assert [m.code for m in absent] == ["fallback.used", "run.ready"]


def test_a_fallback_rule_attaches_the_cause_only_with_detail() -> None:
    slice_ = Slice(name="mine", rules=(FALLBACK,))
    (with_cause,) = [
        m
        for m in fold(Messages(slices=[slice_]), chain("unavailable", cause=True)).messages()
        if m.code == "mine.eager"
    ]
    assert with_cause.exception is not None
    assert with_cause.exception.message == "boom"
    quiet = Slice(name="mine", rules=(attrs.evolve(FALLBACK, detail=False),))
    (without,) = [
        m
        for m in fold(Messages(slices=[quiet]), chain("unavailable", cause=True)).messages()
        if m.code == "mine.eager"
    ]
    assert without.exception is None
    # The kernel's fallback.used names the reason without the traceback.
    (generic,) = [
        m
        for m in fold(Messages(), chain("unavailable", cause=True)).messages()
        if m.code == "fallback.used"
    ]
    assert generic.exception is None


def test_a_chain_that_stops_before_the_next_attempt_says_no_fallback() -> None:
    slice_ = Slice(name="mine", rules=(FALLBACK,))
    state = fold(Messages(slices=[slice_]), chain("unavailable", then=False))
    assert [m.code for m in state.messages()] == ["run.interrupted"]
    # The attempt's span still says what the rule would have.
    assert state.ranks[0].severities["warmup/graph"] is Severity.WARNING
    # An attempt that had no fallback left is not fallen back from, whatever
    # starts next.
    last = fold(Messages(slices=[slice_]), chain("unavailable", left=False))
    assert [m.code for m in last.messages()] == ["run.ready"]
    assert "warmup/graph" not in last.ranks[0].severities


def test_a_fallback_rule_for_a_success_or_a_next_attempt_outside_one_is_refused() -> None:
    # By default a fallback rule speaks for every way an attempt can fail
    # (a plain rule: for failed alone).
    rule = MessageRule(code="mine.x", step="x", text="x", fallback=True)
    assert rule.outcomes == set(Outcome) - {Outcome.OK, Outcome.CANCELLED}
    assert MessageRule(code="mine.x", step="x", text="x").outcomes == {Outcome.FAILED}
    with pytest.raises(ValueError, match="not one that ended ok; drop it from outcomes"):
        MessageRule(code="mine.x", step="x", text="x", fallback=True, outcomes=Outcome.OK)
    with pytest.raises(ValueError, match=r"\{next\} is the next attempt's: only a fallback"):
        MessageRule(code="mine.x", step="x", text="then {next}")
