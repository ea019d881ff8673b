"""Hostile text through the real command line (SPEC §7): a cause chain
500 links deep, written by another program, replays, explains, exports and
validates cut to the bound capture keeps; a message full
of control characters and a forged report line reaches the terminal escaped
and indented, while the log and JSON keep it exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from events import ExceptionInfo, JsonlLog, RunOutcome, StepFailed, read_log
from events._exception_info import MAX_CHAIN
from tests.events.samples import foreign_chain, with_foreign_cause
from tests.orchestrator.engine.streams import RankBuilder

from .harness import Completed, run_cli

DEPTH = 500
FORGED = "Root cause: none (every rank is ready)"
#: ESC sequences (colour, clear screen, window title), BEL, a carriage
#: return, a right-to-left override, and a line that would pass for the
#: report's own.
HOSTILE = f"evil\x1b[31m\x1b[2J\x1b]0;pwned\x07\r\u202e\n{FORGED}"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def deep_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory whose one rank failed, its ``step.failed`` and its
    ``run.finished`` rewritten with a 500-link chain as another program
    might have written them."""
    directory = tmp_path_factory.mktemp("deep") / "run"
    directory.mkdir()
    cause = ExceptionInfo(type="RuntimeError", message="", reason="RuntimeError")
    builder = RankBuilder(0, world_size=1).run_started()
    builder.started("probe")
    builder.failed("probe", cause)
    builder.run_finished(RunOutcome.FAILED, cause=cause, failed_step="probe")
    path = directory / "rank-0.jsonl"
    with JsonlLog(path, run_id=builder.run_id, rank=0) as log:
        for event in builder.events:
            log.append(event)
    lines = path.read_bytes().splitlines(keepends=True)
    for index, line in enumerate(lines):
        if b'"cause"' in line:
            lines[index] = with_foreign_cause(line, foreign_chain(DEPTH))
    path.write_bytes(b"".join(lines))
    return directory


def assert_clean(completed: Completed) -> None:
    for stream in (completed.stdout, completed.stderr):
        assert "RecursionError" not in stream, completed.describe()[:3000]


def test_validate_a_deep_chain(deep_run: Path, tmp_path: Path) -> None:
    validated = run_cli("validate", str(deep_run), cwd=tmp_path)
    assert_clean(validated)
    assert validated.returncode == 0, validated.describe()[:3000]
    assert f"{deep_run / 'rank-0.jsonl'}: ok" in validated.stdout


def test_replay_a_deep_chain(deep_run: Path, tmp_path: Path) -> None:
    replayed = run_cli("replay", str(deep_run), cwd=tmp_path)
    assert_clean(replayed)
    assert replayed.returncode == 1, replayed.describe()[:3000]
    assert replayed.lines()[0].startswith("Startup failed: 1 failed")
    assert "RuntimeError: link 499" in replayed.stdout
    # The outermost links and the innermost recorded, which says the chain
    # was cut below it: it is not the root.
    lines = replayed.lines()
    assert "  ... 52 more linked exceptions ..." in lines
    innermost = lines.index(f"  innermost recorded: RuntimeError: link {DEPTH - MAX_CHAIN}")
    assert lines[innermost + 1] == "  ... the chain was cut here when it was recorded"
    assert "at the root" not in replayed.stdout
    assert len(lines) < 100


def test_explain_a_deep_chain(deep_run: Path, tmp_path: Path) -> None:
    explained = run_cli("explain", str(deep_run), cwd=tmp_path)
    assert_clean(explained)
    assert explained.returncode == 0, explained.describe()[:3000]
    tree = next(line for line in explained.lines() if line.startswith("└─ probe: failed: "))
    assert tree.startswith("└─ probe: failed: RuntimeError: link 499 <- RuntimeError: link 498 <- ")


def test_export_a_deep_chain_to_jaeger(deep_run: Path, tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    exported = run_cli("replay", str(deep_run), f"--export=jaeger-json={target}", cwd=tmp_path)
    assert_clean(exported)
    assert exported.returncode == 1, exported.describe()[:3000]
    (trace,) = json.loads(target.read_text(encoding="utf-8"))["data"]
    probe = next(span for span in trace["spans"] if span["operationName"] == "probe")
    assert len(probe["logs"]) == MAX_CHAIN


def test_diff_of_a_deep_chain_with_itself(deep_run: Path, tmp_path: Path) -> None:
    compared = run_cli("diff", str(deep_run), str(deep_run), cwd=tmp_path)
    assert_clean(compared)
    assert compared.returncode == 0, compared.describe()[:3000]


def test_replay_json_of_a_deep_chain(deep_run: Path, tmp_path: Path) -> None:
    replayed = run_cli("replay", str(deep_run), "--json", cwd=tmp_path)
    assert replayed.returncode == 1, replayed.describe()[:3000]
    exception = replayed.json()["root_cause"]["exception"]
    assert exception["message"] == "link 499"
    # The outermost links and the innermost recorded, with what was left out
    # in between, and where the record was cut.
    depth = 0
    link = exception
    omitted_at = []
    while link["cause"] is not None:
        if "omitted_links" in link:
            omitted_at.append(depth)
            assert link["omitted_links"] == MAX_CHAIN - 32
            assert link["cause"]["message"] == f"link {DEPTH - MAX_CHAIN}"
        assert "truncated" not in link
        link = link["cause"]
        depth += 1
    assert depth == 31
    assert link["truncated"] is True
    assert "omitted_links" not in link
    # The link just before the innermost says how many were left out.
    assert omitted_at == [30]


# --- control characters and forged lines ---------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Completed]:
    """A zen4 start whose zentorch import raises a RuntimeError with the
    hostile message (a failed start)."""
    cwd = tmp_path_factory.mktemp("hostile")
    completed = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--run-dir",
        "run",
        "--inject",
        f"zentorch=RuntimeError:{HOSTILE}",
        cwd=cwd,
    )
    assert completed.returncode == 1, completed.describe()
    return cwd / "run", completed


def assert_safe(text: str) -> None:
    assert not RAW.search(text), RAW.search(text)
    assert not any(line.startswith(FORGED) for line in text.splitlines()), text


def test_live_messages_are_escaped_and_indented(hostile_run: tuple[Path, Completed]) -> None:
    _, completed = hostile_run
    assert "evil" in completed.stderr
    assert_safe(completed.stderr)
    assert "evil\\x1b[31m\\x1b[2J\\x1b]0;pwned\\x07\\r\\u202e\n  " + FORGED in completed.stderr


def test_explain_is_escaped_and_indented(
    hostile_run: tuple[Path, Completed], tmp_path: Path
) -> None:
    run_dir, _ = hostile_run
    explained = run_cli("explain", str(run_dir), cwd=tmp_path)
    assert explained.returncode == 0, explained.describe()
    assert "platform/cpu/zentorch: failed: RuntimeError: evil\\x1b[31m" in explained.stdout
    assert_safe(explained.stdout)
    assert_safe(explained.stderr)


def test_the_log_and_json_keep_the_exact_text(
    hostile_run: tuple[Path, Completed], tmp_path: Path
) -> None:
    run_dir, _ = hostile_run
    failures = [
        event
        for event in read_log(run_dir / "rank-0.jsonl").events
        if isinstance(event, StepFailed) and event.step == "platform/cpu/zentorch"
    ]
    assert [event.cause.message for event in failures] == [HOSTILE]
    document = run_cli("replay", "--json", str(run_dir), cwd=tmp_path).json()
    chain = []
    exception = document["root_cause"]["exception"]
    while exception is not None:
        chain.append(exception["message"])
        exception = exception["cause"]
    assert chain[-1] == HOSTILE
    assert any(HOSTILE in message["text"] for message in document["messages"])
