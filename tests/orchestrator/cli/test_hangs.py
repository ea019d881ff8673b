"""A rank that hangs, through the command line: while it hangs, the run
replays as running and says where the rank waits; killed, it keeps where it
waited in every view; stopped, it records where it was left.

The hang is an injected one, which is never released: a thread blocked in
``threading.Event().wait()`` as a driver call that never returns.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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

#: Where an injected hang waits, as every view names it.
WAITS_IN = "waiting in fire (_faults.py:"


def _launch(tmp_path: Path, nproc: int, inject: str) -> Background:
    return start_cli(
        "run",
        "--simulate",
        "h200x8",
        "--nproc",
        str(nproc),
        "--inject",
        inject,
        "--stall",
        "0.2",
        "--run-dir",
        "run",
        cwd=tmp_path,
        env=environment(),
    )


def seconds(duration: str) -> float:
    """A view's duration (``4.2s``, ``812ms``, ``90us``) in seconds."""
    for unit, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0)):
        if duration.endswith(unit):
            return float(duration.removesuffix(unit)) * scale
    raise AssertionError(f"not a duration: {duration!r}")


def _stalled(step: str) -> Callable[[dict[str, Any]], bool]:
    return lambda event: event["type"] == "step.stalled" and event.get("step") == step


def test_a_hung_rank_replays_as_running_and_its_death_keeps_where_it_waited(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, 2, "1:attention/FLASH_ATTN=hang")
    log = run_dir / "rank-1.jsonl"
    with reaping(launch, run_dir):
        stall = wait_for_event(log, _stalled("attention/FLASH_ATTN"), alive=launch.running)
        assert stall.get("why", "stalled") == "stalled"  # the default is left out
        (thread,) = stall["threads"]
        assert thread["thread"] == "step attention/FLASH_ATTN"

        live = run_cli("replay", "run", cwd=tmp_path)
        assert live.lines()[0].startswith("Startup running: 1 running"), live.stdout
        assert "Root cause: none so far (no rank has failed)" in live.stdout
        assert "  rank 1 is still running, in attention/FLASH_ATTN" in live.stdout
        assert WAITS_IN in live.stdout
        assert "crashed or was killed" not in live.stdout

        os.kill(pid_of(log), signal.SIGKILL)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    replayed = run_cli("replay", "run", cwd=tmp_path)
    assert replayed.lines()[0].startswith("Startup incomplete"), replayed.stdout
    assert replayed.lines()[2].startswith("Root cause: rank 1, step attention/FLASH_ATTN")
    # Under the root cause, first: where its step waited, then the stack.
    where = next(line for line in replayed.lines() if WAITS_IN in line)
    assert re.fullmatch(r" +waiting in fire \(_faults\.py:\d+\) after \d+\.\d s", where), where
    assert "thread 'step attention/FLASH_ATTN', innermost first:" in replayed.stdout

    document = run_cli("replay", "--json", "run", cwd=tmp_path).json()
    waiting = document["root_cause"]["waiting"]
    assert (waiting["step"], waiting["why"]) == ("attention/FLASH_ATTN", "stalled")
    assert waiting["waiting_in"].startswith("fire (_faults.py:")
    # Innermost first: the wait the fault blocks in, then the fault.
    names = [frame["name"] for frame in waiting["threads"][0]["frames"]]
    assert names[names.index("fire") - 1] == "wait"

    explained = run_cli("explain", "run", cwd=tmp_path).stdout
    assert WAITS_IN in explained
    blamed = run_cli("blame", "run", cwd=tmp_path).stdout
    (hung,) = [line for line in blamed.splitlines() if "attention/FLASH_ATTN (rank 1" in line]
    assert hung.endswith("attention/FLASH_ATTN (rank 1, still running when its log ends)")
    # It lasted until the launcher saw the rank die, after its last event.
    (started,) = [
        e
        for e in read_events(log)
        if e["type"] == "step.started" and e["step"] == "attention/FLASH_ATTN"
    ]
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    died = manifest["ranks"][1]["ended_wall_ns"]
    assert died > read_events(log)[-1]["wall_ns"]
    assert abs(seconds(hung.split()[0]) - (died - started["wall_ns"]) / 1e9) < 0.05, hung
    path = run_cli("critical-path", "run", cwd=tmp_path).stdout
    assert path.startswith("run incomplete"), path


def test_a_stop_records_where_each_hung_rank_was_left(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    launch = _launch(tmp_path, 2, "attention/FLASH_ATTN=hang")
    with reaping(launch, run_dir):
        for rank in range(2):
            wait_for_event(
                run_dir / f"rank-{rank}.jsonl",
                step_started("attention/FLASH_ATTN"),
                alive=launch.running,
            )
        launch.send(signal.SIGTERM)
        finished = launch.finish()

    assert finished.returncode == 1, finished.describe()
    assert finished.stdout.startswith("Startup interrupted: 2 interrupted"), finished.stdout
    for rank in range(2):
        logged = read_events(run_dir / f"rank-{rank}.jsonl")
        assert logged[-1]["type"] == "run.finished"
        left = [e for e in logged if e["type"] == "step.stalled" and e.get("why") == "abandoned"]
        # Every step given up with a thread at work, the hung one among them
        # (an exchange with the peer may be in flight too), before it ends.
        (hung,) = [e for e in left if e["step"] == "attention/FLASH_ATTN"]
        (cancelled,) = [
            e
            for e in logged
            if e["type"] == "step.cancelled" and e["step"] == "attention/FLASH_ATTN"
        ]
        assert hung["seq"] < cancelled["seq"]
    replayed = run_cli("replay", "run", cwd=tmp_path)
    assert re.search(
        r"waiting in fire \(_faults\.py:\d+\) after \d+\.\d s, abandoned", replayed.stdout
    ), replayed.stdout
