"""A rank the launcher starts begins with SIGINT blocked (held until it
catches stops itself), whatever way the launcher arranges it."""

from __future__ import annotations

import os
import signal
import textwrap
from pathlib import Path

import pytest

from .harness import environment, run_cli

# Noted by every rank as its interpreter starts, before anything of ours.
_SITECUSTOMIZE = textwrap.dedent(
    """
    import os

    if os.environ.get("RANK") is not None and os.environ.get("MASK_DIR"):
        with open("/proc/self/status", encoding="ascii") as status:
            blocked = next(line for line in status if line.startswith("SigBlk:"))
        path = os.path.join(os.environ["MASK_DIR"], "rank-" + os.environ["RANK"])
        with open(path, "w", encoding="ascii") as out:
            out.write(blocked.split()[1])
    """
)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/self/status")
@pytest.mark.slow
def test_ranks_start_with_sigint_blocked(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE, encoding="utf-8")
    masks = tmp_path / "masks"
    masks.mkdir()
    base = environment()
    path = os.pathsep.join(p for p in (str(site), base.get("PYTHONPATH", "")) if p)

    done = run_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        cwd=tmp_path,
        env={**base, "PYTHONPATH": path, "MASK_DIR": str(masks)},
    )

    assert done.returncode == 0, done.describe()
    for rank in (0, 1):
        blocked = int((masks / f"rank-{rank}").read_text(encoding="ascii"), 16)
        assert blocked & (1 << (signal.SIGINT - 1)), f"rank {rank}: SigBlk {blocked:#x}"
