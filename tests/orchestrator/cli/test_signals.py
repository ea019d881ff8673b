"""A launch that loses a rank, or is asked to stop: the launcher reports what
happened, no log is left half-written except the dead rank's, and replay
names the rank and the step where it stopped.

The ranks run in processes of their own and write their logs as they go;
the tests wait on those logs (:func:`~tests.orchestrator.cli.harness.wait_for_event`)
before they send a signal, so that the signal lands where it is meant to.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from events import validate

from .harness import (
    Background,
    command,
    environment,
    pid_of,
    rank_logs,
    read_events,
    reaping,
    run_cli,
    start_cli,
    step_started,
    step_succeeded,
    wait_for_event,
)

pytestmark = pytest.mark.slow


def _launch(tmp_path: Path, nproc: int, inject: str, **env: str) -> Background:
    return start_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        str(nproc),
        "--inject",
        inject,
        "--run-dir",
        "run",
        cwd=tmp_path,
        env=environment(**env),
    )


def _assert_whole(log: Path) -> list[dict[str, object]]:
    fatal = [problem for problem in validate(log) if problem.fatal]
    assert fatal == [], fatal
    events = read_events(log)
    assert events[-1]["type"] == "run.finished", events[-1]
    return events


def test_killed_rank_is_reported_and_replayed_as_incomplete(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, 4, "2:attention/FLASH_ATTN=hang")
    with reaping(launch, run_dir):
        log = run_dir / "rank-2.jsonl"
        wait_for_event(log, step_started("attention/FLASH_ATTN"), alive=launch.running)
        # The all-reduce agreement runs beside the attention probe; once rank
        # 2 has taken part in it, its peers need nothing more from it and
        # finish. (Killed earlier, it takes its peers' collective down too.)
        wait_for_event(log, step_succeeded("allreduce_workspace"), alive=launch.running)
        os.kill(pid_of(log), signal.SIGKILL)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    assert "Traceback" not in finished.stderr
    reported = [line for line in finished.stderr.splitlines() if "killed by" in line]
    assert len(reported) == 1, finished.describe()
    assert "rank 2 (pid " in reported[0]
    assert reported[0].endswith("killed by SIGKILL")
    assert finished.stdout.startswith("Startup incomplete: 1 incomplete, 3 ready")

    replayed = run_cli("replay", "run", cwd=tmp_path)
    assert replayed.returncode == 1, replayed.describe()
    assert replayed.lines()[0].startswith("Startup incomplete: 1 incomplete, 3 ready")
    assert replayed.lines()[1] == (
        "Not a real start: simulated host h200x8; injected faults: 2:attention/FLASH_ATTN=hang"
    )
    assert replayed.lines()[2].startswith("Root cause: rank 2, step attention/FLASH_ATTN")
    # The launcher's manifest says how the rank ended.
    assert any(
        line.startswith("  its launcher saw: rank 2 (pid ") and "was killed by SIGKILL at +" in line
        for line in replayed.lines()
    ), replayed.stdout
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    assert document["outcome"] == "incomplete"
    assert [(r["rank"], r["outcome"]) for r in document["ranks"]] == [
        (0, "ready"),
        (1, "ready"),
        (2, "incomplete"),
        (3, "ready"),
    ]
    assert document["ranks"][2]["last_step"] == "attention/FLASH_ATTN"
    assert (document["root_cause"]["rank"], document["root_cause"]["step"]) == (
        2,
        "attention/FLASH_ATTN",
    )
    for log in rank_logs(run_dir):
        if log.name != "rank-2.jsonl":
            assert _assert_whole(log)[-1]["outcome"] == "ready"


def test_sigint_to_the_launcher_interrupts_every_rank(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, 3, "attention/FLASH_ATTN=hang")
    with reaping(launch, run_dir):
        for rank in range(3):
            wait_for_event(
                run_dir / f"rank-{rank}.jsonl",
                step_started("attention/FLASH_ATTN"),
                alive=launch.running,
            )
        launch.send(signal.SIGINT)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    assert "Traceback" not in finished.stderr
    assert "killed by" not in finished.stderr
    assert finished.stdout.startswith("Startup interrupted: 3 interrupted")
    logs = rank_logs(run_dir)
    assert len(logs) == 3
    assert [_assert_whole(log)[-1]["outcome"] for log in logs] == ["interrupted"] * 3


def test_a_rank_that_ignores_every_signal_is_killed_after_the_grace(tmp_path: Path) -> None:
    # Rank 1 hangs building its workspace, so rank 0 waits for it in the
    # agreement collective. Rank 1 is then frozen (SIGSTOP), as a process
    # stuck in a driver call would be: SIGINT and SIGTERM cannot reach it.
    run_dir = tmp_path / "run"
    launch = _launch(
        tmp_path, 2, "1:allreduce_workspace/trtllm=hang", STARTUP_ORCHESTRATOR_GRACE_S="0.5"
    )
    with reaping(launch, run_dir):
        wait_for_event(
            run_dir / "rank-0.jsonl",
            step_started("allreduce_workspace/agree"),
            alive=launch.running,
        )
        wait_for_event(
            run_dir / "rank-1.jsonl",
            step_started("allreduce_workspace/trtllm"),
            alive=launch.running,
        )
        frozen = pid_of(run_dir / "rank-1.jsonl")
        os.kill(frozen, signal.SIGSTOP)
        launch.send(signal.SIGINT)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    escalations = [line for line in finished.stderr.splitlines() if "still running" in line]
    assert escalations == [
        "startup-orchestrator: rank 1 still running 0.5 s later; sending SIGTERM",
        "startup-orchestrator: rank 1 still running 0.5 s later; sending SIGKILL",
    ], finished.describe()
    assert f"rank 1 (pid {frozen}): killed by SIGKILL" in finished.stderr
    # The rank that waited in the collective recorded the interruption.
    assert _assert_whole(run_dir / "rank-0.jsonl")[-1]["outcome"] == "interrupted"
    assert read_events(run_dir / "rank-1.jsonl")[-1]["type"] != "run.finished"
    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    assert [r["outcome"] for r in document["ranks"]] == ["interrupted", "incomplete"]


def test_a_terminal_that_hangs_up_stops_the_launch_recorded(tmp_path: Path) -> None:
    # The launcher, in a terminal that went away (an ssh session dropped),
    # was killed by SIGHUP: its manifest never said how its ranks ended.
    primary, secondary = pty.openpty()
    run_dir = tmp_path / "run"
    arguments = ["--simulate", "h200x8", "--nproc", "2", "--run-dir", "run"]
    # setsid --ctty: the launcher leads a session whose terminal is this one.
    launcher = subprocess.Popen(
        ["setsid", "--ctty", *command("run", *arguments, "--inject", "attention/FLASH_ATTN=hang")],
        cwd=tmp_path,
        env=environment(),
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    shown = bytearray()
    reading = threading.Event()
    reading.set()

    def read_the_terminal() -> None:  # a terminal nobody reads fills and blocks
        while reading.is_set():
            if select.select([primary], [], [], 0.05)[0]:
                try:
                    shown.extend(os.read(primary, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=read_the_terminal)
    reader.start()
    try:
        for rank in range(2):
            wait_for_event(
                run_dir / f"rank-{rank}.jsonl",
                step_started("attention/FLASH_ATTN"),
                alive=lambda: launcher.poll() is None,
            )
    finally:
        reading.clear()
        reader.join()
        os.close(primary)  # the terminal hangs up
    assert launcher.wait(timeout=60) == 1, bytes(shown).decode(errors="replace")

    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["launcher"]["finished_wall_ns"] is not None
    for entry in manifest["ranks"]:
        assert entry["exit_code"] == 1, entry
        assert entry["stopped_by_launcher"] == "SIGHUP: the launcher was asked to stop"
    for log in rank_logs(run_dir):
        finished = _assert_whole(log)[-1]
        assert finished["outcome"] == "interrupted"
        assert finished["stop"] == {"signal": "SIGHUP"}, finished
