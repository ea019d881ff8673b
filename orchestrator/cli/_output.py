"""What the command line prints: reports to stdout, diagnostics to stderr,
under the program's name."""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

__all__ = [
    "PROG",
    "diagnose",
    "discard_stdout",
    "emit",
    "exit_program",
    "hold_stops",
    "to_json_text",
]

#: The program's name, at the head of every diagnostic line.
PROG = "startup-orchestrator"


def emit(text: str) -> None:
    """Print to stdout (reports go to stdout, diagnostics to stderr). Once
    its reader has gone (``| head``), the rest goes nowhere and the command
    goes on: its exit status still says the outcome."""
    try:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        discard_stdout()


def discard_stdout() -> None:
    """Send what is still to be printed on stdout nowhere: its reader has
    gone (not an error of ours)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def diagnose(text: str, *, flush: bool = False) -> None:
    """Print ``text`` on stderr under the program's name, as terminal text:
    its control characters escaped and any further lines indented, since a
    path or a value in it may come from a crafted log or directory name and
    must not clear the screen, move the cursor or forge a line."""
    from exporters import terminal_text

    print(terminal_text(f"{PROG}: {text}"), file=sys.stderr, flush=flush)


def to_json_text(document: Any) -> str:
    """Stable, readable JSON."""
    import json

    return json.dumps(document, indent=2, sort_keys=False, ensure_ascii=False)


def hold_stops() -> bool:
    """Ignore SIGINT and SIGTERM from here on, once the program's work is
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
        for stop in (signal.SIGINT, signal.SIGTERM):
            signal.signal(stop, signal.SIG_IGN)
    return True


def exit_program(code: int) -> NoReturn:
    """End the program with ``code`` as the interpreter would, without its
    teardown: the ``atexit`` hooks run and stdout and stderr are flushed,
    then the process ends (``os._exit``) instead of freeing every module
    and object one by one. A run imports torch, whose teardown alone takes
    longer than the startup it recorded; the log, the report and every file
    of the run are closed before this is called.

    With a thread still running that is not a daemon, the interpreter's own
    exit (which waits for it) is kept. Otherwise SIGINT and SIGTERM are
    ignored from here on (:func:`hold_stops`): the program has done its
    work, and a stop that lands in an ``atexit`` hook would only print a
    traceback ("Exception ignored in atexit callback") on the way out.
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
