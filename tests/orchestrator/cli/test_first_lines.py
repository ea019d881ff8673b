"""The first lines a person reads: where the record is, whether a ready start
lost something, and one live line per rank for one failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, run_cli

pytestmark = pytest.mark.slow


def _where(run_dir: str) -> str:
    return (
        f"startup-orchestrator: the run's logs are in {run_dir}; replay {run_dir} for the "
        f"report, explain {run_dir} for every step"
    )


@pytest.mark.parametrize("nproc", [None, 2])
def test_every_run_says_where_its_logs_are(nproc: int | None, tmp_path: Path) -> None:
    launch = () if nproc is None else ("--nproc", str(nproc))
    ran = run_cli(
        "run", "--simulate", "h200x8", *launch, "--run-dir", "run",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip

    assert ran.returncode == 0, ran.describe()
    assert ran.stderr.splitlines().count(_where("run")) == 1, ran.describe()
