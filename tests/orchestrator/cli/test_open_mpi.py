"""Real ``mpirun`` (Open MPI), not only its variables: the README's command
starts four ranks that read their identity and run id from Open MPI, form
their gloo group, and are replayed as one run; a fault on one rank is its
root cause; a stop of ``mpirun`` mid-start is recorded on every rank.

Open MPI's ``OMPI_COMM_WORLD_NODE_RANK`` is a process's rank among every
job's processes on its node, not the node's number: read as the node rank,
it refused every rank but the first ("must be below the node count 1").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from events import RankIdentity, RunStarted, read_log
from tests.readme import blocks

from .harness import (
    LAUNCH_TIMEOUT_S,
    environment,
    free_port,
    only_run_directory,
    poll_file,
    read_events,
    run_cli,
    step_started,
    wait_for_event,
)

pytestmark = pytest.mark.slow

MPIRUN = shutil.which("mpirun")
#: Set where Open MPI must be installed (CI): missing is then a failure.
REQUIRED = os.environ.get("STARTUP_REQUIRE_MPI") == "1"
RANKS = 4
#: As root (containers, CI), mpirun refuses to start without being told;
#: with fewer cores than ranks it needs to be told to oversubscribe.
_AS_ROOT = ["--allow-run-as-root"] if os.geteuid() == 0 else []


@pytest.fixture(autouse=True)
def _needs_mpirun() -> None:
    if MPIRUN is None:
        if REQUIRED:
            pytest.fail(
                "STARTUP_REQUIRE_MPI=1 but mpirun is not installed (apt install openmpi-bin)"
            )
        pytest.skip("Open MPI is not installed (apt install openmpi-bin)")


def _readme_command() -> list[str]:
    """The README's Open MPI line, as words."""
    [line] = [
        line
        for block in blocks("bash")
        for line in block
        if line.startswith("mpirun ") and "orchestrator run" in line
    ]
    return line.split()


def _mpirun(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    """The README's command (``python`` this interpreter, the machine's
    cores oversubscribed), with ``options`` for the run."""
    words = _readme_command()
    assert words[:3] == ["mpirun", "-n", "4"], words
    python = words.index("python")
    command = [
        str(MPIRUN), *_AS_ROOT, "--oversubscribe", *words[1:python],
        sys.executable, *words[python + 1 :], *options,
    ]  # fmt: skip
    env = environment(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return process.returncode, out, err


def _replay(tmp_path: Path, run_dir: Path) -> dict[str, object]:
    document: dict[str, object] = run_cli("replay", "--json", str(run_dir), cwd=tmp_path).json()
    return document


def test_four_ranks_under_mpirun_are_one_run(tmp_path: Path) -> None:
    code, _out, err = _finish(_mpirun(tmp_path, "--simulate", "h200x8"))

    assert code == 0, err
    run_dir = only_run_directory(tmp_path / "startup-runs")
    assert run_dir.name.startswith("ompi-"), run_dir  # the Open MPI job names the run
    logs = sorted(run_dir.glob("rank-*.jsonl"))
    assert [log.name for log in logs] == [f"rank-{rank}.jsonl" for rank in range(RANKS)]
    for rank, log in enumerate(logs):
        [started] = [e for e in read_log(log).events if isinstance(e, RunStarted)]
        assert started.run_id == run_dir.name
        # One node: the local ranks are the ranks.
        assert started.identity == RankIdentity(
            rank=rank, local_rank=rank, world_size=RANKS, local_world_size=RANKS, node_rank=0
        )
    group = [e for e in read_events(logs[1]) if e.get("step") == "process_group"][-1]
    assert group["result"] == {"backend": "gloo", "world_size": RANKS}
    document = _replay(tmp_path, run_dir)
    assert (document["outcome"], document["world_size"]) == ("ready", RANKS)
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["collected_by"] == 0


def test_a_fault_on_one_rank_under_mpirun_is_the_root_cause(tmp_path: Path) -> None:
    code, _out, err = _finish(
        _mpirun(
            tmp_path, "--simulate", "h200x8", "--inject", "2:attention/FLASH_ATTN=RuntimeError:boom"
        )
    )

    assert code != 0, err
    run_dir = only_run_directory(tmp_path / "startup-runs")
    document = _replay(tmp_path, run_dir)
    assert document["outcome"] == "failed", document
    root = document["root_cause"]
    assert isinstance(root, dict)
    assert (root["rank"], root["step"]) == (2, "attention/FLASH_ATTN")
    assert (root["exception"]["type"], root["exception"]["message"]) == ("RuntimeError", "boom")


def test_a_stop_of_mpirun_mid_start_is_recorded_on_every_rank(tmp_path: Path) -> None:
    # Every rank hangs in a probe: all of them are mid-start when it comes.
    process = _mpirun(tmp_path, "--simulate", "h200x8", "--inject", "attention/FLASH_ATTN=hang")
    try:
        for rank in range(RANKS):
            wait_for_event(
                _rank_log(tmp_path, rank, process),
                step_started("attention/FLASH_ATTN"),
                alive=lambda: process.poll() is None,
                deadline_s=LAUNCH_TIMEOUT_S,
            )
        os.kill(process.pid, signal.SIGTERM)  # mpirun passes it to every rank
        _finish(process)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    run_dir = only_run_directory(tmp_path / "startup-runs")
    logs = sorted(run_dir.glob("rank-*.jsonl"))
    assert len(logs) == RANKS
    for path in logs:
        finished = read_events(path)[-1]
        assert finished["type"] == "run.finished", path
        assert finished["outcome"] == "interrupted", (path, finished)
        assert "SIGTERM" in json.dumps(finished.get("cause")), finished
    document = _replay(tmp_path, run_dir)
    assert document["outcome"] == "interrupted", document


def _rank_log(tmp_path: Path, rank: int, process: subprocess.Popen[str]) -> Path:
    """Rank ``rank``'s log, once its run directory exists."""
    found: list[Path] = poll_file(
        lambda: sorted((tmp_path / "startup-runs").glob(f"ompi-*/rank-{rank}.jsonl")),
        bool,
        alive=lambda: process.poll() is None,
        deadline_s=LAUNCH_TIMEOUT_S,
        what=f"rank {rank}'s log",
    )
    return found[0]
