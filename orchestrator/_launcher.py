"""The local multi-rank launcher behind ``run --nproc N``.

It starts N rank processes of ``python -m orchestrator run`` with the
torchrun environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` for a
gloo group), a shared run id and run directory, and the launcher's own
``TRACEPARENT`` when it has one. It forwards SIGINT and SIGTERM to the ranks,
waits for all of them, and reports how each ended — including a rank that
died. When a rank dies abnormally (killed by a signal, or an exit status
other than 0 ready / 1 failed), or the launcher is asked to stop, the ranks
still running get a grace period, then SIGTERM (they record
``interrupted``), then, after another grace period, SIGKILL: a rank stuck
in a collective with a peer that is gone never keeps the launch waiting
forever. The grace period is 10 s unless the caller says otherwise (the
command line reads ``--grace`` or ``STARTUP_ORCHESTRATOR_GRACE_S``).

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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs

from ._identity import RUN_ID_VARIABLE

__all__ = ["DEFAULT_GRACE_S", "GRACE_VARIABLE", "RankExit", "launch_local"]

#: Set in rank processes started by the launcher.
CHILD_VARIABLE = "STARTUP_ORCHESTRATOR_LAUNCHED"

#: Seconds between a rank's abnormal end (or a stop request) and SIGTERM to
#: the ranks still running, and again between SIGTERM and SIGKILL.
DEFAULT_GRACE_S = 10.0

#: The environment variable the command line reads the grace period from.
GRACE_VARIABLE = "STARTUP_ORCHESTRATOR_GRACE_S"


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
    grace_s: float = DEFAULT_GRACE_S,
    notify: Callable[[str], None] | None = None,
) -> list[RankExit]:
    """Start ``nproc`` ranks running ``python -m orchestrator run
    <rank_arguments>`` and wait for them.

    Args:
        nproc: how many ranks (at least 1).
        rank_arguments: the ``run`` arguments every rank gets.
        run_id: the run id the ranks share.
        run_dir: the run directory the ranks write their logs in.
        environ: the ranks' base environment (default: this process's).
        grace_s: seconds to wait before SIGTERM, and again before SIGKILL,
            once a rank ended abnormally or a stop was asked (> 0).
        notify: called with one line whenever the launcher escalates.

    Returns:
        One :class:`RankExit` per rank started, in rank order (all of them
        unless a stop signal came while they were being started).

    Raises:
        ValueError: ``nproc`` < 1 or ``grace_s`` <= 0.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if not grace_s > 0:
        raise ValueError(f"grace_s must be > 0, not {grace_s}")
    base = dict(os.environ if environ is None else environ)
    port = _free_port()
    processes: list[subprocess.Popen[bytes]] = []
    received: list[int] = []  # the signals asked to stop, in order

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for process in processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    # The handlers go in before the first rank starts: a Ctrl-C while ranks
    # are being started must reach those already running, not orphan them
    # (each rank has its own session, so the terminal's signal misses them).
    previous = {
        sig: signal.signal(sig, forward)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        for rank in range(nproc):
            process = subprocess.Popen(
                _rank_command(rank_arguments, run_dir),
                env=_rank_environment(base, rank, nproc, port, run_id),
                # Each rank in its own session: a terminal's Ctrl-C reaches
                # the launcher once, and the launcher decides what ranks get.
                start_new_session=True,
            )
            processes.append(process)
            if received:
                # Asked to stop while starting: this rank may have started
                # after the signal was forwarded; the rest are not started.
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(received[-1])
                break
        _wait_all(processes, grace_s, received, notify or (lambda _line: None))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return [
        RankExit(rank=rank, pid=process.pid, returncode=process.returncode)
        for rank, process in enumerate(processes)
    ]


def _rank_command(rank_arguments: Sequence[str], run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "run", "--run-dir", str(run_dir), *rank_arguments]


def _rank_environment(
    base: Mapping[str, str], rank: int, nproc: int, port: int, run_id: str
) -> dict[str, str]:
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
    return env


def _ended_abnormally(process: subprocess.Popen[bytes]) -> bool:
    # 0 (ready) and 1 (failed or interrupted, log complete) are a rank's own
    # verdicts; a signal or any other status means it did not finish its log
    # and its peers may wait for it in a collective.
    return process.returncode is not None and process.returncode not in (0, 1)


def _wait_all(
    processes: list[subprocess.Popen[bytes]],
    grace_s: float,
    received: list[int],
    notify: Callable[[str], None],
) -> None:
    deadline: float | None = None
    escalation = 0  # 0: waiting, 1: asked to terminate, 2: killed
    while True:
        running = [p for p in processes if p.poll() is None]
        if not running:
            return
        if deadline is None and (received or any(map(_ended_abnormally, processes))):
            # A peer is gone (the survivors may wait on it in a collective),
            # or the user asked to stop: give the ranks time to record it.
            deadline = time.monotonic() + grace_s
        if deadline is not None and time.monotonic() >= deadline and escalation < 2:
            name = "SIGTERM" if escalation == 0 else "SIGKILL"
            ranks = ",".join(str(processes.index(p)) for p in running)
            label = "rank" if len(running) == 1 else "ranks"
            notify(f"{label} {ranks} still running {grace_s:g} s later; sending {name}")
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
