"""Severity of derived messages and of span status, and the scope a message
is printed in."""

from __future__ import annotations

import enum
import logging
from typing import Any

from ._errors import InvalidValueError

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
    def parse(cls, value: Any, where: str | None = None) -> Severity:
        """``"warning"`` / ``"WARNING"`` (a name, as a policy file writes
        it), a member or its number to :attr:`WARNING`.

        Raises:
            InvalidValueError: not a severity (a ``ValueError``); the message
                lists the valid ones and names ``where`` the value came from.
        """
        try:
            return cls[value.strip().upper()] if isinstance(value, str) else cls(value)
        except (KeyError, ValueError):
            valid = [member.name.lower() for member in cls]
            raise InvalidValueError("severity", value, valid, where) from None


class Scope(enum.StrEnum):
    """Which ranks print a message live (as an engine's ``*_once`` logging helpers).

    ``process`` every rank; ``local`` only local rank 0 of each node;
    ``global`` only global rank 0. An ERROR ignores scope.
    """

    PROCESS = "process"
    LOCAL = "local"
    GLOBAL = "global"

    @classmethod
    def parse(cls, value: Any, where: str | None = None) -> Scope:
        """``"local"`` / ``" LOCAL "`` or a member to :attr:`LOCAL`.

        Raises:
            InvalidValueError: not a scope (a ``ValueError``); the message
                lists the valid ones and names ``where`` the value came from.
        """
        try:
            return cls(value.strip().lower() if isinstance(value, str) else value)
        except ValueError:
            valid = [member.value for member in cls]
            raise InvalidValueError("scope", value, valid, where) from None
