"""What SPEC promises about a run's verdict and its messages, each pinned
by a test that fails when the rule is changed: the run outcome's
precedence, the root cause's tie-break, how a failure goes up the step tree,
which rule speaks for a failure, and which variables are secret."""

from __future__ import annotations

import attrs

from events import (
    Event,
    MessageRule,
    Redactor,
    RunOutcome,
    Slice,
    Stop,
    decode_exception,
    encode_exception,
    replay,
)
from events.testing import BASE_WALL_NS, EventStream, exception_info

WORLD = 3
BOOM = exception_info("RuntimeError", "boom")
STOPPED = exception_info("orchestrator.StartupInterrupted", "received SIGTERM")


def rank(number: int, *, at_ns: int = 0) -> EventStream:
    """A rank of a world of :data:`WORLD`, started ``at_ns`` after the base."""
    return EventStream(rank=number, world_size=WORLD, wall_ns=BASE_WALL_NS + at_ns).run_started()


def ready(number: int) -> list[Event]:
    stream = rank(number)
    stream.started("probe").succeeded("probe")
    return stream.run_finished()


def failed(number: int, *, at_ns: int = 0) -> list[Event]:
    stream = rank(number, at_ns=at_ns)
    stream.started("probe").failed("probe", BOOM)
    return stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="probe")


def interrupted(number: int, *, at_ns: int = 0) -> list[Event]:
    stream = rank(number, at_ns=at_ns)
    stream.started("probe").cancelled("probe")
    return stream.run_finished(RunOutcome.INTERRUPTED, cause=STOPPED)


def unfinished(number: int) -> list[Event]:
    stream = rank(number)
    stream.started("probe")
    return stream.events


# --- the run's outcome -----------------------------------------------------------------


def test_a_rank_without_its_end_makes_the_run_incomplete_whatever_the_root_cause() -> None:
    # Rank 1 failed first, but rank 2 never finished: its story is missing.
    run = replay([ready(0), failed(1), unfinished(2)])
    assert run.outcome is RunOutcome.INCOMPLETE


def test_a_failure_the_other_ranks_were_stopped_for_is_a_failed_run() -> None:
    run = replay([ready(0), failed(1), interrupted(2, at_ns=10**9)])
    assert run.root_cause is not None
    assert run.root_cause.rank == 1
    assert run.outcome is RunOutcome.FAILED


def test_a_stop_that_made_the_other_ranks_fail_is_an_interrupted_run() -> None:
    run = replay([ready(0), failed(1, at_ns=10**9), interrupted(2)])
    assert run.root_cause is not None
    assert run.root_cause.rank == 2
    assert run.outcome is RunOutcome.INTERRUPTED


def test_every_rank_ready_is_a_ready_run() -> None:
    run = replay([ready(0), ready(1), ready(2)])
    assert run.root_cause is None
    assert run.outcome is RunOutcome.READY


def test_failures_at_the_same_moment_name_the_lowest_rank() -> None:
    run = replay([failed(2), ready(0), failed(1)])
    assert run.root_cause is not None
    assert run.root_cause.rank == 1


# --- a failure going up the step tree ----------------------------------------------------


def nested_failure(parent_cause: object, *, sibling: str = "") -> list[Event]:
    """``x/child`` fails with :data:`BOOM`; ``x`` then fails with
    ``parent_cause``; with ``sibling``, a step of that name beside the child
    starts first and succeeds after the child failed."""
    stream = EventStream().run_started()
    stream.started("x")
    if sibling:
        stream.started(f"x/{sibling}")
    stream.started("x/child")
    stream.failed("x/child", BOOM)
    if sibling:
        stream.succeeded(f"x/{sibling}")
    stream.failed("x", parent_cause)  # type: ignore[arg-type]
    return stream.run_finished(RunOutcome.FAILED, cause=parent_cause, failed_step="x")  # type: ignore[arg-type]


def test_a_failure_read_back_from_a_log_is_recognised_going_up() -> None:
    # The parent's cause is equal to the child's, not the same object: what
    # a log read back gives.
    copy = decode_exception(encode_exception(BOOM))
    assert copy == BOOM
    assert copy is not BOOM
    cause = replay(nested_failure(copy)).root_cause
    assert cause is not None
    assert cause.step == "x/child"


def test_a_sibling_whose_name_extends_the_step_is_not_its_child() -> None:
    # x/child_cache ends well after x/child failed; it is not below x/child,
    # so it neither absorbs that failure nor takes it.
    cause = replay(nested_failure(BOOM, sibling="child_cache")).root_cause
    assert cause is not None
    assert cause.step == "x/child"


def test_a_parent_failing_otherwise_after_a_child_timed_out_is_its_own_failure() -> None:
    other = exception_info("ValueError", "bad configuration")
    stream = EventStream().run_started()
    stream.started("x").started("x/slow").timed_out("x/slow", 1.0)
    stream.failed("x", other)
    events = stream.run_finished(RunOutcome.FAILED, cause=other, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    assert (cause.step, cause.exception) == ("x", other)


def test_a_timeout_going_up_stays_the_childs() -> None:
    timeout = exception_info("orchestrator.StepTimeoutError", "step 'x/slow' timed out")
    stream = EventStream().run_started()
    stream.started("x").started("x/slow").timed_out("x/slow", 1.0)
    stream.failed("x", timeout)
    events = stream.run_finished(RunOutcome.FAILED, cause=timeout, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    assert cause.step == "x/slow"


def test_a_recorded_origin_decides_what_goes_up_not_the_causes() -> None:
    # Schema 3: the parent says its failure started at the child, though
    # its cause differs (a wrapping error), so the root cause stays below.
    wrapped = exception_info("RuntimeError", "probe x gave up")
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM, origin="x/child")
    stream.failed("x", wrapped, origin="x/child")
    events = stream.run_finished(RunOutcome.FAILED, cause=wrapped, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    assert cause.step == "x/child"


def test_a_parent_recorded_as_its_own_origin_is_a_failure_of_its_own() -> None:
    # The same cause as the child's, but the parent records that its
    # failure started with it: the child's failure was absorbed.
    stream = EventStream().run_started()
    stream.started("x").started("x/child").failed("x/child", BOOM, origin="x/child")
    stream.failed("x", BOOM, origin="x")
    events = stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")
    cause = replay(events).root_cause
    assert cause is not None
    assert cause.step == "x"


def test_failures_in_two_subtrees_each_go_up_their_own_tree() -> None:
    # x/a and y/b both fail before either parent ends: x's failure going up
    # must leave y/b's on its way, so that y's names the step it started in.
    other = exception_info("ValueError", "bad configuration")
    stream = EventStream().run_started()
    stream.started("x").started("y").started("x/a").started("y/b")
    stream.failed("x/a", BOOM).failed("y/b", other)
    stream.failed("x", BOOM).failed("y", other)
    run = replay(stream.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x"))
    failed = [(m.step, m.text) for m in run.messages if m.code == "step.failed"]
    assert [step for step, _text in failed] == ["x/a", "y/b"], failed
    assert run.root_cause is not None
    assert run.root_cause.step == "x/a"


def without_spans(events: list[Event]) -> list[Event]:
    """``events`` as a log written before steps had spans records them."""
    return [attrs.evolve(event, span_id="0" * 16, parent_span_id=None) for event in events]


def test_without_spans_a_child_failure_its_parent_recovers_from_is_no_failure() -> None:
    # A log without spans: a step's place in the tree is its path, so a
    # child's failure waits for its parent, which here recovers.
    stream = EventStream().run_started()
    stream.started("x").started("x/first").failed("x/first", BOOM).succeeded("x")
    run = replay(without_spans(stream.run_finished()))
    assert run.outcome is RunOutcome.READY
    assert run.root_cause is None
    assert not [m for m in run.messages if m.code == "step.failed"]
    # ... and one it does not recover from settles on the child.
    failing = EventStream().run_started()
    failing.started("x").started("x/first").failed("x/first", BOOM).failed("x", BOOM)
    events = failing.run_finished(RunOutcome.FAILED, cause=BOOM, failed_step="x")
    cause = replay(without_spans(events)).root_cause
    assert cause is not None
    assert cause.step == "x/first"


def test_a_recorded_stop_is_said_and_a_cause_of_that_name_alone_is_not() -> None:
    said = EventStream().run_started()
    said.started("probe").cancelled("probe")
    stop = Stop(signal="SIGTERM", reason="its launcher (pid 12) exited")
    texts = [m.text for m in replay(said.run_finished(RunOutcome.INTERRUPTED, stop=stop)).messages]
    assert any(
        text.startswith("Startup interrupted (received SIGTERM: its launcher (pid 12) exited)")
        for text in texts
    ), texts
    # A schema-3 end without ``stop`` is interrupted by its cause, whatever
    # the cause's type is called.
    unsaid = EventStream().run_started()
    unsaid.started("probe").cancelled("probe")
    events = unsaid.run_finished(RunOutcome.INTERRUPTED, cause=STOPPED)
    texts = [m.text for m in replay(events).messages]
    assert any(text.startswith("Startup interrupted by StartupInterrupted") for text in texts)


# --- which rule speaks for a failure ------------------------------------------------------


def messages_of(events: list[Event], *rules: MessageRule) -> list[tuple[str, str]]:
    run = replay(events, slices=[Slice(name="mine", rules=rules)])
    return [(message.code, message.step) for message in run.messages]


def test_a_failed_rule_speaks_where_the_failure_started_not_on_the_way_up() -> None:
    rule = MessageRule(code="mine.boom", step="*", text="It broke: {error}")
    spoken = messages_of(nested_failure(BOOM), rule)
    assert [step for code, step in spoken if code == "mine.boom"] == ["x/child"]
    assert ("step.failed", "x/child") not in spoken


def test_a_rule_for_another_outcome_leaves_the_failure_to_the_kernel() -> None:
    rule = MessageRule(
        code="mine.missing", step="x/child", outcomes="unavailable", text="Missing: {reason}"
    )
    spoken = messages_of(nested_failure(BOOM), rule)
    assert ("step.failed", "x/child") in spoken
    assert not any(code == "mine.missing" for code, _step in spoken)


# --- secrets ---------------------------------------------------------------------------


def test_secret_variable_names_are_matched_in_any_case() -> None:
    redact = Redactor.from_environment(
        {"github_token": "ghp-lower-case", "Db_Password": "hunter2-mixed", "PATH": "/usr/bin"}
    )
    text = redact("token ghp-lower-case, password hunter2-mixed, path /usr/bin")
    assert text == "token [REDACTED], password [REDACTED], path /usr/bin"


def test_a_secret_of_four_characters_is_hidden_and_one_of_three_is_not() -> None:
    redact = Redactor.from_environment({"API_KEY": "k3y9", "PIN_SECRET": "123"})
    assert redact("key k3y9, pin 123") == "key [REDACTED], pin 123"
