"""The local multi-rank launcher behind ``run --nproc N``.

It starts N rank processes of ``python -m orchestrator run`` with the
torchrun environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` for a
gloo group), a shared run id and run directory, and the launcher's own
``TRACEPARENT`` when it has one. It forwards SIGINT and SIGTERM to the ranks,
waits for all of them, and reports how each ended — including a rank that
died. When a rank ends other than ready (it failed, was interrupted, or
died), or the launcher is asked to stop, the ranks still running get a
grace period, then SIGTERM (they record ``interrupted``), then, after
another grace period, SIGKILL: a rank stuck in a collective or a rendezvous
with a peer that is gone never keeps the launch waiting forever. The grace
period is 10 s unless the caller says otherwise (the command line reads
``--grace`` or ``STARTUP_ORCHESTRATOR_GRACE_S``).

Given a :class:`~orchestrator._run_directory.Manifest`, the launcher keeps it
up to date in the run directory as the launch goes (each rank's pid and
start time as it starts; its exit status or signal, and any signal the
launcher sent it and why, as it ends), rewriting it atomically each time.
Ranks never outlive the launcher: each learns its launcher's pid and asks
the kernel for SIGTERM when the launcher dies (see ``_signals``).

Beyond one machine, use torchrun or SLURM with the same ``run`` command
(rank 0's run directory collects every rank's log at the end, no shared
filesystem needed), or :mod:`orchestrator.ray` for Ray actors.
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

from events import RankProcess

from .._identity import RUN_ID_VARIABLE
from .._run_directory import Manifest
from .._signals import LAUNCHER_PID_VARIABLE, STOP_SIGNALS

__all__ = ["DEFAULT_GRACE_S", "GRACE_VARIABLE", "RankExit", "launch_local"]

#: Set in rank processes started by the launcher.
CHILD_VARIABLE = "STARTUP_ORCHESTRATOR_LAUNCHED"

#: Seconds between a rank's end other than ready (or a stop request) and SIGTERM to
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
            how = f"killed by {_signal_name(self.signal)}"
        elif self.returncode == 0:
            how = "ready"
        else:
            how = f"exited with code {self.returncode}"
        return f"rank {self.rank} (pid {self.pid}): {how}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
    manifest: Manifest | None = None,
    tick: Callable[[], None] | None = None,
    relay: Callable[[str], None] | None = None,
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
            once a rank ended other than ready or a stop was asked (> 0).
        notify: called with one line whenever the launcher escalates.
        manifest: the launch's manifest, already written to ``run_dir``;
            kept up to date there as ranks start and end.
        tick: called about every 0.1 s while the launcher waits for its
            ranks, in the launcher's thread (a live view looks at the logs).
        relay: when given, the ranks' stderr is read by the launcher and
            each of its lines handed to ``relay`` (so that a live view can
            print them above itself); otherwise the ranks share the
            launcher's stderr.

    Returns:
        One :class:`RankExit` per rank started, in rank order (all of them
        unless a stop signal came while they were being started).

    Raises:
        ValueError: ``nproc`` < 1 or ``grace_s`` <= 0.
        RunDirectoryError: the manifest could not be rewritten.
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    if not grace_s > 0:
        raise ValueError(f"grace_s must be > 0, not {grace_s}")
    launch = _Launch(
        base=dict(os.environ if environ is None else environ),
        nproc=nproc,
        rank_arguments=rank_arguments,
        run_id=run_id,
        run_dir=run_dir,
        grace_s=grace_s,
        notify=notify or (lambda _line: None),
        manifest=manifest,
        tick=tick,
        relay=relay,
    )
    # The handlers go in before the first rank starts: a Ctrl-C while ranks
    # are being started must reach those already running, not orphan them
    # (each rank has its own session, so the terminal's signal misses them).
    previous = {
        sig: signal.signal(sig, launch.forward)
        for sig in (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        launch.start_all()
        launch.wait_all()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return [
        RankExit(rank=rank, pid=process.pid, returncode=process.returncode)
        for rank, process in enumerate(launch.processes)
    ]


class _Launch:
    """The ranks of one launch, what was done to them, and its manifest."""

    def __init__(
        self,
        *,
        base: dict[str, str],
        nproc: int,
        rank_arguments: Sequence[str],
        run_id: str,
        run_dir: Path,
        grace_s: float,
        notify: Callable[[str], None],
        manifest: Manifest | None,
        tick: Callable[[], None] | None = None,
        relay: Callable[[str], None] | None = None,
    ) -> None:
        self.base = base
        self.nproc = nproc
        self.rank_arguments = rank_arguments
        self.run_id = run_id
        self.run_dir = run_dir
        self.grace_s = grace_s
        self.notify = notify
        self.manifest = manifest
        self.port = _free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self.received: list[int] = []  # the signals asked to stop, in order
        #: rank -> what the launcher sent it and why
        self.sent: dict[int, str] = {}
        self.recorded_ends: set[int] = set()
        self.tick = tick
        self.relay = relay
        #: rank -> what its stderr pipe has given that is not yet a whole line
        self.partial: dict[int, bytes] = {}

    def forward(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        name = _signal_name(signum)
        for rank, process in enumerate(self.processes):
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)
                self.sent.setdefault(rank, f"{name}: the launcher was asked to stop")

    def start_all(self) -> None:
        for rank in range(self.nproc):
            # A SIGINT or SIGTERM forwarded while the rank's interpreter is
            # still starting would end it with a traceback from deep in an
            # import, or with an empty log: the rank starts with both
            # blocked (held, not lost) until it catches stops itself, from
            # the moment its log is open, and then records them. The mask
            # is this thread's while the rank starts, and the rank inherits
            # it through exec; setting it in
            # the child instead (preexec_fn) would make every start a full
            # fork of the launcher (about 5 ms here, against 0.3 ms). A
            # SIGINT for the launcher itself waits that long, then is
            # handled.
            held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                process = subprocess.Popen(
                    _rank_command(self.rank_arguments, self.run_dir),
                    env=_rank_environment(self.base, rank, self.nproc, self.port, self.run_id),
                    # Each rank in its own session: a terminal's Ctrl-C
                    # reaches the launcher once, and the launcher decides
                    # what ranks get.
                    start_new_session=True,
                    stderr=subprocess.PIPE if self.relay is not None else None,
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            if process.stderr is not None:
                os.set_blocking(process.stderr.fileno(), False)
            self.processes.append(process)
            self.update(RankProcess(rank=rank, pid=process.pid, started_wall_ns=time.time_ns()))
            if self.received:
                # Asked to stop while starting: this rank may have started
                # after the signal was forwarded; the rest are not started.
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(self.received[-1])
                self.sent.setdefault(
                    rank, f"{_signal_name(self.received[-1])}: the launcher was asked to stop"
                )
                break

    def update(self, entry: RankProcess) -> None:
        if self.manifest is None:
            return
        self.manifest = self.manifest.with_rank(entry)
        self.manifest.write(self.run_dir)

    def record_ends(self) -> None:
        """Write down, once each, how every rank that ended ended."""
        if self.manifest is None:
            return
        changed = False
        for rank, process in enumerate(self.processes):
            if rank in self.recorded_ends or process.returncode is None:
                continue
            self.recorded_ends.add(rank)
            entry = self.manifest.rank(rank) or RankProcess(rank=rank, pid=process.pid)
            code = process.returncode
            self.manifest = self.manifest.with_rank(
                attrs.evolve(
                    entry,
                    ended_wall_ns=time.time_ns(),
                    exit_code=code if code >= 0 else None,
                    signal=_signal_name(-code) if code < 0 else None,
                    stopped_by_launcher=self.sent.get(rank),
                )
            )
            changed = True
        if changed and len(self.recorded_ends) == len(self.processes):
            never = [rank for rank in range(self.nproc) if self.manifest.rank(rank) is None]
            for rank in never:
                self.manifest = self.manifest.with_rank(
                    RankProcess(
                        rank=rank, stopped_by_launcher="never started: the launch was stopped"
                    )
                )
            self.manifest = attrs.evolve(self.manifest, finished_wall_ns=time.time_ns())
        if changed:
            self.manifest.write(self.run_dir)

    def wait_all(self) -> None:
        processes = self.processes
        deadline: float | None = None
        escalation = 0  # 0: waiting, 1: asked to terminate, 2: killed
        why = ""
        while True:
            for process in processes:
                process.poll()
            self.record_ends()
            self.relay_output()
            if self.tick is not None:
                self.tick()
            running = [p for p in processes if p.returncode is None]
            if not running:
                self.relay_output(final=True)
                return
            if deadline is None:
                dead = [rank for rank, p in enumerate(processes) if _ended_unready(p)]
                if self.received or dead:
                    # A peer is gone (the survivors may wait on it in a
                    # collective), or the user asked to stop: give the ranks
                    # time to record it.
                    deadline = time.monotonic() + self.grace_s
                    if dead:
                        exit = RankExit(
                            rank=dead[0],
                            pid=processes[dead[0]].pid,
                            returncode=processes[dead[0]].returncode or 0,
                        )
                        why = f"after {exit.describe()}"
                    else:
                        why = "after the launcher was asked to stop"
            if deadline is not None and time.monotonic() >= deadline and escalation < 2:
                name = "SIGTERM" if escalation == 0 else "SIGKILL"
                ranks = ",".join(str(processes.index(p)) for p in running)
                label = "rank" if len(running) == 1 else "ranks"
                self.notify(
                    f"{label} {ranks} still running {self.grace_s:g} s later; sending {name}"
                )
                for process in running:
                    rank = processes.index(process)
                    self.sent[rank] = f"{name} {why}, {self.grace_s:g} s later"
                    with contextlib.suppress(ProcessLookupError):
                        if escalation == 0:
                            process.terminate()
                        else:
                            process.kill()
                escalation += 1
                deadline = time.monotonic() + self.grace_s
            with contextlib.suppress(subprocess.TimeoutExpired):
                running[0].wait(timeout=0.1)

    def relay_output(self, *, final: bool = False) -> None:
        """Hand the ranks' whole stderr lines read so far to ``relay``; with
        ``final``, what is left too, and close the pipes (a process a rank
        left behind may hold them open: nothing waits for it)."""
        if self.relay is None:
            return
        for rank, process in enumerate(self.processes):
            pipe = process.stderr
            if pipe is None or pipe.closed:
                continue
            data = self.partial.pop(rank, b"")
            with contextlib.suppress(BlockingIOError, OSError):
                while chunk := pipe.read(1 << 16):
                    data += chunk
            complete, newline, rest = data.rpartition(b"\n")
            if final:
                complete, rest = data.removesuffix(b"\n"), b""
                pipe.close()
            elif not newline:
                complete, rest = b"", data
            if rest:
                self.partial[rank] = rest
            for line in complete.split(b"\n") if complete else ():
                self.relay(line.decode("utf-8", "replace"))


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
            LAUNCHER_PID_VARIABLE: str(os.getpid()),
        }
    )
    return env


def _ended_unready(process: subprocess.Popen[bytes]) -> bool:
    # Once a rank has ended other than ready (failed or interrupted with its
    # log complete, killed, or any other status), the launch cannot become
    # ready, and its peers may wait for it in a collective or a rendezvous
    # until their group times out: they get the grace period, then are
    # stopped (as torchrun stops a worker group when one worker fails).
    return process.returncode is not None and process.returncode != 0
