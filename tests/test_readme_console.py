"""The README's console blocks, run as written on a simulated host.

Every ``$ startup-orchestrator ...`` command of a ```` ```console ```` block
runs in a fresh directory (with the README's ``faults.json`` beside it), and
the lines the README shows under it must appear in what the tool printed,
in order. The README's own elisions are honoured: a line ``...`` stands for
any number of lines, ``...`` inside a line for any text, and run ids,
``<run-id>``, pids and times for any value. The block that runs a launch in
the background and stops it (``&``, ``kill``) is the subject of the watch
tests and is left out here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

pytestmark = pytest.mark.slow


def _blocks(kind: str) -> list[list[str]]:
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in README.read_text(encoding="utf-8").splitlines():
        if current is None:
            if line.strip() == f"```{kind}":
                current = []
        elif line.strip() == "```":
            blocks.append(current)
            current = None
        else:
            current.append(line)
    return blocks


def _runnable(block: list[str]) -> bool:
    commands = [line for line in block if line.startswith("$ ")]
    return bool(commands) and not any(
        "&" in line.split() or "kill" in line or line.endswith("\\") for line in commands
    )


CONSOLE = [block for block in _blocks("console") if _runnable(block)]


def _pattern(line: str) -> re.Pattern[str]:
    """A README line as a pattern: its elisions and run-specific values match
    anything of their kind."""
    parts = re.split(
        r"(\.\.\.|<run-id>|\b\d{8}T\d{6}-[0-9a-f]{6}\b|pid \d+|\+\d+(?:\.\d+)? s)", line
    )
    pattern = []
    for index, part in enumerate(parts):
        if index % 2 == 0:
            pattern.append(re.escape(part))
        elif part == "...":
            pattern.append(".*")
        elif part.startswith("pid "):
            pattern.append(r"pid \d+")
        elif part.startswith("+"):
            pattern.append(r"\+\d+(?:\.\d+)? s")
        else:
            pattern.append(r"\d{8}T\d{6}-[0-9a-f]{6}")
    return re.compile("".join(pattern) + r"\Z")


def _missing(expected: list[str], printed: list[str]) -> str | None:
    """The first expected line not found in order in ``printed``, else None."""
    position = 0
    for line in expected:
        if line.strip() == "...":
            continue
        pattern = _pattern(line)
        while position < len(printed) and not pattern.match(printed[position]):
            position += 1
        if position == len(printed):
            return line
        position += 1
    return None


def _run(command: str, cwd: Path, run_ids: list[str]) -> list[str]:
    arguments = shlex.split(command)
    assert arguments[0] == "startup-orchestrator", command
    arguments = [
        str(Path(run_ids[-1]).relative_to(cwd)) if "<run-id>" in arg and run_ids else arg
        for arg in arguments
    ]
    environment = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OTEL_", "STARTUP_ORCHESTRATOR_", "TRACEPARENT"))
    }
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *arguments[1:]],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), (command, done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    runs = cwd / "startup-runs"
    if runs.is_dir():
        run_ids[:] = [str(path) for path in sorted(runs.iterdir())]
    return done.stdout.splitlines()


def test_the_readme_has_console_blocks_to_check() -> None:
    assert len(CONSOLE) >= 3


#: A block that runs vLLM's own platform code needs vLLM installed
#: (``pip install --no-deps vllm==0.33.0 && pip install packaging regex
#: psutil``, as .ci/run does, which makes a missing vLLM fail, not skip).
VLLM_MISSING = importlib.util.find_spec("vllm") is None and (
    os.environ.get("STARTUP_REQUIRE_VLLM") != "1"
)


@pytest.mark.parametrize("block", CONSOLE, ids=lambda block: block[0][2:60])
def test_a_console_block_prints_what_the_readme_shows(block: list[str], tmp_path: Path) -> None:
    if VLLM_MISSING and any("--engine vllm" in line for line in block if line.startswith("$ ")):
        pytest.skip("vLLM is not installed: pip install --no-deps vllm==0.33.0")
    (faults,) = _blocks("json")
    (tmp_path / "faults.json").write_text(
        json.dumps(json.loads("\n".join(faults))), encoding="utf-8"
    )
    commands = [index for index, line in enumerate(block) if line.startswith("$ ")]
    run_ids: list[str] = []
    for number, index in enumerate(commands):
        end = commands[number + 1] if number + 1 < len(commands) else len(block)
        expected = block[index + 1 : end]
        printed = _run(block[index][2:], tmp_path, run_ids)
        missing = _missing(expected, printed)
        assert missing is None, f"{block[index]}\nnot printed: {missing}\n" + "\n".join(printed)
