"""The launcher reads its input files once and hands what it read to its
ranks: a profile and a fault file given as pipes (``<(...)``), which can be
read only once, reach every rank, and each rank names the simulated host as
the launcher does."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli._run import _rank_arguments

from .harness import LAUNCH_TIMEOUT_S, call_cli, command, environment, read_events

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_a_profile_and_a_fault_file_given_as_pipes_reach_every_rank(tmp_path: Path) -> None:
    faults = [
        {
            "target": "attention/FLASH_ATTN",
            "exception": "RuntimeError",
            "args": ["boom"],
            "ranks": "1",
        }
    ]
    (tmp_path / "faults.json").write_text(json.dumps(faults), encoding="utf-8")
    profile = ROOT / "examples" / "profile-custom.json"
    launch = shlex.join(
        command("run", "--nproc", "2", "--grace", "1", "--run-dir", "run", "--json")
    )
    script = (
        f"{launch} --simulate <(cat {shlex.quote(str(profile))}) --inject-file <(cat faults.json)"
    )

    done = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
        check=False,
    )

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    cause = report["root_cause"]
    assert (cause["rank"], cause["step"]) == (1, "attention/FLASH_ATTN")
    assert cause["exception"]["message"] == "boom"
    run_dir = tmp_path / "run"
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["simulated"].startswith("/dev/fd/")
    assert manifest["injected"] == ["1:attention/FLASH_ATTN=RuntimeError:boom"]
    for rank in (0, 1):
        started = read_events(run_dir / f"rank-{rank}.jsonl")[0]
        # Each rank ran the launcher's profile, named as the launcher names it.
        assert started["simulated"] == manifest["simulated"], started
        assert started["injected"] == manifest["injected"], started
    # Nothing but the run's own record is left in its directory.
    assert sorted(path.name for path in run_dir.iterdir()) == [
        ".run-id",
        "manifest.json",
        "rank-0.jsonl",
        "rank-1.jsonl",
    ]


def test_run_options_are_spelled_out(tmp_path: Path) -> None:
    # The launcher finds the options it hands over by name: an abbreviation
    # would reach the ranks as the user's, beside the launcher's.
    refused = call_cli("run", "--nproc", "2", "--sim", "h200x8", cwd=tmp_path)

    assert refused.returncode == 2, refused.describe()
    assert "--sim" in refused.stderr
    assert not (tmp_path / "startup-runs").exists()


def test_the_ranks_get_the_launchers_arguments_less_its_own_options() -> None:
    # Spelled either way (--option VALUE, --option=VALUE), the launcher's own
    # options and the inputs it hands over in its own way never reach a rank
    # as the user gave them: a rank given --trace-file would write a file of
    # its own, and one given --inject too would inject each fault twice.
    argv = [
        "run", "--nproc", "2", "--run-dir=runs/a", "--run-id", "a", "--grace=1",
        "--trace-file", "trace.json", "--simulate=profile.json", "--inject",
        "zentorch=OSError", "--inject-file=faults.json", "--json", "--tp", "2",
        "--level", "debug", "--timeout=5",
    ]  # fmt: skip
    handed = ["--simulate", "/dev/fd/5", "--inject-file", "/dev/fd/6"]

    assert _rank_arguments(argv, handed) == [
        "--tp", "2", "--level", "debug", "--timeout=5", *handed,
    ]  # fmt: skip
