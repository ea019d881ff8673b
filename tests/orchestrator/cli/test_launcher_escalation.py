"""The local launcher's own record of how its ranks ended, and its
escalation once the launch cannot become ready: the ranks still running get
the grace period, then SIGTERM, then after another grace period SIGKILL.

The ranks here are small Python processes the test starts and hands to the
launcher's waiter (as ``run`` starts rank processes), so that each ends as
the test says: an exit status, a signal, or never, ignoring SIGTERM."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import anyio
import pytest
from anyio.abc import Process

from events import RankProcess
from orchestrator._run_directory import LaunchBook, LauncherProcess, Manifest, read_manifest
from orchestrator.cli._launcher import LocalLaunch, RankExit

pytestmark = pytest.mark.anyio

GRACE_S = 0.05

#: A rank that says it is ready for signals, then ignores SIGTERM and waits.
_IGNORES_SIGTERM = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def _launch(run_dir: Path, world_size: int, notified: list[str]) -> LocalLaunch:
    manifest = Manifest(run_id="run-1", world_size=world_size, launcher=LauncherProcess())
    return LocalLaunch(
        rank_arguments=(),
        environ={},
        grace_s=GRACE_S,
        notify=notified.append,
        book=LaunchBook.claim(run_dir, manifest),
        tick=None,
        relay=None,
        pass_fds=(),
    )


async def _start(launch: LocalLaunch, script: str) -> Process:
    process = await anyio.open_process([sys.executable, "-c", script], stdout=-1)
    launch.processes.append(process)
    launch.book.record(RankProcess(rank=len(launch.processes) - 1, pid=process.pid))
    return process


async def _wait_for_all(launch: LocalLaunch) -> None:
    """What the launcher does once its ranks are started: wait for each,
    and escalate once the launch cannot become ready."""
    launch.starting = False
    try:
        with anyio.fail_after(10):
            async with anyio.create_task_group() as helpers:
                helpers.start_soon(launch.escalate)
                async with anyio.create_task_group() as ranks:
                    for rank, process in enumerate(launch.processes):
                        ranks.start_soon(launch.watch, rank, process, None)
                helpers.cancel_scope.cancel()
    finally:
        for process in launch.processes:
            with contextlib.suppress(ProcessLookupError):
                process.kill()


@pytest.mark.parametrize(
    ("first", "how"),
    [
        ("import sys; sys.exit(1)", "exited with code 1"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL"),
    ],
    ids=["exited", "killed"],
)
async def test_a_rank_that_ended_other_than_ready_gets_its_peers_stopped_after_the_grace(
    tmp_path: Path, first: str, how: str
) -> None:
    notified: list[str] = []
    launch = _launch(tmp_path / "run", 2, notified)
    # Rank 0 ends as the parameter says, while rank 1 runs on.
    failing = await _start(launch, first)
    stubborn = await _start(launch, _IGNORES_SIGTERM)
    assert stubborn.stdout is not None
    await stubborn.stdout.receive()  # its SIGTERM is ignored from now on

    await _wait_for_all(launch)

    assert notified == [
        f"rank 1 still running {GRACE_S:g} s later; sending SIGTERM",
        f"rank 1 still running {GRACE_S:g} s later; sending SIGKILL",
    ]
    cause = f"rank 0 (pid {failing.pid}): {how}"
    assert launch.exits[0].describe() == cause
    assert launch.exits[1].describe() == f"rank 1 (pid {stubborn.pid}): killed by SIGKILL"
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None
    (ended,) = [entry for entry in manifest.ranks if entry.rank == 1]
    assert (ended.exit_code, ended.signal) == (None, "SIGKILL")
    assert ended.stopped_by_launcher == f"SIGKILL after {cause}, {GRACE_S:g} s later"
    assert manifest.launcher.finished_wall_ns is not None


async def test_ranks_that_reach_ready_are_recorded_with_their_exit_status_and_left_alone(
    tmp_path: Path,
) -> None:
    notified: list[str] = []
    launch = _launch(tmp_path / "run", 2, notified)
    for _ in range(2):
        await _start(launch, "")

    await _wait_for_all(launch)

    assert notified == []
    assert [launch.exits[rank].returncode for rank in (0, 1)] == [0, 0]
    manifest = read_manifest(tmp_path / "run")
    assert manifest is not None
    assert [(e.exit_code, e.signal, e.stopped_by_launcher) for e in manifest.ranks] == [
        (0, None, None),
        (0, None, None),
    ]
    assert manifest.launcher.finished_wall_ns is not None


@pytest.mark.parametrize(
    ("returncode", "said"),
    [(1, "exited with code 1"), (2, "exited with code 2"), (-9, "killed by SIGKILL")],
)
def test_how_a_rank_ended_is_said_with_its_exit_status_or_signal(
    returncode: int, said: str
) -> None:
    exit = RankExit(rank=3, pid=123, returncode=returncode)
    assert exit.describe() == f"rank 3 (pid 123): {said}"
