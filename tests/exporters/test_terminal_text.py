"""Text for terminals: control characters escaped, continuation lines
indented; the live logging bridge and every text view print through it,
while JSON and logs keep the exact text."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

import events
from events import FrameInfo, JsonlLog, MessageRule, RunOutcome, Severity, Slice, StepKind, read_log
from events.testing import EventStream, exception_info
from exporters import (
    LoggingBridge,
    blame_text,
    critical_path_text,
    diff_text,
    explain_text,
)
from exporters._terminal import terminal_text

#: What a hostile message may hold: clear screen, a colour, a bell, a
#: carriage return, a right-to-left override, and a forged report line.
FORGED = "Root cause: none (every rank is ready)"
HOSTILE = f"evil\x1b[2J\x1b[31m\x07\r\u202eroot\n{FORGED}"

#: Anything a terminal would act on, or that reorders or splits a line.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def assert_safe(text: str) -> None:
    """No raw control character, and no line that starts with the forgery
    (or with anything at all at the first column but the view's own)."""
    assert not RAW.search(text), RAW.search(text)
    assert not any(line.startswith(FORGED) for line in text.splitlines()), text


# --- the function -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("char", "escaped"),
    [
        ("\x00", "\\x00"),
        ("\x07", "\\x07"),  # BEL
        ("\x08", "\\x08"),  # backspace
        ("\x0b", "\\v"),
        ("\x0c", "\\f"),
        ("\r", "\\r"),
        ("\x1b", "\\x1b"),  # ESC
        ("\x1f", "\\x1f"),
        ("\x7f", "\\x7f"),  # DEL
        ("\x80", "\\x80"),  # C1
        ("\x85", "\\x85"),  # NEL, a line break to str.splitlines
        ("\x9b", "\\x9b"),  # CSI
        ("\x9f", "\\x9f"),
        ("\u2028", "\\u2028"),  # line separator
        ("\u2029", "\\u2029"),  # paragraph separator
        ("\u202a", "\\u202a"),  # LRE
        ("\u202b", "\\u202b"),  # RLE
        ("\u202c", "\\u202c"),  # PDF
        ("\u202d", "\\u202d"),  # LRO
        ("\u202e", "\\u202e"),  # RLO
        ("\u2066", "\\u2066"),  # LRI
        ("\u2067", "\\u2067"),  # RLI
        ("\u2068", "\\u2068"),  # FSI
        ("\u2069", "\\u2069"),  # PDI
        ("\u200e", "\\u200e"),  # LRM
        ("\u200f", "\\u200f"),  # RLM
        ("\u061c", "\\u061c"),  # ALM
        ("\u200b", "\\u200b"),  # zero-width space
        ("\u200c", "\\u200c"),  # zero-width non-joiner
        ("\u200d", "\\u200d"),  # zero-width joiner
        ("\u2060", "\\u2060"),  # word joiner
        ("\u2064", "\\u2064"),  # invisible plus
        ("\ufeff", "\\ufeff"),  # zero-width no-break space
    ],
)
def test_each_unsafe_character_is_escaped(char: str, escaped: str) -> None:
    assert terminal_text(f"a{char}b") == f"a{escaped}b"


def test_every_c0_and_c1_control_but_tab_and_newline_is_escaped() -> None:
    controls = [chr(code) for code in [*range(0x20), *range(0x7F, 0xA0)]]
    for char in controls:
        out = terminal_text(char, indent="")
        if char in "\t\n":
            assert out == char
        else:
            assert out.startswith("\\"), repr(char)
            assert out.isascii(), repr(char)
            assert out.isprintable(), repr(char)


def test_printable_text_is_unchanged() -> None:
    text = "Fehler: Gerät nicht gefunden — 设备 ✓ tab\there 'quoted' \"double\" 100%"
    assert terminal_text(text) == text
    # Right-to-left scripts are not controls: only the overrides are escaped.
    assert terminal_text("שלום עולם") == "שלום עולם"


def test_continuation_lines_are_indented() -> None:
    assert terminal_text("first\nsecond\nthird") == "first\n  second\n  third"
    assert terminal_text("first\nsecond", indent="    ") == "first\n    second"
    # Empty lines stay empty and a final newline gets no trailing indent.
    assert terminal_text("a\n\nb\n") == "a\n\n  b\n"
    assert terminal_text("a\nb", indent="") == "a\nb"


def test_a_forged_line_cannot_start_at_the_first_column() -> None:
    out = terminal_text(f"boom\n{FORGED}\r\n{FORGED}")
    assert out == f"boom\n  {FORGED}\\r\n  {FORGED}"
    assert_safe(out)


def test_backslashes_are_left_alone() -> None:
    # An escape already written out passes unchanged: it cannot be told from
    # an escaped character, which is harmless on a terminal.
    assert terminal_text("C:\\temp\\x1b and \\n") == "C:\\temp\\x1b and \\n"
    once = terminal_text("a\x1b\nb")
    assert once == "a\\x1b\n  b"
    # Not idempotent: a second pass escapes nothing more but indents again.
    assert terminal_text(once) == "a\\x1b\n    b"


# --- the live logging bridge ---------------------------------------------------------


def frame(name: str) -> tuple[FrameInfo, ...]:
    """The frame of a probe function ``name`` an exception was raised in."""
    return (FrameInfo(filename="/opt/mine/probe.py", lineno=41, name=name, line="import x"),)


#: A slice of the test's own: a broken import of an optional library is a
#: WARNING that carries its traceback, and the start goes on.
MINE = Slice(
    name="mine",
    steps=("kernels/*",),
    rules=[
        MessageRule(
            code="mine.import_broken",
            step="kernels/*/import",
            outcomes="unavailable",
            exception="OSError",
            severity=Severity.WARNING,
            text="{parent} failed to import ({error})",
        )
    ],
)


def hostile_import(message: str = HOSTILE) -> EventStream:
    """A host whose import of the fast kernels fails with an OSError
    carrying ``message``: a WARNING (with its traceback), and the start goes
    on with the slow kernels."""
    cause = exception_info(
        "OSError",
        message,
        frames=frame("probe_fast_kernels"),
        notes=(f"note\x1b]0;title\x07\n{FORGED}",),
    )
    builder = EventStream(run_id="run-7f3a").run_started()
    builder.started("kernels")
    builder.started("kernels/fast", kind=StepKind.CANDIDATE, attributes={"candidate": "fast"})
    builder.started("kernels/fast/import")
    builder.unavailable("kernels/fast/import", cause=cause)
    builder.unavailable("kernels/fast", cause=cause)
    builder.started("kernels/slow", kind=StepKind.CANDIDATE, attributes={"candidate": "slow"})
    builder.succeeded("kernels/slow", {"candidate": "slow"})
    builder.succeeded("kernels", {"selected": "slow"})
    builder.run_finished()
    return builder


def hostile_failure() -> EventStream:
    """A start that fails with the hostile message (an ERROR)."""
    cause = exception_info("RuntimeError", HOSTILE, frames=frame("probe"))
    builder = EventStream(run_id="run-7f3a").run_started()
    builder.started("probe")
    builder.failed("probe", cause)
    builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="probe")
    return builder


def test_the_logging_bridge_prints_escaped_and_indented_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="orchestrator")
    bridge = LoggingBridge(slices=(MINE,))
    for event in [*hostile_import().events, *hostile_failure().events]:
        bridge(event)
    warnings = [r for r in caplog.records if getattr(r, "code", None) == "mine.import_broken"]
    (warning,) = warnings
    text = warning.getMessage()
    assert_safe(text)
    assert "\\x1b[2J\\x1b[31m\\x07\\r\\u202eroot\n  " + FORGED in text
    first, *rest = text.split("\n")
    assert first.startswith("[rank 0] ")
    assert rest
    assert all(line.startswith("  ") for line in rest if line)
    assert "  Traceback (most recent call last):" in rest
    # The record keeps the exact traceback for handlers that want it.
    detail: str = warning.detail  # type: ignore[attr-defined]
    assert HOSTILE in detail
    assert detail.startswith("Traceback (most recent call last):")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors
    for record in errors:
        assert_safe(record.getMessage())
    # What a handler prints is safe too.
    assert_safe(caplog.text)


# --- the text views ------------------------------------------------------------------


def hostile_views_stream() -> list[events.Event]:
    """A start whose step names, reasons, decision and cause are hostile."""
    cause = exception_info("RuntimeError", HOSTILE, frames=frame("probe"))
    builder = EventStream(run_id="run-7f3a").run_started()
    step = f"probe\x1b[8m\n{FORGED}"
    builder.started(step)
    builder.decision(f"pick\x1b[0m\n{FORGED}", f"value\x07\n{FORGED}", step=step)
    builder.failed(step, cause)
    return builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step=step)


def test_explain_blame_and_critical_path_escape_and_indent() -> None:
    stream = hostile_views_stream()
    result = events.replay(stream)
    explained = explain_text(result)
    assert_safe(explained)
    assert "\\x1b[2J" in explained
    for line in explained.splitlines():
        assert not line.startswith(FORGED)
    # A multi-line reason continues inside the tree, under its step.
    tree = explained.splitlines()
    step = next(index for index, line in enumerate(tree) if line.startswith("└─ probe\\x1b[8m"))
    assert (
        tree[step + 1]
        == f"      {FORGED}: failed: RuntimeError: evil\\x1b[2J\\x1b[31m\\x07\\r\\u202eroot"
    )
    assert tree[step + 2].startswith(f"      {FORGED} [")
    for view in (blame_text(result), critical_path_text(result)):
        assert_safe(view)
        assert "probe\\x1b[8m\n  " + FORGED in view


def test_diff_escapes_and_indents() -> None:
    messages = [{"severity": "error", "code": "run.failed", "ranks": [0], "text": HOSTILE}]
    cause = {"rank": 0, "step": "probe", "exception": {"type": "E", "message": HOSTILE}}
    a: dict[str, object] = {"outcome": "ready", "messages": [], "root_cause": None}
    b = {"outcome": "failed", "messages": messages, "root_cause": cause}
    text = diff_text(a, b, label_a=f"run-a\x1b[2K\n{FORGED}", label_b="run-b")
    assert_safe(text)
    assert "+ ERROR [rank 0] evil\\x1b[2J" in text
    assert f"--- run-a\\x1b[2K\n  {FORGED}" in text


def test_the_log_and_json_keep_the_exact_text(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    builder = hostile_failure()
    with JsonlLog(path, run_id=builder.run_id, rank=0) as log:
        for event in builder.events:
            log.append(event)
    text = path.read_text(encoding="utf-8")
    # JSON escapes control characters its own way; the text decodes exactly.
    assert "\\u001b[2J" in text
    assert "\u202e" in text
    (failed,) = [e for e in read_log(path).events if isinstance(e, events.StepFailed)]
    assert failed.cause.message == HOSTILE


def test_a_failed_runs_critical_path_ends_in_the_failed_step_not_in_what_it_cancelled() -> None:
    boom = exception_info("RuntimeError", "boom")
    stream = EventStream().run_started()
    stream.started("probe").started("probe/fast").started("workspace")
    stream.advance(5_000_000).failed("probe/fast", boom).failed("probe", boom, origin="probe/fast")
    # The sibling the failure cancelled ends last, only unwinding.
    stream.advance(1_000_000).cancelled("workspace")
    result = events.replay(
        stream.run_finished(RunOutcome.FAILED, cause=boom, failed_step="probe/fast")
    )
    lines = critical_path_text(result).splitlines()
    assert lines[0].startswith("run failed")
    assert lines[1].startswith("└─ probe @")
    assert "workspace" not in critical_path_text(result)
