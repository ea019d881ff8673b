"""The logging bridge: derived messages to stdlib :mod:`logging`, live.

:class:`LoggingBridge` is a log subscriber. It folds the messages projection
(:class:`events.Messages`) over the events as they are appended and hands each
message the fold newly derives to a stdlib logger::

    from events import JsonlLog
    from exporters import LoggingBridge

    bridge = LoggingBridge()
    log.subscribe(bridge)

Each record:

- goes to the logger ``orchestrator.<area>`` where ``<area>`` is the code's
  first part (``attention.selected`` -> ``orchestrator.attention``);
- has the message's severity as its level;
- is emitted only where :attr:`events.Message.printed` is true: scope is
  honoured with the rank identity from ``run.started``, and an ERROR is
  printed on the rank where it happened;
- carries the rank twice: in the text (``[rank 3] ...``) and as record
  attributes (``rank``, ``local_rank``, ``code``, ``step``);
- for a DEBUG, INFO or WARNING message with a recorded exception, carries its
  traceback in the record's text, after the message on the following lines
  (an ERROR's exception propagates out of the run and prints its own
  traceback, so it is not repeated). The traceback is also on the record as
  ``detail``;
- is safe to print: the text (message and traceback) comes from probes and
  libraries, so it is passed through :func:`terminal_text` (control
  characters escaped, every line after the first indented), and no message
  can move the cursor, recolour the terminal or print a line that looks like
  another record. The ``detail`` attribute keeps the exact traceback.
"""

from __future__ import annotations

import logging
import threading

from events import (
    DEFAULT_POLICY,
    Event,
    Message,
    Messages,
    MessagesState,
    Severity,
    SeverityPolicy,
    span_severity,
)

from ._terminal import terminal_text

__all__ = ["MESSAGE_LOGGER_PREFIX", "LoggingBridge"]

#: Every message logger's name starts with this (``orchestrator.zentorch``).
MESSAGE_LOGGER_PREFIX = "orchestrator"


class LoggingBridge:
    """Prints derived messages through stdlib logging as they are derived.

    Thread-safe: events appended from several threads are folded one at a
    time, and records are emitted in derivation order.

    Args:
        policy: severities and scopes (default :data:`events.DEFAULT_POLICY`).
        logger_prefix: the parent logger's name.
        tracebacks: attach recorded tracebacks to messages below ERROR.
    """

    def __init__(
        self,
        *,
        policy: SeverityPolicy = DEFAULT_POLICY,
        logger_prefix: str = MESSAGE_LOGGER_PREFIX,
        tracebacks: bool = True,
    ) -> None:
        self._policy = policy
        self._projection = Messages(policy)
        self._state = self._projection.initial()
        self._prefix = logger_prefix
        self._tracebacks = tracebacks
        self._lock = threading.Lock()

    @property
    def state(self) -> MessagesState:
        """Everything derived so far (printed or not)."""
        return self._state

    def severity_of(self, rank: int, step: str, outcome_event: Event) -> Severity | None:
        """A span exporter's ``severity_of`` hook from the messages derived so
        far (:func:`events.span_severity`): subscribe the bridge before the
        live span exporter, so a step's terminal event is folded here before
        its span ends there."""
        return span_severity(self._state, rank, step, outcome_event, policy=self._policy)

    def __call__(self, event: Event) -> None:
        """Fold ``event`` and log the messages it completes."""
        with self._lock:
            before = self._state.ranks.get(event.rank)
            known = 0 if before is None else len(before.messages)
            self._state = self._projection.apply(self._state, event)
            after = self._state.ranks.get(event.rank)
            if after is None or len(after.messages) == known:
                return
            for message in after.messages[known:]:
                if message.printed:
                    self._emit(message, after.identity.local_rank if after.identity else None)

    def _emit(self, message: Message, local_rank: int | None) -> None:
        logger = logging.getLogger(f"{self._prefix}.{message.code.partition('.')[0]}")
        level = int(message.severity)
        if not logger.isEnabledFor(level):
            return
        detail = message.detail if self._tracebacks and message.severity < Severity.ERROR else None
        extra = {
            "rank": message.rank,
            "local_rank": local_rank,
            "code": message.code,
            "step": message.step,
            "detail": detail,
        }
        text = message.text
        if detail:
            text += "\n" + detail.rstrip("\n")
        logger.log(level, "[rank %d] %s", message.rank, terminal_text(text), extra=extra)
