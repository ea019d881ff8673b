"""The local multi-rank launcher behind ``run --nproc N``.

It starts N rank processes of ``python -m orchestrator run`` with the
torchrun environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` for a
gloo group), a shared run id and run directory, and the launcher's own
``TRACEPARENT`` when it has one. It forwards SIGINT, SIGTERM and SIGHUP to
the ranks, waits for all of them (a task each: nothing polls), and reports
how each ended — including a rank that died. When a rank ends other than
ready (it failed, was interrupted, or died), or the launcher is asked to
stop, the ranks still running get a grace period, then SIGTERM (they record
``interrupted``), then, after another grace period, SIGKILL: a rank stuck in
a collective or a rendezvous with a peer that is gone never keeps the launch
waiting forever. The grace period is 10 s unless the caller says otherwise
(the command line reads ``--grace`` or ``STARTUP_ORCHESTRATOR_GRACE_S``).

The launcher writes what it sees in the launch's record
(:class:`~orchestrator._run_directory.LaunchBook`, the manifest in the run
directory): each rank's pid and start time as it starts; its exit status or
signal, and any signal the launcher sent it and why, as it ends.
Ranks never outlive the launcher: each learns its launcher's pid and asks
the kernel for SIGTERM when the launcher dies (see ``_signals``).

Beyond one machine, use torchrun or SLURM with the same ``run`` command
(rank 0's run directory collects every rank's log at the end, no shared
filesystem needed), or :mod:`orchestrator.ray` for Ray actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import anyio
import attrs
from anyio.abc import Process, TaskGroup, TaskStatus

from events import RankProcess, signal_name

from .._identity import RUN_ID_VARIABLE
from .._run_directory import LaunchBook
from .._signals import LAUNCHER_PID_VARIABLE, STOP_SIGNALS

__all__ = ["DEFAULT_GRACE_S", "GRACE_VARIABLE", "LocalLaunch", "RankExit"]

#: Set in rank processes started by the launcher.
CHILD_VARIABLE = "STARTUP_ORCHESTRATOR_LAUNCHED"

#: Set in rank processes started by the launcher to how reports name the
#: simulated host (a profile file's path and digest: the rank reads the
#: launcher's copy of the file, not the path).
SIMULATED_VARIABLE = "STARTUP_ORCHESTRATOR_SIMULATED"

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

    def describe(self) -> str:
        """``"rank 3 (pid 123): killed by SIGKILL"`` or ``"...: exited with
        code 1"``: how a rank that did not reach ready ended."""
        if self.returncode < 0:
            return f"rank {self.rank} (pid {self.pid}): killed by {signal_name(-self.returncode)}"
        return f"rank {self.rank} (pid {self.pid}): exited with code {self.returncode}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_without_threads() -> None:
    """Have asyncio wait for the ranks on pidfds, as it does by default from
    Python 3.12 on where the kernel has them, not with a thread per rank as
    3.11 does: a rank's parent-death signal comes when the launcher thread
    that started it dies, and with other threads alive when the launcher is
    killed the rank would get it from a launcher that is still there, and
    could not tell that it had died."""
    if sys.version_info >= (3, 12):
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return  # no pidfds on this kernel
    asyncio.get_event_loop_policy().set_child_watcher(asyncio.PidfdChildWatcher())


#: How long a rank's stderr is still read once the rank ended: a process it
#: left behind may hold the pipe open, and nothing waits for it.
_DRAIN_S = 0.5


@attrs.define(kw_only=True, eq=False)
class LocalLaunch:
    """The ranks of ``book``'s launch, each running ``python -m orchestrator
    run <rank_arguments>`` with its run id and run directory, started and
    waited for by :meth:`run`, and what was done to them.

    Args:
        rank_arguments: the ``run`` arguments every rank gets.
        environ: the ranks' base environment.
        grace_s: seconds to wait before SIGTERM, and again before SIGKILL,
            once a rank ended other than ready or a stop was asked.
        notify: called with one line whenever the launcher escalates.
        book: the launch's record, its manifest already in its run directory
            (:meth:`~orchestrator._run_directory.LaunchBook.claim`); each
            rank's start and end, and the launch's, are written to it.
        tick: called about every 0.25 s while the launcher waits for its
            ranks, in the launcher's thread (a live view looks at the logs).
        relay: when given, the ranks' stderr is read by the launcher and
            each of its lines handed to ``relay`` (so that a live view can
            print them above itself); otherwise the ranks share the
            launcher's stderr.
        pass_fds: file descriptors the ranks inherit.
    """

    rank_arguments: Sequence[str]
    environ: Mapping[str, str]
    grace_s: float
    notify: Callable[[str], None]
    book: LaunchBook
    tick: Callable[[], None] | None
    relay: Callable[[str], None] | None
    pass_fds: Sequence[int]
    processes: list[Process] = attrs.field(factory=list)
    #: how each rank that ended ended, by rank
    exits: dict[int, RankExit] = attrs.field(factory=dict)
    received: list[signal.Signals] = attrs.field(factory=list)  # the stops asked, in order
    #: rank -> what the launcher sent it and why
    sent: dict[int, str] = attrs.field(factory=dict)
    #: set once the launch cannot become ready: a rank ended other than
    #: ready, or a stop was asked; ``why`` says which, for the manifest
    trouble: anyio.Event = attrs.field(factory=anyio.Event)
    why: str = ""
    starting: bool = True

    def run(self) -> list[RankExit]:
        """Start the ranks and wait for them.

        Returns:
            One :class:`RankExit` per rank started, in rank order (all of
            them unless a stop signal came while they were being started).

        Raises:
            RunDirectoryError: the manifest could not be rewritten (raised
                once every rank has ended: the launch goes on without it).
        """
        # The event loop's signal receiver replaces the handlers while the
        # launch runs; the caller's come back after it.
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        _wait_without_threads()
        try:
            anyio.run(self._main, backend="asyncio")
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
        if self.book.unwritten is not None:
            raise self.book.unwritten
        return [self.exits[rank] for rank in range(len(self.processes))]

    async def _main(self) -> None:
        async with anyio.create_task_group() as helpers:
            # The receiver is in place before the first rank starts: a Ctrl-C
            # while ranks are being started must reach those already running,
            # not orphan them (each rank has its own session, so the
            # terminal's signal misses them).
            if threading.current_thread() is threading.main_thread():
                await helpers.start(self.forward)
            helpers.start_soon(self.escalate)
            if self.tick is not None:
                helpers.start_soon(self.ticking, self.tick)
            async with anyio.create_task_group() as ranks:
                await self.start_all(ranks)
                self.starting = False
                self.finish_if_done()
            helpers.cancel_scope.cancel()

    async def forward(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        with anyio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                self.received.append(signum)
                for rank in self.running():
                    self.pass_on(signum, rank)
                self.trouble_from("after the launcher was asked to stop")

    def pass_on(self, signum: signal.Signals, rank: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.processes[rank].send_signal(signum)
        self.sent.setdefault(rank, f"{signal_name(signum)}: the launcher was asked to stop")

    def running(self) -> list[int]:
        return [rank for rank in range(len(self.processes)) if rank not in self.exits]

    def trouble_from(self, why: str) -> None:
        if not self.trouble.is_set():
            self.why = why
            self.trouble.set()

    async def escalate(self) -> None:
        """Once the launch cannot become ready: SIGTERM, then SIGKILL, each
        a grace period later, to the ranks still running."""
        await self.trouble.wait()
        for name in ("SIGTERM", "SIGKILL"):
            await anyio.sleep(self.grace_s)
            running = self.running()
            if not running:
                return
            label = "rank" if len(running) == 1 else "ranks"
            ranks = ",".join(map(str, running))
            self.notify(f"{label} {ranks} still running {self.grace_s:g} s later; sending {name}")
            for rank in running:
                self.sent[rank] = f"{name} {self.why}, {self.grace_s:g} s later"
                with contextlib.suppress(ProcessLookupError):
                    self.processes[rank].send_signal(signal.Signals[name])

    @staticmethod
    async def ticking(tick: Callable[[], None]) -> None:
        while True:
            tick()
            await anyio.sleep(0.25)

    async def start_all(self, ranks: TaskGroup) -> None:
        run_dir, manifest = self.book.run_dir, self.book.manifest
        command = [sys.executable, "-m", "orchestrator", "run", "--run-dir", str(run_dir)]
        world = str(manifest.world_size)
        environ = {
            **self.environ,
            "WORLD_SIZE": world,
            "LOCAL_WORLD_SIZE": world,
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            RUN_ID_VARIABLE: manifest.run_id,
            CHILD_VARIABLE: "1",
            LAUNCHER_PID_VARIABLE: str(os.getpid()),
        }
        for rank in range(manifest.world_size):
            # A SIGINT or SIGTERM forwarded while the rank's interpreter is
            # still starting would end it with a traceback from deep in an
            # import, or with an empty log: the rank starts with both
            # blocked (held, not lost) until it catches stops itself, from
            # the moment its log is open, and then records them. The mask
            # is this thread's while the rank starts (asyncio starts it in
            # this thread), and the rank inherits it through exec; setting
            # it in the child instead (preexec_fn) would make every start a
            # full fork of the launcher (about 5 ms here, against 0.3 ms).
            # A stop for the launcher itself waits that long, then is handled.
            stderr = os.pipe() if self.relay is not None else None
            held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            try:
                process = await anyio.open_process(
                    [*command, *self.rank_arguments],
                    env={**environ, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                    # Each rank in its own session: a terminal's Ctrl-C
                    # reaches the launcher once, and the launcher decides
                    # what ranks get.
                    start_new_session=True,
                    stdin=None,
                    stdout=None,
                    # A pipe of our own, not the event loop's: its wait for
                    # the process would wait for the pipe's other end too.
                    stderr=None if stderr is None else stderr[1],
                    pass_fds=self.pass_fds,
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                if stderr is not None:
                    os.close(stderr[1])
            self.processes.append(process)
            self.book.record(
                RankProcess(rank=rank, pid=process.pid, started_wall_ns=time.time_ns())
            )
            ranks.start_soon(self.watch, rank, process, None if stderr is None else stderr[0])
            if self.received:
                # Asked to stop while starting: this rank may have started
                # after the signal was forwarded; the rest are not started.
                self.pass_on(self.received[-1], rank)
                break

    async def watch(self, rank: int, process: Process, stderr: int | None) -> None:
        async with anyio.create_task_group() as reading:
            if stderr is not None:
                reading.start_soon(self.read, stderr)
            code = await process.wait()
            self.exits[rank] = exit = RankExit(rank=rank, pid=process.pid, returncode=code)
            self.book.ended(
                rank,
                exit_code=code if code >= 0 else None,
                signal=signal_name(-code) if code < 0 else None,
                stopped_by_launcher=self.sent.get(rank),
            )
            if code != 0:
                # Once a rank has ended other than ready (failed or
                # interrupted with its log complete, killed, or any other
                # status), the launch cannot become ready, and its peers may
                # wait for it in a collective or a rendezvous until their
                # group times out: they get the grace period, then are
                # stopped (as torchrun stops a worker group when one fails).
                self.trouble_from(f"after {exit.describe()}")
            self.finish_if_done()
            reading.cancel_scope.deadline = anyio.current_time() + _DRAIN_S
        if stderr is not None:
            os.close(stderr)

    async def read(self, fd: int) -> None:
        """Hand ``fd``'s lines to ``relay`` until its end, or until the read
        is cancelled (what is left of a line too)."""
        assert self.relay is not None
        os.set_blocking(fd, False)
        partial = b""
        try:
            while True:
                await anyio.wait_readable(fd)
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                *lines, partial = (partial + chunk).split(b"\n")
                for line in lines:
                    self.relay(line.decode("utf-8", "replace"))
        finally:
            if partial:
                self.relay(partial.decode("utf-8", "replace"))

    def finish_if_done(self) -> None:
        """Once every rank started has ended, and no more will start: the
        ranks never started, and the launch's end, in the manifest."""
        if self.starting or len(self.exits) < len(self.processes):
            return
        self.book.finish(not_started="never started: the launch was stopped")
