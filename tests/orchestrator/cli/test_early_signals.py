"""Signals at any moment are recorded; ranks never outlive their launcher.

A rank writes ``run.started`` before anything slow, and forming the process
group (importing torch, meeting the other ranks) is a recorded step, so a
stop or a kill during it leaves a log that says so. The tests hold a rank in
that step with an injected hang on ``process_group`` and wait on its log
before they send a signal.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from events import RunFinished, RunOutcome, RunStarted, read_log, validate

from .harness import (
    Background,
    environment,
    pid_of,
    read_events,
    reaping,
    run_cli,
    start_cli,
    step_started,
    wait_for_event,
)

pytestmark = pytest.mark.slow


def _launch(tmp_path: Path, inject: str) -> Background:
    return start_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        "2",
        "--grace",
        "0.5",
        "--inject",
        inject,
        "--run-dir",
        "run",
        cwd=tmp_path,
        env=environment(),
    )


def _ended(log: Path) -> RunFinished:
    assert [p for p in validate(log) if p.fatal] == []
    events = read_log(log).events
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished), events[-1]
    return events[-1]


def test_sigterm_while_forming_the_process_group_is_recorded(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, "1:process_group=hang")
    with reaping(launch, run_dir):
        for rank in range(2):
            wait_for_event(
                run_dir / f"rank-{rank}.jsonl",
                step_started("process_group"),
                alive=launch.running,
            )
        os.kill(pid_of(run_dir / "rank-1.jsonl"), signal.SIGTERM)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    assert "Traceback" not in finished.stderr
    stopped = _ended(run_dir / "rank-1.jsonl")
    assert stopped.outcome is RunOutcome.INTERRUPTED
    assert stopped.cause is not None
    assert stopped.cause.message == "received SIGTERM"
    # Rank 0 waited for rank 1 at the rendezvous; the launcher stopped it
    # once rank 1 had ended, and it recorded that too.
    stopped_0 = _ended(run_dir / "rank-0.jsonl")
    assert stopped_0.outcome is RunOutcome.INTERRUPTED
    assert stopped_0.cause is not None
    assert stopped_0.cause.message == "received SIGTERM"
    lines = finished.lines()
    assert lines[0].startswith("Startup interrupted: 2 interrupted")
    assert lines[2] == "Root cause: rank 1, step process_group"
    assert lines[3] == "  StartupInterrupted: received SIGTERM"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    # The manifest names the launcher's last signal: SIGKILL when the
    # machine is so loaded that rank 0 had not ended a grace period after
    # its SIGTERM.
    stopped_by = manifest["ranks"][0]["stopped_by_launcher"]
    assert re.fullmatch(
        r"SIG(TERM|KILL) after rank 1 \(pid \d+\): exited with code 1, 0\.5 s later", stopped_by
    ), stopped_by
    assert manifest["ranks"][1]["stopped_by_launcher"] is None


def test_a_rank_killed_while_forming_the_group_is_named_with_its_signal(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, "1:process_group=hang")
    with reaping(launch, run_dir):
        for rank in range(2):
            wait_for_event(
                run_dir / f"rank-{rank}.jsonl",
                step_started("process_group"),
                alive=launch.running,
            )
        os.kill(pid_of(run_dir / "rank-1.jsonl"), signal.SIGKILL)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    # Killed: its log ends inside the step, and the survivor says why it stopped.
    assert read_events(run_dir / "rank-1.jsonl")[-1]["step"] == "process_group"
    survivor = _ended(run_dir / "rank-0.jsonl")
    assert survivor.outcome is RunOutcome.INTERRUPTED
    lines = finished.lines()
    assert lines[0].startswith("Startup incomplete: 1 incomplete, 1 interrupted")
    assert lines[2].startswith("Root cause: rank 1, step process_group: the process died")
    assert any(
        line.startswith("  its launcher saw: rank 1 (pid ") and "killed by SIGKILL" in line
        for line in lines
    ), finished.stdout


def test_ranks_never_outlive_a_killed_launcher(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, "attention/FLASH_ATTN=hang")
    with reaping(launch, run_dir):
        logs = [run_dir / f"rank-{rank}.jsonl" for rank in range(2)]
        for log in logs:
            wait_for_event(log, step_started("attention/FLASH_ATTN"), alive=launch.running)
        pids = [pid_of(log) for log in logs]
        launch.kill()  # SIGKILL: the launcher can forward nothing
        deadline = time.monotonic() + 5.0
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = [pid for pid in pids if _alive(pid)]

    assert orphans == []
    for log in logs:
        finished = _ended(log)
        assert finished.outcome is RunOutcome.INTERRUPTED
        assert finished.cause is not None
        assert finished.cause.message == (
            f"received SIGTERM: its launcher (pid {launch.pid}) exited"
        )
    replayed = run_cli("replay", "run", cwd=tmp_path)
    assert replayed.lines()[0].startswith("Startup interrupted: 2 interrupted")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_a_stop_before_the_event_loop_is_recorded_at_once(tmp_path: Path) -> None:
    # In process: a SIGTERM that arrives once the log is open and before the
    # loop runs (while tracing is set up, say) is kept, and the run records
    # it first thing.
    from orchestrator import Startup, StartupInterrupted
    from orchestrator.engine import EngineConfig

    startup = Startup(
        EngineConfig(),
        run_dir=tmp_path / "run",
        profile="xeon",
        tracing=None,
        configure_logging=False,
        environ={},
    )
    with startup:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(StartupInterrupted) as raised:
            startup.run()

    assert raised.value.signal == "SIGTERM"
    events = read_log(tmp_path / "run" / "rank-0.jsonl").events
    assert isinstance(events[0], RunStarted)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert finished.outcome is RunOutcome.INTERRUPTED
    assert finished.cause is not None
    assert finished.cause.message == "received SIGTERM"
    assert startup.result is not None
    assert startup.result.outcome is RunOutcome.INTERRUPTED


def _the_moment_it_appears(path: Path, launch: Background, deadline_s: float = 60) -> None:
    """Return as soon as ``path`` exists: the instant a log is created is
    what is tried, so this checks without pausing (the window it aims at was
    a few milliseconds wide)."""
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        assert launch.running(), f"it ended before {path.name} existed"
        assert time.monotonic() < deadline, f"{path.name}: not in time"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("attempt", range(3))
def test_a_stop_the_instant_the_log_is_created_is_recorded(
    tmp_path: Path, signum: signal.Signals, attempt: int
) -> None:
    launch = start_cli("run", "--simulate", "xeon", "--run-dir", "run", cwd=tmp_path)
    log = tmp_path / "run" / "rank-0.jsonl"
    _the_moment_it_appears(log, launch)
    launch.send(signum)
    completed = launch.finish()

    assert completed.returncode == 1, completed.describe()
    assert "Traceback" not in completed.stderr
    events = read_log(log).events
    assert isinstance(events[0], RunStarted)
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.INTERRUPTED


@pytest.mark.parametrize("attempt", range(3))
def test_a_launch_stopped_the_instant_a_ranks_log_is_created_leaves_no_empty_log(
    tmp_path: Path, attempt: int
) -> None:
    launch = start_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--grace", "5", "--run-dir", "run",
        cwd=tmp_path,
    )  # fmt: skip
    run = tmp_path / "run"
    _the_moment_it_appears(run / "rank-1.jsonl", launch)
    launch.send(signal.SIGTERM)
    completed = launch.finish()

    assert completed.returncode == 1, completed.describe()
    assert "Traceback" not in completed.stderr
    for log in sorted(run.glob("rank-*.jsonl")):
        events = read_log(log).events
        assert events, f"{log.name} is empty"
        assert isinstance(events[-1], RunFinished), log.name
        assert events[-1].outcome is RunOutcome.INTERRUPTED, log.name


_STOPPED_BY_A_THREAD = """
import os, signal, sys, threading
from pathlib import Path
from orchestrator import Startup, StartupInterrupted
from orchestrator.engine import EngineConfig

log = Path(sys.argv[1]) / "rank-0.jsonl"

def stop_the_instant_the_log_exists():
    while not log.exists():
        pass
    os.kill(os.getpid(), signal.SIGTERM)

# Another thread is alive, and it is the one the stop comes from: the kernel
# may hand the signal to it rather than to the main thread.
threading.Thread(target=stop_the_instant_the_log_exists, daemon=True).start()
startup = Startup(
    EngineConfig(), run_dir=Path(sys.argv[1]), profile="xeon", tracing=None,
    configure_logging=False, environ={},
)
try:
    with startup:
        startup.run()
except StartupInterrupted as exc:
    print("interrupted by", exc.signal)
"""


@pytest.mark.parametrize("attempt", range(3))
def test_a_stop_while_the_log_is_created_is_recorded_with_other_threads_alive(
    tmp_path: Path, attempt: int
) -> None:
    # Stops are caught by the process's handler from before the log exists:
    # a mask on the main thread alone would leave the other thread to take
    # the SIGTERM and die of it (-15) with the log cut short.
    done = subprocess.run(
        [sys.executable, "-c", _STOPPED_BY_A_THREAD, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=environment(),
    )

    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout.splitlines() == ["interrupted by SIGTERM"]
    finished = _ended(tmp_path / "run" / "rank-0.jsonl")
    assert finished.outcome is RunOutcome.INTERRUPTED
