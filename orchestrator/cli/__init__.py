"""The ``startup-orchestrator`` command line (also ``python -m orchestrator``).

Exit codes: 0 the startup reached ``ready`` (or the command succeeded), 1 the
startup failed, was interrupted or is incomplete, or a log is corrupt, 2 bad
usage. Every error is one line naming the bad value and what would be valid
— never a traceback.

This package sits on top of everything else: it uses the embedding API
(:class:`orchestrator.Startup`), the reference engine, :mod:`events` and
:mod:`exporters`, and nothing imports it. Heavy modules (OpenTelemetry
exporters, torch, protobuf) are imported only by the commands that use them,
so ``--help`` and a simulated run start fast.
"""

from __future__ import annotations

from ._errors import CommandLineError as CommandLineError
from ._errors import InputError as InputError
from ._errors import UsageError as UsageError
from ._main import main as main

__all__ = ["CommandLineError", "InputError", "UsageError", "main"]
