"""The local multi-rank launcher behind ``run --nproc N``.

It starts N rank processes of ``python -m orchestrator run`` with the
torchrun environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` for a
gloo group), a shared run id and run directory, and the launcher's own
``TRACEPARENT`` when it has one. It forwards SIGINT and SIGTERM to the ranks,
waits for all of them, and reports how each ended — including a rank that
died. When a rank dies abnormally, the others are asked to stop (SIGTERM)
after a grace period, so they record ``interrupted`` instead of waiting
forever for a peer that is gone.

Beyond one machine, use torchrun, SLURM or Ray with the same ``run``
command and a shared ``--run-dir``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from ._identity import RUN_ID_VARIABLE

__all__ = ["RankExit", "launch_local"]

#: Set in rank processes started by the launcher.
CHILD_VARIABLE = "STARTUP_ORCHESTRATOR_LAUNCHED"


@attrs.frozen(kw_only=True)
class RankExit:
    """How one rank process ended."""

    rank: int
    pid: int
    returncode: int

    @property
    def signal(self) -> int | None:
        """The signal that killed it, if one did."""
        return -self.returncode if self.returncode < 0 else None

    def describe(self) -> str:
        """``"rank 3 (pid 123): killed by SIGKILL"`` and the like."""
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            how = f"killed by {name}"
        elif self.returncode == 0:
            how = "ready"
        else:
            how = f"exited with code {self.returncode}"
        return f"rank {self.rank} (pid {self.pid}): {how}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch_local(
    nproc: int,
    rank_arguments: Sequence[str],
    *,
    run_id: str,
    run_dir: Path,
    environ: Mapping[str, str] | None = None,
    grace_s: float = 10.0,
) -> list[RankExit]:
    """Start ``nproc`` ranks running ``python -m orchestrator run
    <rank_arguments>`` and wait for them.

    Returns:
        One :class:`RankExit` per rank, in rank order.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    base = dict(os.environ if environ is None else environ)
    port = _free_port()
    processes: list[subprocess.Popen[bytes]] = []
    for rank in range(nproc):
        env = dict(base)
        env.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                RUN_ID_VARIABLE: run_id,
                CHILD_VARIABLE: "1",
            }
        )
        command = [
            sys.executable,
            "-m",
            "orchestrator",
            "run",
            "--run-dir",
            str(run_dir),
            *rank_arguments,
        ]
        # Each rank in its own session: a terminal's Ctrl-C reaches the
        # launcher once, and the launcher decides what the ranks get.
        processes.append(subprocess.Popen(command, env=env, start_new_session=True))

    stopping = threading.Event()

    def forward(signum: int, _frame: object) -> None:
        stopping.set()
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        _wait_all(processes, grace_s, stopping)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return [
        RankExit(rank=rank, pid=process.pid, returncode=process.returncode)
        for rank, process in enumerate(processes)
    ]


def _wait_all(
    processes: list[subprocess.Popen[bytes]], grace_s: float, stopping: threading.Event
) -> None:
    deadline: float | None = None
    escalation = 0  # 0: waiting, 1: asked to terminate, 2: killed
    while True:
        running = [p for p in processes if p.poll() is None]
        if not running:
            return
        died = any(p.returncode is not None and p.returncode < 0 for p in processes)
        if (died or stopping.is_set()) and deadline is None:
            # A peer is gone (the survivors may wait on it in a collective),
            # or the user asked to stop: give the ranks time to record it.
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() >= deadline and escalation < 2:
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    if escalation == 0:
                        process.terminate()
                    else:
                        process.kill()
            escalation += 1
            deadline = time.monotonic() + grace_s
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].wait(timeout=0.1)
