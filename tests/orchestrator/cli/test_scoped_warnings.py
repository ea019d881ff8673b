"""Scope keeps copies of one node-wide WARNING off the terminal, and never
hides a WARNING that only a non-zero local rank saw: that one is printed at
the end of the startup (by the launcher for ``run --nproc``, by the rank
itself under torchrun, once the end-of-startup exchange says local rank 0
did not derive it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, environment, run_cli

pytestmark = pytest.mark.slow

ABI = "OSError:libzentorch.so: undefined symbol: _ZN3c10"


def _zentorch_warnings(stderr: str) -> list[str]:
    return [
        line
        for line in stderr.splitlines()
        if line.startswith("WARNING") and "zentorch failed to import" in line
    ]


def test_a_warning_only_rank_1_saw_is_printed_once(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--nproc",
        "2",
        "--run-dir",
        "run",
        "--inject",
        f"1:zentorch={ABI}",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
        traceback_expected=True,  # zentorch.broken carries its traceback
    )

    assert done.returncode == 0, done.describe()
    [line] = _zentorch_warnings(done.stderr)
    assert line.startswith("WARNING [rank 1] zentorch failed to import (OSError: libzentorch.so")


def test_a_node_wide_warning_is_printed_once(tmp_path: Path) -> None:
    done = run_cli(
        "run",
        "--simulate",
        "zen4",
        "--nproc",
        "2",
        "--run-dir",
        "run",
        "--inject",
        f"zentorch={ABI}",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
        traceback_expected=True,
    )

    assert done.returncode == 0, done.describe()
    [line] = _zentorch_warnings(done.stderr)
    assert line.startswith("WARNING [rank 0] ")
    # Both ranks derived it: the report groups it.
    assert "WARNING [ranks 0-1] zentorch failed to import" in done.stdout


def test_under_torchrun_the_rank_that_alone_saw_a_warning_prints_it(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    torchrun = Path(sys.executable).with_name("torchrun")
    process = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "orchestrator",
            "run",
            "--simulate",
            "zen4",
            "--inject",
            f"1:zentorch={ABI}",
        ],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )

    assert process.returncode == 0, process.stdout + process.stderr
    [line] = _zentorch_warnings(process.stderr)
    assert line.startswith("WARNING [rank 1] ")


def test_a_failure_that_follows_another_ranks_is_one_line_for_every_rank(tmp_path: Path) -> None:
    # Rank 2 fails; ranks 0, 1 and 3 then fail in the exchange that follows,
    # each with the same GroupError, and the group broke before the end of
    # the startup: each holds its lines and the launcher prints them once.
    done = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "4",
        "--grace",
        "1",
        "--run-dir",
        "run",
        "--inject",
        "2:attention/FLASH_ATTN=RuntimeError:boom",
        cwd=tmp_path,
        timeout=LAUNCH_TIMEOUT_S,
    )

    assert done.returncode == 1, done.describe()
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert errors[0] == (
        "ERROR   [rank 2] Step attention/FLASH_ATTN failed: RuntimeError: boom; "
        "the error propagated and stopped the startup."
    ), done.stderr
    [followed] = errors[1:]
    assert followed.startswith(
        "ERROR   [ranks 0-1,3] Step allreduce_workspace/agree failed: GroupError: "
    ), done.stderr
    assert followed.endswith("; it follows rank 2's failure in attention/FLASH_ATTN."), followed
    # The node-wide WARNING rank 0 printed is not printed again by its peers.
    mnnvl = [line for line in done.stderr.splitlines() if "backend=mnnvl unavailable" in line]
    assert [line[:16] for line in mnnvl] == ["WARNING [rank 0]"], done.stderr
