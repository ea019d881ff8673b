"""Severity of derived messages and of span status, and the scope a message
is printed in."""

from __future__ import annotations

import enum
import logging

__all__ = ["Scope", "Severity"]


class Severity(enum.IntEnum):
    """How much a human should care, ordered (``DEBUG < ... < ERROR``).

    The values are the stdlib :mod:`logging` levels, so a severity can be
    passed to a logger as is.

    DEBUG    an expected absence;
    INFO     a success worth one line;
    WARNING  recovered environment breakage, or an attempt that failed while
             a fallback remained;
    ERROR    a terminal failure.
    """

    DEBUG = logging.DEBUG
    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR

    @classmethod
    def parse(cls, text: str) -> Severity:
        """``"warning"`` / ``"WARNING"`` to :attr:`WARNING`.

        Raises:
            ValueError: not a severity name; the message lists the valid ones.
        """
        try:
            return cls[text.strip().upper()]
        except KeyError:
            valid = ", ".join(member.name.lower() for member in cls)
            raise ValueError(f"unknown severity {text!r}; valid: {valid}") from None


class Scope(enum.StrEnum):
    """Which ranks print a message live (as an engine's ``*_once`` logging helpers).

    ``process`` every rank; ``local`` only local rank 0 of each node;
    ``global`` only global rank 0. An ERROR ignores scope.
    """

    PROCESS = "process"
    LOCAL = "local"
    GLOBAL = "global"
