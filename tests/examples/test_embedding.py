"""The embedding API as its users meet it: the README's snippet run as
written (as a plain process and under torchrun), a launcher that spawns its
ranks itself, and ranks started with SLURM's and Open MPI's variables — each
replayed afterwards as one run with every rank."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import EXAMPLES, clean_environment, only_run_dir

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.slow


def python_blocks() -> list[str]:
    """Every ```python block of the README, as written."""
    text = README.read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.DOTALL | re.MULTILINE)


def _run(
    command: list[str], cwd: Path, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=cwd,
        env=clean_environment(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _replay(cwd: Path) -> dict[str, object]:
    done = _run(
        [sys.executable, "-m", "orchestrator", "replay", "--json", str(only_run_dir(cwd))], cwd
    )
    document: dict[str, object] = json.loads(done.stdout)
    return document


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def test_the_readme_has_the_embedding_snippet() -> None:
    [snippet] = [
        block for block in python_blocks() if "from orchestrator import Startup\n" in block
    ]
    assert "from orchestrator import Startup" in snippet
    assert len(snippet.strip().splitlines()) <= 6


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_every_readme_python_block_runs_as_written(tmp_path: Path, index: int) -> None:
    block = python_blocks()[index]
    script = tmp_path / "snippet.py"
    script.write_text(block, encoding="utf-8")
    env: dict[str, str] = {}
    world_size = 1
    if "orchestrator.ray" in block:
        # The Multi-node section's Ray block: a local cluster of its own,
        # four actors; Ray kept from writing credentials or usage reports.
        pytest.importorskip("ray", reason="needs Ray: pip install -e '.[test,torch,ray]'")
        env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
        world_size = int(re.search(r"launch_on_ray\((\d+)", block)[1])  # type: ignore[index]
    done = _run([sys.executable, str(script)], tmp_path, **env)

    assert done.returncode == 0, done.stdout + done.stderr
    document = _replay(tmp_path)
    assert document["outcome"] == "ready"
    assert document["world_size"] == world_size
    assert len(document["ranks"]) == world_size


def test_the_readme_snippet_under_torchrun(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torch (and its torchrun) is not installed")
    [snippet] = [
        block for block in python_blocks() if "from orchestrator import Startup\n" in block
    ]
    script = tmp_path / "snippet.py"
    script.write_text(snippet, encoding="utf-8")
    done = _run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script)], tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    document = _replay(tmp_path)
    assert document["outcome"] == "ready"
    assert [rank["rank"] for rank in document["ranks"]] == [0, 1]  # type: ignore[index]
    assert document["messages"]


def test_a_launcher_that_spawns_its_ranks(tmp_path: Path) -> None:
    done = _run([sys.executable, str(EXAMPLES / "launcher_spawn.py"), "--nproc", "2"], tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("Startup ready: 2 ready")
    document = _replay(tmp_path)
    ranks = document["ranks"]
    assert isinstance(ranks, list)
    assert [rank["allreduce_backend"] for rank in ranks] == ["trtllm", "trtllm"]


_RANK_SCRIPT = """
from orchestrator import Startup
with Startup(profile="h200x8") as startup:
    result = startup.run()
print(result.rank, result.world_size, result.run_id)
"""


@pytest.mark.parametrize(
    "launcher",
    [
        # srun: one task per rank, the job and step name the run.
        lambda rank: {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NTASKS": "2",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_NODEID": "0",
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
        },
        # mpirun: the PMIx namespace names the job; its "node rank" is the
        # rank among every job's processes on the node, as Open MPI 4 sets it.
        lambda rank: {
            "OMPI_COMM_WORLD_RANK": str(rank),
            "OMPI_COMM_WORLD_LOCAL_RANK": str(rank),
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "OMPI_COMM_WORLD_NODE_RANK": str(rank),
            "PMIX_NAMESPACE": "prterun-node1-7001@1",
        },
    ],
    ids=["slurm", "open-mpi"],
)
def test_ranks_of_other_launchers_share_one_run(tmp_path: Path, launcher: object) -> None:
    assert callable(launcher)
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT],
            cwd=tmp_path,
            env=clean_environment(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **launcher(rank)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=180) for rank in ranks]

    assert [rank.returncode for rank in ranks] == [0, 0], outputs
    printed = sorted(out.split() for out, _err in outputs)
    assert [line[:2] for line in printed] == [["0", "2"], ["1", "2"]]
    assert len({line[2] for line in printed}) == 1  # one run id for the launch
    document = _replay(tmp_path)
    assert document["run_id"] == printed[0][2]
    assert document["outcome"] == "ready"
    assert [rank["allreduce_backend"] for rank in document["ranks"]] == ["trtllm"] * 2  # type: ignore[index]
