"""``explain`` shortens a long cause at a word or link boundary, with an
ellipsis, and never leaves a bracket open: the step's duration that follows
(``[953.7ms]``) must not read as part of a cut token."""

from __future__ import annotations

import re

import pytest

import events
from events import RunOutcome
from events.testing import EventStream, exception_info
from exporters import explain_text

PEER = "Connection closed by peer [127.0.0.1]:29500"
_BRACKETS = {"(": ")", "[": "]", "{": "}"}


def explained_cause(cause: events.ExceptionInfo) -> str:
    builder = EventStream(rank=0, world_size=8, local_world_size=4).run_started()
    builder.started("agree")
    builder.failed("agree", cause)
    stream = builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="agree")
    [line] = [
        line
        for line in explain_text(events.replay(stream)).splitlines()
        if "agree: failed: " in line
    ]
    summary = line.split("agree: failed: ", 1)[1]
    # The duration the view appends, then the cause as shown.
    found = re.fullmatch(r"(.*) (\[\d+(?:\.\d+)?(?:us|ms|s)\])", summary)
    return found.group(1) if found else summary


def balanced(text: str) -> bool:
    stack: list[str] = []
    for char in text:
        if char in _BRACKETS:
            stack.append(_BRACKETS[char])
        elif char in _BRACKETS.values() and (not stack or stack.pop() != char):
            return False
    return not stack


def chain(links: int, message: str = PEER) -> events.ExceptionInfo:
    cause = None
    for index in range(links):
        cause = exception_info("RuntimeError", f"{message} (link {index})", cause=cause)
    assert cause is not None
    return cause


def test_a_short_cause_is_shown_whole() -> None:
    assert explained_cause(exception_info("RuntimeError", PEER)) == f"RuntimeError: {PEER}"


@pytest.mark.parametrize("pad", range(0, 60, 3))
def test_a_long_chain_is_cut_between_tokens_never_inside_brackets(pad: int) -> None:
    # Every offset of the cut against the bracketed address.
    shown = explained_cause(chain(12, "x" * pad + " " + PEER))

    assert shown.endswith(" …"), shown
    assert len(shown) <= 300
    assert balanced(shown), shown
    assert "[1 " not in shown
    assert not re.search(r"\[[^\]]*$", shown), shown
    # Whole links and words only: what is kept is a prefix of the full text.
    kept = shown.removesuffix(" …")
    full = " <- ".join(f"RuntimeError: {'x' * pad} {PEER} (link {i})" for i in range(11, -1, -1))
    assert full.startswith(kept)
    assert full[len(kept)] in " :", full[len(kept) - 10 : len(kept) + 10]


def test_one_enormous_bracketed_token_leaves_no_open_bracket() -> None:
    shown = explained_cause(exception_info("OSError", "[" + "9" * 500 + "] " + "tail " * 10))

    assert balanced(shown), shown
    assert shown.endswith("…")
    assert len(shown) <= 300


def test_hostile_brackets_do_not_break_the_cut() -> None:
    hostile = "]] (( [[" + " word" * 100 + " {" + "z" * 50 + "}"
    shown = explained_cause(exception_info("RuntimeError", hostile))

    assert shown.endswith(" …")
    assert len(shown) <= 300
    assert "RuntimeError: ]] ((" in shown  # unmatched in the cause itself: kept as they are


def test_a_cause_of_exactly_the_limit_is_shown_whole() -> None:
    message = "b" * (300 - len("RuntimeError: "))
    assert explained_cause(exception_info("RuntimeError", message)) == f"RuntimeError: {message}"


def test_a_cut_inside_nested_brackets_goes_before_the_outermost() -> None:
    words = "a" * 260
    message = f"{words} (outer [inner token here] more) tail tail tail tail"
    assert explained_cause(exception_info("RuntimeError", message)) == f"RuntimeError: {words} …"


def test_a_step_says_what_it_chose_and_how_its_process_ended() -> None:
    # A result's empty values and its priority are no news; a crash names
    # its exit code when no signal ended it.
    stream = EventStream().run_started()
    chosen = {"backend": "FLASH", "priority": 3, "none": None, "list": [], "map": {}}
    stream.started("platform").succeeded("platform", chosen)
    stream.started("probe").crashed("probe", exit_code=3, signal=None)
    ended = stream.run_finished(RunOutcome.FAILED, failed_step="probe")
    lines = explain_text(events.replay(ended)).splitlines()
    assert lines[2:] == [
        "├─ platform: ok (backend=FLASH) [1.0ms]",
        "└─ probe: crashed (exit code 3) [1.0ms]",
    ]
