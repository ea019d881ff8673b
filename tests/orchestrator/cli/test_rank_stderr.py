"""The launcher's relay of a rank's stderr (``run --nproc`` with the live
view): every line reaches the view, the last one without a newline too,
and a process the rank left behind holding the pipe open does not hold
the launch until it exits."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest

from orchestrator._run_directory import LaunchBook, LauncherProcess, Manifest
from orchestrator.cli._launcher import LocalLaunch

pytestmark = pytest.mark.anyio

#: A rank that leaves a process behind on its stderr, says its last words
#: without a newline and ends; the leftover's pid goes to stdout.
_LEAVES_A_PROCESS = """
import subprocess, sys
left = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
print(left.pid, flush=True)
sys.stderr.write("first line\\nlast words")
"""


async def test_a_ranks_last_line_is_relayed_while_a_leftover_holds_its_stderr(
    tmp_path: Path,
) -> None:
    manifest = Manifest(run_id="run-1", world_size=1, launcher=LauncherProcess())
    relayed: list[str] = []
    launch = LocalLaunch(
        rank_arguments=(),
        environ={},
        grace_s=1.0,
        notify=relayed.append,
        book=LaunchBook.claim(tmp_path / "run", manifest),
        tick=None,
        relay=relayed.append,
        pass_fds=(),
    )
    read_end, write_end = os.pipe()
    process = await anyio.open_process(
        [sys.executable, "-c", _LEAVES_A_PROCESS], stderr=write_end, stdout=-1
    )
    os.close(write_end)
    assert process.stdout is not None
    left = int((await process.stdout.receive()).decode())
    try:
        with anyio.fail_after(20):
            await launch.watch(0, process, read_end)
    finally:
        os.kill(left, signal.SIGKILL)
        await process.aclose()
    assert [line.rstrip("\n") for line in relayed] == ["first line", "last words"]
    assert launch.exits[0].returncode == 0
