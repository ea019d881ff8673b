"""Runs the command-line tests share: made once per session (an 8-rank
launch costs 10-15 s), read by many tests, never changed by them (a test
that damages a log works on a copy)."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from .harness import LAUNCH_TIMEOUT_S, Completed, only_run_directory, run_cli


@attrs.frozen(kw_only=True)
class StoredRun:
    """A finished ``run`` and the run directory it wrote."""

    directory: Path
    completed: Completed


@pytest.fixture(scope="session")
def eight_ranks(tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """``run --simulate h200x8 --nproc 8 --json`` in the default run directory."""
    cwd = tmp_path_factory.mktemp("eight-ranks")
    completed = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "8", "--json", cwd=cwd, timeout=LAUNCH_TIMEOUT_S
    )
    assert completed.returncode == 0, completed.describe()
    return StoredRun(directory=only_run_directory(cwd / "startup-runs"), completed=completed)


@pytest.fixture(scope="session")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """A healthy single-rank h200x8 start (tensor-parallel 2, so the
    all-reduce workspace is built too)."""
    cwd = tmp_path_factory.mktemp("healthy")
    completed = run_cli("run", "--simulate", "h200x8", "--tp", "2", "--run-dir", "run", cwd=cwd)
    assert completed.returncode == 0, completed.describe()
    return StoredRun(directory=cwd / "run", completed=completed)


@pytest.fixture(scope="session")
def attention_failure(tmp_path_factory: pytest.TempPathFactory) -> StoredRun:
    """The same start with FLASH_ATTN's probe failing with an error that
    propagates (a RuntimeError is not recovered)."""
    cwd = tmp_path_factory.mktemp("attention-failure")
    completed = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--tp",
        "2",
        "--run-dir",
        "run",
        "--inject",
        "attention/FLASH_ATTN=RuntimeError:CUDA error: no kernel image is available",
        cwd=cwd,
    )
    assert completed.returncode == 1, completed.describe()
    return StoredRun(directory=cwd / "run", completed=completed)
