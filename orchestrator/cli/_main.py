"""The entry point: parse, dispatch to a command, turn errors into one line
and an exit status."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from events import LogError

from .._errors import OrchestratorError
from ._errors import UsageError
from ._output import diagnose, exit_program
from ._parser import build_parser

__all__ = ["main", "program"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 success (the startup is ``ready``), 1 failure, 2
        bad usage. ``--help`` and ``--version`` print and return 0.

    Never raises for bad input: every error is one line on stderr. A probe
    thread left hung past its timeout is a daemon and never holds the
    process.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(arguments)
    except SystemExit as exc:
        # argparse has printed its help, version or error line already.
        return exc.code if isinstance(exc.code, int) else 2
    args.argv = arguments
    try:
        if args.command == "run":
            from ._run import command_run

            return command_run(args)
        if args.command == "watch":
            from ._watch import command_watch

            return command_watch(args)
        from ._views import run_command

        return run_command(args)
    except (OrchestratorError, LogError) as exc:  # UsageError and InputError among them
        diagnose(f"error: {exc}")
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        diagnose("interrupted")
        return 1


def program() -> NoReturn:
    """The ``startup-orchestrator`` program: :func:`main`, then the process
    ends with its status, its atexit hooks run and its output flushed,
    without the interpreter's teardown (``python -m orchestrator`` does the
    same)."""
    exit_program(main())
