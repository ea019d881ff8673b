"""What the command line prints: reports to stdout, diagnostics to stderr,
under the program's name."""

from __future__ import annotations

import errno
import os
import sys
from typing import NoReturn, TextIO

__all__ = ["PROG", "diagnose", "discard", "emit", "exit_program", "hold_stops", "write"]

#: The program's name, at the head of every diagnostic line.
PROG = "startup-orchestrator"


def emit(text: str) -> None:
    """Print to stdout (reports go to stdout, diagnostics to stderr). Once
    its reader has gone (``| head``, a terminal hung up), the rest goes
    nowhere and the command goes on: its exit status still says the
    outcome."""
    write(sys.stdout, text if text.endswith("\n") else text + "\n")


def diagnose(text: str) -> None:
    """Print ``text`` on stderr under the program's name, as terminal text:
    its control characters escaped and any further lines indented, since a
    path or a value in it may come from a crafted log or directory name and
    must not clear the screen, move the cursor or forge a line. A terminal
    that hung up takes nothing more, as for :func:`emit`."""
    from exporters import terminal_text

    write(sys.stderr, terminal_text(f"{PROG}: {text}") + "\n")


def write(stream: TextIO, text: str) -> None:
    """Write ``text`` on ``stream`` and flush it (every line the command line
    prints goes through here); once its reader has gone, what is left goes
    nowhere (:func:`discard`)."""
    try:
        stream.write(text)
        stream.flush()
    except OSError as exc:
        if exc.errno not in (errno.EPIPE, errno.EIO):
            raise
        discard(stream)


def discard(stream: TextIO) -> None:
    """Send the rest of ``stream`` nowhere: its reader has gone (a closed
    pipe, a terminal hung up), which is no error of ours."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stream.fileno())
    os.close(devnull)


def hold_stops() -> bool:
    """Ignore the stop signals from here on, once the program's work is
    done and only its last output is left. Returns whether it did: not while
    a thread that is not a daemon is still running, since the interpreter's
    exit waits for it and a stop must still end the process (nor, since
    only that thread may, off the main thread).

    The disposition is the process's, not a thread's: a signal mask would
    hold the stop on the main thread only, and the kernel would hand it to
    any other thread still there (a daemon, or one just joined and not yet
    gone), which it kills the process from."""
    import signal
    import threading

    if any(
        thread is not threading.main_thread() and thread.is_alive() and not thread.daemon
        for thread in threading.enumerate()
    ):
        return False
    if threading.current_thread() is threading.main_thread():
        from .._signals import STOP_SIGNALS

        for stop in STOP_SIGNALS:
            signal.signal(stop, signal.SIG_IGN)
    return True


def exit_program(code: int) -> NoReturn:
    """End the program with ``code`` as the interpreter would, without its
    teardown: the ``atexit`` hooks run and stdout and stderr are flushed,
    then the process ends (``os._exit``) instead of freeing every module
    and object one by one. A run imports torch, whose teardown alone takes
    longer than the startup it recorded; the log, the report and every file
    of the run are closed before this is called.

    Where :func:`hold_stops` cannot hold the stops, the interpreter's own
    exit is kept; otherwise a stop that lands in an ``atexit`` hook would
    only print a traceback ("Exception ignored in atexit callback").
    """
    import atexit

    if not hold_stops():
        raise SystemExit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            # What the interpreter does when it cannot flush stdout at exit.
            code = 120 if stream is sys.stdout else code
    os._exit(code)
