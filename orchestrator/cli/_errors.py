"""Errors the command line raises and turns into one line and an exit status:
:class:`UsageError` (exit 2) and :class:`InputError` (exit 1), both a
:class:`CommandLineError` (the whole tree is drawn in ``orchestrator/_errors.py``).

Both are caught by :func:`orchestrator.cli.main`; callers of ``main`` see an
exit status, never these.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._errors import OrchestratorError

__all__ = ["CommandLineError", "InputError", "UsageError", "raised_as"]


class CommandLineError(OrchestratorError):
    """Base class of the command line's own errors; the message is the whole
    error line, without the program's name."""


class UsageError(CommandLineError):
    """Bad command-line input (a value, a path that does not exist): exit 2
    with one line, nothing written."""


class InputError(CommandLineError):
    """Unreadable or corrupt input (a damaged log, an invalid manifest): exit
    1 with one line."""


@contextlib.contextmanager
def raised_as(error: type[Exception], *caught: type[Exception]) -> Iterator[None]:
    """Any of ``caught`` raised inside becomes ``error`` with its message,
    without the traceback: where another layer's error becomes one line."""
    try:
        yield
    except caught as exc:
        raise error(str(exc)) from None
