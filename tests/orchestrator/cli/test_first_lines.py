"""The first lines a person reads: where the record is, whether a ready start
lost something, and one live line per rank for one failure."""

from __future__ import annotations

import os
import select
import subprocess
from pathlib import Path

import pytest

from .harness import LAUNCH_TIMEOUT_S, command, environment, run_cli

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


def test_a_ready_start_that_lost_fusion_says_so_first(tmp_path: Path) -> None:
    # Ranks 0-1 lack flashinfer.comm: no workspace backend works on every
    # rank, so the ranks that had it (2-3) disable fusion with an ERROR.
    ran = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "4", "--run-dir", "run",
        "--inject", "0-1:flashinfer.comm=PermissionError:denied",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip

    assert ran.returncode == 0, ran.describe()
    lines = ran.lines()
    assert lines[0].startswith("Startup ready, degraded: 4 ready (run "), ran.describe()
    # What was lost, on every rank, not only where the ERROR was printed.
    assert lines[2] == "Lost: all-reduce fusion off on ranks 0-3", ran.describe()
    assert lines[3] == "Degraded: allreduce.workspace_failed on ranks 2-3", ran.describe()
    # Where it started: the ranks without flashinfer.comm, and why.
    assert lines[5] == "Ranks differ: flashinfer_comm.divergence on ranks 0-3", ran.describe()
    assert lines[6].startswith(
        "  Ranks differ in flashinfer.comm: unavailable (PermissionError: denied) on ranks 0-1; "
        "available on ranks 2-3."
    ), ran.describe()
    assert "Root cause:" not in ran.stdout

    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    assert document["outcome"] == "ready"
    assert document["degraded"] == [
        {"code": "allreduce.workspace_failed", "severity": "error", "ranks": [2, 3]}
    ]
    assert document["losses"] == [
        {"fact": "fusion_lost", "what": "all-reduce fusion off", "ranks": [0, 1, 2, 3]}
    ]
    assert [d["code"] for d in document["divergences"]] == ["flashinfer_comm.divergence"]

    # The HTML report says the same at its top, before the swimlanes.
    run_cli("replay", "run", "--html", "report.html", cwd=tmp_path)
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    degraded = page.index('<section id="degraded">')
    assert degraded < page.index('class="lane"')
    section = page[degraded : page.index("</section>", degraded)]
    assert "<b>Lost</b>: all-reduce fusion off on ranks 0-3" in section
    assert "<b>allreduce.workspace_failed</b> on ranks 2-3" in section
    assert "(flashinfer_comm.divergence) on ranks 0-3" in section
    assert 'id="root-cause"' not in page


def test_a_timed_out_probe_degrades_a_ready_start(tmp_path: Path) -> None:
    ran = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", "run", "--json",
        "--inject", "attention/FLASH_ATTN=hang", "--timeout", "1",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip

    assert ran.returncode == 0, ran.describe()
    document = ran.json()
    assert document["outcome"] == "ready"
    assert [entry["code"] for entry in document["degraded"]] == ["step.timed_out"]
    text = run_cli("replay", "run", cwd=tmp_path).lines()
    assert text[0].startswith("Startup ready, degraded: 1 ready"), text
    # One rank (tensor parallel size 1): fusion does not apply, nothing lost.
    assert text[2] == "Degraded: step.timed_out on rank 0"
    assert document["losses"] == []


def test_a_healthy_start_is_not_degraded(tmp_path: Path) -> None:
    ran = run_cli("run", "--simulate", "h200x8", "--json", "--run-dir", "run", cwd=tmp_path)

    assert ran.returncode == 0, ran.describe()
    document = ran.json()
    assert (document["outcome"], document["degraded"], document["losses"]) == ("ready", [], [])
    text = run_cli("replay", "run", cwd=tmp_path).lines()
    assert text[0].startswith("Startup ready: 1 ready"), text
    assert text[2] == "Root cause: none (every rank is ready)"


def test_one_failure_is_one_live_line_per_rank(tmp_path: Path) -> None:
    ran = run_cli(
        "run", "--simulate", "zen4", "--nproc", "2", "--run-dir", "run",
        "--inject", "1:zentorch=RuntimeError:unknown zentorch failure",
        cwd=tmp_path, timeout=LAUNCH_TIMEOUT_S,
    )  # fmt: skip

    assert ran.returncode == 1, ran.describe()
    errors = [line for line in ran.stderr.splitlines() if line.startswith("ERROR")]
    # Rank 1's platform failure, and rank 0's exchange that failed when rank 1
    # left: each once, and no "Startup failed" repeating either cause.
    assert [line.split("]")[0] for line in sorted(errors)] == [
        "ERROR   [rank 0",
        "ERROR   [rank 1",
    ], ran.describe()
    assert not any("Startup failed" in line for line in errors), ran.describe()
    assert any("unknown zentorch failure" in line for line in errors if "[rank 1]" in line)
    # The report keeps the run's message too.
    assert ran.lines()[0].startswith("Startup failed: 2 failed"), ran.describe()
    assert "ERROR [rank 1] Startup failed: " in ran.stdout


def test_a_single_rank_failure_is_one_live_line(tmp_path: Path) -> None:
    # A single rank whose probe raises: its step's ERROR, then nothing more.
    ran = run_cli(
        "run", "--simulate", "h200x8", "--run-dir", "run",
        "--inject", "attention/FLASH_ATTN=RuntimeError:CUDA error",
        cwd=tmp_path,
    )  # fmt: skip

    assert ran.returncode == 1, ran.describe()
    errors = [line for line in ran.stderr.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1, ran.describe()
    assert errors[0].startswith("ERROR   [rank 0] Step attention/FLASH_ATTN failed: "), errors


def _on_a_terminal(tmp_path: Path, *args: str) -> tuple[int, str]:
    """Run ``python -m orchestrator <args>`` with stdout and stderr on one
    pseudo-terminal, as a person at a terminal runs it: its exit status and
    all it showed."""
    terminal, child_side = os.openpty()
    process = subprocess.Popen(
        command(*args), cwd=tmp_path, env=environment(TERM="xterm"),
        stdout=child_side, stderr=child_side,
    )  # fmt: skip
    os.close(child_side)
    shown = b""
    try:
        while True:
            ready, _, _ = select.select([terminal], [], [], LAUNCH_TIMEOUT_S)
            if not ready:
                break
            try:
                data = os.read(terminal, 1 << 16)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            shown += data
        returncode = process.wait(timeout=LAUNCH_TIMEOUT_S)
    finally:
        os.close(terminal)
        if process.poll() is None:
            process.kill()
    return returncode, shown.decode("utf-8", "replace").replace("\r\n", "\n")


def test_on_a_terminal_the_report_does_not_print_the_live_messages_again(
    tmp_path: Path,
) -> None:
    returncode, shown = _on_a_terminal(tmp_path, "run", "--simulate", "h200x8", "--run-dir", "run")

    assert returncode == 0, shown
    assert shown.count("Automatically detected platform CudaPlatform.") == 1, shown
    assert "Messages (info and above): 3, printed above; replay run lists them" in shown, shown
    # Off a terminal (a file, a pipe) the report is whole.
    ran = run_cli("replay", "run", cwd=tmp_path)
    assert "  INFO [rank 0] Automatically detected platform CudaPlatform." in ran.stdout
