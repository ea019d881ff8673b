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
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .readme import blocks, missing

pytestmark = pytest.mark.slow


def _runnable(block: list[str]) -> bool:
    commands = [line for line in block if line.startswith("$ ")]
    return bool(commands) and not any(
        "&" in line.split() or "kill" in line or line.endswith("\\") for line in commands
    )


CONSOLE = [block for block in blocks("console") if _runnable(block)]


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
    (faults,) = blocks("json")
    (tmp_path / "faults.json").write_text(
        json.dumps(json.loads("\n".join(faults))), encoding="utf-8"
    )
    commands = [index for index, line in enumerate(block) if line.startswith("$ ")]
    run_ids: list[str] = []
    for number, index in enumerate(commands):
        end = commands[number + 1] if number + 1 < len(commands) else len(block)
        expected = block[index + 1 : end]
        printed = _run(block[index][2:], tmp_path, run_ids)
        absent = missing(expected, printed)
        assert absent is None, f"{block[index]}\nnot printed: {absent}\n" + "\n".join(printed)
