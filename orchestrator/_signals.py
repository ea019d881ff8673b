"""Stop requests at any moment of a rank's life, and ranks that never outlive
their launcher.

A rank may be asked to stop (SIGINT, SIGTERM, SIGHUP) before its event loop runs:
while it opens its log, sets up tracing, or imports torch. Python's default
handlers would end it then with nothing recorded (SIGTERM) or with a
KeyboardInterrupt traceback somewhere in an import (SIGINT).
:class:`StopRequests` catches both from the moment the log is open and
keeps them, so the run, once it starts, is at once cancelled and recorded
``interrupted`` with the signal as its cause; while the run is going, the
event loop's own signal receiver feeds the same object.

:func:`follow_launcher` ties a rank to the launcher that started it: on
Linux the kernel sends the rank SIGTERM when its launcher dies (the
parent-death signal), so a launcher killed with SIGKILL leaves no orphan
ranks behind; they record ``interrupted``, naming their launcher's exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from ._errors import StartupInterrupted

__all__ = ["LAUNCHER_PID_VARIABLE", "STOP_SIGNALS", "StopRequests", "follow_launcher"]

#: The signals that ask a rank (or its launcher) to stop: a terminal that
#: goes away (SIGHUP, an ssh session dropped) asks as Ctrl-C does.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Set by the local launcher in every rank's environment: its own pid.
LAUNCHER_PID_VARIABLE = "STARTUP_ORCHESTRATOR_LAUNCHER_PID"

_PR_SET_PDEATHSIG = 1


class StopRequests:
    """The stop signals this process received, in order.

    :meth:`install` replaces the handlers of the :data:`STOP_SIGNALS` with one
    that only remembers the signal (and calls ``on_signal``, if given): a
    disposition of the process, so a stop is remembered whichever of its
    threads the kernel hands it to (a mask would hold it on one thread
    only). :meth:`restore` puts the previous handlers back. Only the main
    thread can install. In a process whose own code decides what a stop
    does (a recorded engine's), ``install(chain=True)`` only watches: the
    handler it finds still runs, after the signal is remembered.

    Args:
        launcher_pid: the pid of the launcher that started this process,
            when one did: a stop that arrives once the launcher is gone is
            attributed to its exit.
    """

    def __init__(self, *, launcher_pid: int | None = None) -> None:
        self.launcher_pid = launcher_pid
        self.received: list[int] = []
        self.on_signal: Callable[[int], None] | None = None
        self._previous: dict[int, object] = {}
        self._chain = False
        self._lock = threading.Lock()

    def install(self, *, chain: bool = False) -> None:
        """Catch the stop signals from now on, and let through those a
        launcher that started this process with them blocked held until
        now (main thread only). With ``chain``, remember only the signals a
        Python handler already handles, then call it; the signal mask and
        the signals left to the system (to ignore, or to end the process)
        stay as they are."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._chain = chain
        for signum in STOP_SIGNALS:
            if not chain:
                self._previous[signum] = signal.signal(signum, self.record)
            elif callable(signal.getsignal(signum)):
                self._previous[signum] = signal.signal(signum, self._chained)
        if not chain:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def reinstall(self) -> None:
        """Catch the stop signals again after something else handled them
        for a while (an event loop's signal receiver puts the default
        handlers back when it closes, not ours); :meth:`restore` still puts
        back what :meth:`install` found."""
        if threading.current_thread() is not threading.main_thread() or not self._previous:
            return
        for signum in STOP_SIGNALS:
            with contextlib.suppress(ValueError):
                signal.signal(signum, self.record)

    def restore(self) -> None:
        """Put back the handlers :meth:`install` replaced (chained: those
        still chained, not the ones the process's code has set since)."""
        for signum, handler in self._previous.items():
            if self._chain and signal.getsignal(signum) != self._chained:
                continue
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def record(self, signum: int, _frame: FrameType | None = None) -> None:
        """Remember ``signum``: the signal handler, and what the event loop's
        receiver calls."""
        with self._lock:
            self.received.append(signum)
            callback = self.on_signal
        if callback is not None:
            callback(signum)

    def _chained(self, signum: int, frame: FrameType | None) -> None:
        self.record(signum, frame)
        previous = self._previous.get(signum)
        if callable(previous):
            previous(signum, frame)

    @property
    def requested(self) -> bool:
        """Whether a stop was asked."""
        return bool(self.received)

    def cause(self) -> StartupInterrupted:
        """The first stop as an exception to record as the run's cause."""
        signum = self.received[0] if self.received else signal.SIGTERM
        name = signal.Signals(signum).name
        launcher_gone = self.launcher_pid is not None and os.getppid() != self.launcher_pid
        return StartupInterrupted(
            name,
            f"its launcher (pid {self.launcher_pid}) exited" if launcher_gone else None,
        )


def follow_launcher(launcher_pid: int) -> None:
    """Have the kernel send this process SIGTERM when its launcher dies
    (Linux ``PR_SET_PDEATHSIG``), and act on it at once if the launcher is
    already gone. Call it once stops are caught."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes  # only here: its import costs a launcher's every rank

    with contextlib.suppress(OSError, AttributeError):
        # The process's own symbols hold the C library's prctl.
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    # The launcher may have died before the request was made: the signal
    # would then never come.
    if os.getppid() != launcher_pid:
        os.kill(os.getpid(), signal.SIGTERM)
