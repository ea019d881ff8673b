"""Real SLURM, not only its variables: a one-node cluster on this machine
(munge, ``slurmctld`` and ``slurmd`` started by the fixture, with a
configuration of its own), the README's SLURM lines run as a batch job of
four tasks, a fault on one rank as its root cause, and ``scancel`` mid-start
recorded on every rank.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from events import RankIdentity, RunStarted, read_log
from tests.readme import blocks

from .harness import (
    LAUNCH_TIMEOUT_S,
    environment,
    free_port,
    poll_file,
    read_events,
    run_cli,
    step_started,
    wait_for_event,
)

pytestmark = pytest.mark.slow

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scancel", "sinfo")
#: Set where SLURM must be installed (CI): missing is then a failure.
REQUIRED = os.environ.get("STARTUP_REQUIRE_SLURM") == "1"
TASKS = 4
#: How long the cluster may take to come up (the node registers itself).
UP_S = 60.0


@attrs.frozen(kw_only=True)
class Cluster:
    """A one-node SLURM cluster: its configuration, for ``SLURM_CONF``."""

    conf: Path

    def env(self, **extra: str) -> dict[str, str]:
        """The test's environment for SLURM's commands and a job's tasks
        (``python`` is this interpreter, as in an activated virtualenv)."""
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return environment(SLURM_CONF=str(self.conf), PATH=path, **extra)


def _munge_running() -> bool:
    munge = shutil.which("munge")
    if munge is None:
        return False
    done = subprocess.run([munge, "-n"], capture_output=True, check=False, timeout=10)
    return done.returncode == 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "the daemons need root"
        if REQUIRED:
            pytest.fail(f"STARTUP_REQUIRE_SLURM=1, but {why} (apt install slurm-wlm munge)")
        pytest.skip(f"SLURM cannot run here: {why} (apt install slurm-wlm munge)")
    home = tmp_path_factory.mktemp("slurm")
    for part in ("state", "spool"):
        (home / part).mkdir()
    started: list[str] = []
    if not _munge_running():
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", "munged"], check=True, timeout=30)
        started.append("munged")
    host = socket.gethostname().split(".")[0]
    conf = home / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "ClusterName=startup",
                f"SlurmctldHost={host}(127.0.0.1)",
                "SlurmUser=root",
                "SlurmdUser=root",
                f"SlurmctldPort={free_port()}",
                f"SlurmdPort={free_port()}",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"StateSaveLocation={home / 'state'}",
                f"SlurmdSpoolDir={home / 'spool'}",
                f"SlurmctldPidFile={home / 'slurmctld.pid'}",
                f"SlurmdPidFile={home / 'slurmd.pid'}",
                f"SlurmctldLogFile={home / 'slurmctld.log'}",
                f"SlurmdLogFile={home / 'slurmd.log'}",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "SchedulerType=sched/builtin",
                "ReturnToService=2",
                "MpiDefault=none",
                # The node declares more CPUs than two cores: four tasks.
                "SlurmdParameters=config_overrides",
                "JobAcctGatherType=jobacct_gather/none",
                "AccountingStorageType=accounting_storage/none",
                "KillWait=10",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN",
                f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        ),
        encoding="utf-8",
    )
    try:
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon, "-f", str(conf)], check=True, timeout=30, cwd=home)
        up = Cluster(conf=conf)
        poll_file(
            lambda: subprocess.run(
                ["sinfo", "-h", "-o", "%t"], env=up.env(), capture_output=True, text=True,
                check=False, timeout=30,
            ).stdout.strip(),
            lambda state: state == "idle",
            alive=lambda: True,
            deadline_s=UP_S,
            what="the SLURM node registered and idle",
        )  # fmt: skip
        yield up
    finally:
        for daemon in ("slurmd", "slurmctld"):
            with contextlib.suppress(OSError, ValueError):
                pid = int((home / f"{daemon}.pid").read_text().strip())
                os.kill(pid, signal.SIGTERM)
        if "munged" in started:
            subprocess.run(["pkill", "-x", "munged"], check=False, timeout=30)


def _readme_lines() -> list[str]:
    """The README's SLURM lines: the rendezvous address, then ``srun``."""
    [block] = [block for block in blocks("bash") if any(line.startswith("srun ") for line in block)]
    return block


def _batch(
    cluster: Cluster,
    tmp_path: Path,
    *options: str,
    sbatch: tuple[str, ...] = (f"--ntasks={TASKS}",),
) -> subprocess.Popen[str]:
    """The README's SLURM lines as the script of a batch job (``sbatch``'s
    options: four tasks), ``options`` added to the run and the port one that
    is free, submitted with ``sbatch --wait``."""
    lines = []
    for line in _readme_lines():
        if line.startswith("export MASTER_ADDR="):
            line = line.replace("MASTER_PORT=29500", f"MASTER_PORT={free_port()}")
        if line.startswith("srun "):
            line = f"{line} {' '.join(options)}"
        lines.append(line)
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return subprocess.Popen(
        ["sbatch", "--wait", *sbatch, "--job-name", tmp_path.name,
         f"--output={tmp_path / 'job.out'}", str(script)],
        cwd=tmp_path,
        env=cluster.env(TMPDIR=str(tmp_path)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def _finish(job: subprocess.Popen[str]) -> int:
    try:
        job.communicate(timeout=LAUNCH_TIMEOUT_S)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    return job.returncode


def _run_dir(tmp_path: Path) -> Path:
    found = sorted((tmp_path / "startup-runs").iterdir())
    assert len(found) == 1, found
    return found[0]


def _replay(tmp_path: Path, run_dir: Path) -> dict[str, object]:
    document: dict[str, object] = run_cli("replay", "--json", str(run_dir), cwd=tmp_path).json()
    return document


def test_the_readme_lines_as_a_batch_job_are_one_run(cluster: Cluster, tmp_path: Path) -> None:
    code = _finish(_batch(cluster, tmp_path, "--simulate", "h200x8"))

    output = (tmp_path / "job.out").read_text(encoding="utf-8", errors="replace")
    assert code == 0, output
    run_dir = _run_dir(tmp_path)  # $TMPDIR/startup-runs/$SLURM_JOB_ID, as the README says
    job_id = run_dir.name
    logs = sorted(run_dir.glob("rank-*.jsonl"))
    assert [log.name for log in logs] == [f"rank-{rank}.jsonl" for rank in range(TASKS)]
    for rank, log in enumerate(logs):
        [started] = [e for e in read_log(log).events if isinstance(e, RunStarted)]
        assert started.run_id == f"slurm-{job_id}-0"  # the job and step name the run
        assert started.identity == RankIdentity(
            rank=rank, local_rank=rank, world_size=TASKS, local_world_size=TASKS, node_rank=0
        )
    document = _replay(tmp_path, run_dir)
    assert (document["outcome"], document["world_size"]) == ("ready", TASKS)
    assert "startup ready" in output


def test_a_fault_on_one_task_is_the_root_cause(cluster: Cluster, tmp_path: Path) -> None:
    fault = "2:attention/FLASH_ATTN=RuntimeError:boom"
    code = _finish(_batch(cluster, tmp_path, "--simulate", "h200x8", "--inject", fault))

    assert code != 0
    document = _replay(tmp_path, _run_dir(tmp_path))
    assert document["outcome"] == "failed", document
    root = document["root_cause"]
    assert isinstance(root, dict)
    assert (root["rank"], root["step"]) == (2, "attention/FLASH_ATTN")
    assert (root["exception"]["type"], root["exception"]["message"]) == ("RuntimeError", "boom")


def test_scancel_mid_start_is_recorded_on_every_rank(cluster: Cluster, tmp_path: Path) -> None:
    # Every task hangs in a probe: all of them are mid-start when it comes.
    hang = "attention/FLASH_ATTN=hang"
    job = _batch(cluster, tmp_path, "--simulate", "h200x8", "--inject", hang)
    try:
        for rank in range(TASKS):
            [log] = poll_file(
                lambda rank=rank: sorted(tmp_path.glob(f"startup-runs/*/rank-{rank}.jsonl")),
                bool,
                alive=lambda: job.poll() is None,
                deadline_s=LAUNCH_TIMEOUT_S,
                what=f"rank {rank}'s log",
            )
            wait_for_event(
                log, step_started("attention/FLASH_ATTN"), alive=lambda: job.poll() is None,
                deadline_s=LAUNCH_TIMEOUT_S,
            )  # fmt: skip
        subprocess.run(
            ["scancel", "--name", tmp_path.name], env=cluster.env(), check=True, timeout=30
        )
        _finish(job)
    finally:
        if job.poll() is None:
            job.kill()
    run_dir = _run_dir(tmp_path)
    for path in sorted(run_dir.glob("rank-*.jsonl")):
        finished = read_events(path)[-1]
        assert finished["type"] == "run.finished", path
        assert finished["outcome"] == "interrupted", (path, finished)
        assert "SIGTERM" in json.dumps(finished.get("cause")), finished
    assert _replay(tmp_path, run_dir)["outcome"] == "interrupted"


def test_a_job_asking_more_tasks_per_node_than_it_runs_counts_those_it_runs(
    cluster: Cluster, tmp_path: Path
) -> None:
    # --ntasks-per-node is the most a node may run: SLURM_NTASKS_PER_NODE=4
    # beside SLURM_NTASKS=3 and SLURM_TASKS_PER_NODE=3, what the node runs.
    tasks = 3
    job = _batch(
        cluster,
        tmp_path,
        "--simulate",
        "h200x8",
        sbatch=(f"--ntasks={tasks}", "--ntasks-per-node=4"),
    )
    code = _finish(job)

    output = (tmp_path / "job.out").read_text(encoding="utf-8", errors="replace")
    assert code == 0, output
    logs = sorted(_run_dir(tmp_path).glob("rank-*.jsonl"))
    assert len(logs) == tasks, output
    for rank, log in enumerate(logs):
        [started] = [e for e in read_log(log).events if isinstance(e, RunStarted)]
        assert started.identity == RankIdentity(
            rank=rank, local_rank=rank, world_size=tasks, local_world_size=tasks, node_rank=0
        )
