"""``--help`` and ``--version``, called in this process."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

import pytest

from .harness import call_cli


def test_version(tmp_path: Path) -> None:
    shown = call_cli("--version", cwd=tmp_path)

    assert shown.returncode == 0, shown.describe()
    assert shown.stdout == f"startup-orchestrator {version('startup-orchestrator')}\n"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], ["run", "replay", "explain", "blame", "critical-path", "diff", "validate"]),
        (["run"], ["--nproc", "--grace", "STARTUP_ORCHESTRATOR_GRACE_S", "--simulate"]),
        (["replay"], ["--until", "--level", "--export", "--html"]),
    ],
)
def test_help(tmp_path: Path, arguments: list[str], expected: list[str]) -> None:
    shown = call_cli(*arguments, "--help", cwd=tmp_path)

    assert shown.returncode == 0, shown.describe()
    assert shown.stdout.startswith("usage: startup-orchestrator")
    for word in expected:
        assert word in shown.stdout, word
