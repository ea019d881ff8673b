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
  first part (``step.failed`` -> ``orchestrator.step``);
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

**Scope never hides a WARNING.** Scope keeps eight copies of one node-wide
condition off the terminal: a WARNING of scope ``local`` prints on local rank
0 of each node, one of scope ``global`` on global rank 0. But a condition
that only another rank saw must still be seen. With ``hold_warnings``, the
bridge keeps the WARNINGs scope did not print on this rank; once the ranks
know what the others derived (the end-of-startup exchange, or the launcher
reading the logs), :meth:`LoggingBridge.release` prints those that neither
the printing rank nor a lower rank of the node (of the world, for
``global``) derived: each condition once, none hidden.
:func:`launcher_messages` answers the same question from every rank's
messages at once (a launcher's view).

**A failure seen by many ranks is one line.** When one rank fails, its
peers fail in the next exchange with the same error. A launcher that reads
every log gives its ranks a ``hold`` rule for those messages: each rank
keeps them, and the launcher prints each text once for every rank that
derived it (:func:`launcher_messages`, :meth:`LoggingBridge.log` with
``ranks``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from events import (
    Event,
    Message,
    Messages,
    MessagesState,
    Scope,
    Severity,
    Slice,
    format_ranks,
)

from ._terminal import terminal_text

__all__ = ["MESSAGE_LOGGER_PREFIX", "LoggingBridge", "launcher_messages"]

#: Every message logger's name starts with this (``orchestrator.step``).
MESSAGE_LOGGER_PREFIX = "orchestrator"


class LoggingBridge:
    """Prints derived messages through stdlib logging as they are derived.

    Thread-safe: events appended from several threads are folded one at a
    time, and records are emitted in derivation order.

    One failure is one line per rank: a ``run.failed`` whose step already
    printed an ERROR on that rank is not printed again (reports keep it).

    Args:
        slices: what the owners of the steps declared (message rules, hooks
            and their codes' severities, a later slice overriding an earlier
            one); none gives the kernel's generic messages.
        logger_prefix: the parent logger's name.
        tracebacks: attach recorded tracebacks to messages below ERROR.
        hold_warnings: keep the WARNINGs scope does not print on this rank
            for :meth:`release`, instead of dropping them.
        hold: messages to keep for :meth:`release` instead of printing them
            (a launcher that reads every log prints them, once for all).
    """

    def __init__(
        self,
        *,
        slices: Sequence[Slice] = (),
        logger_prefix: str = MESSAGE_LOGGER_PREFIX,
        tracebacks: bool = True,
        hold_warnings: bool = False,
        hold: Callable[[Message], bool] | None = None,
    ) -> None:
        self._projection = Messages(slices=slices)
        self._state = self._projection.initial()
        self._prefix = logger_prefix
        self._tracebacks = tracebacks
        self._hold = hold_warnings
        self._hold_printed = hold
        self._held: list[Message] = []
        # Per rank, the steps whose ERROR this bridge printed.
        self._error_steps: dict[int, set[str]] = {}
        self._lock = threading.Lock()

    @property
    def state(self) -> MessagesState:
        """Everything derived so far (printed or not)."""
        return self._state

    def severity_of(self, rank: int, step: str, outcome_event: Event) -> Severity | None:
        """A span exporter's ``severity_of`` hook from the messages derived so
        far (:meth:`events.Messages.span_severity`): subscribe the bridge before the
        live span exporter, so a step's terminal event is folded here before
        its span ends there."""
        return self._projection.span_severity(self._state, rank, step, outcome_event)

    def __call__(self, event: Event) -> None:
        """Fold ``event`` and log the messages it completes."""
        with self._lock:
            known = len(self._state.messages(event.rank))
            self._state = self._projection.apply(self._state, event)
            for message in self._state.messages(event.rank)[known:]:
                if message.printed and self._hold_printed and self._hold_printed(message):
                    self._held.append(message)
                elif message.printed and not self._repeats_a_step_error(message):
                    identity = self._state.ranks[event.rank].identity
                    self.log(message, local_rank=identity.local_rank if identity else None)
                elif self._hold and message.severity is Severity.WARNING:
                    self._held.append(message)

    @property
    def held(self) -> tuple[Message, ...]:
        """The messages held back so far (``hold_warnings``, ``hold``)."""
        with self._lock:
            return tuple(self._held)

    def release(self, skip: Callable[[Message], bool] = lambda _message: False) -> list[Message]:
        """Print the held messages, but those ``skip`` says the printing rank
        already printed; forget them all. Returns those printed."""
        with self._lock:
            held, self._held = self._held, []
        printed = [message for message in held if not skip(message)]
        for message in printed:
            self.log(message)
        return printed

    def log(
        self,
        message: Message,
        *,
        local_rank: int | None = None,
        ranks: Sequence[int] = (),
    ) -> None:
        """Print ``message`` as the live stream does, whatever its scope, as
        said by ``ranks`` when given (``[ranks 0-4,6-7]``): the launcher
        prints what its ranks held back this way."""
        if message.severity >= Severity.ERROR and message.step:
            self._error_steps.setdefault(message.rank, set()).add(message.step)
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
        who = format_ranks(ranks or (message.rank,))
        logger.log(level, "[%s] %s", who, terminal_text(text), extra=extra)

    def _repeats_a_step_error(self, message: Message) -> bool:
        """Whether ``message`` is a ``run.failed`` whose failed step (or a
        step above or below it) already printed its ERROR on this rank."""
        if message.code != "run.failed" or not message.args or not message.args[0]:
            return False
        failed = message.args[0]
        return any(
            step == failed or failed.startswith(step + "/") or step.startswith(failed + "/")
            for step in self._error_steps.get(message.rank, ())
        )


def launcher_messages(
    state: MessagesState, *, held: Callable[[Message], bool] | None = None
) -> list[tuple[Message, tuple[int, ...]]]:
    """What a launcher that saw every rank's messages prints for its ranks,
    each once, in time order, with the ranks it stands for (every rank that
    derived the same code and text), so that no condition stays unseen and
    none is printed once per rank:

    - the WARNINGs scope kept every rank from printing live: those the rank
      printing for the scope (local rank 0 of the node, or global rank 0), or
      a lower rank of it, did not derive;
    - the messages ``held`` says its ranks held back instead of printing
      them (:class:`LoggingBridge`'s ``hold``), but a rank's ``run.failed``
      where the rank holds another of them: one failure, one line.
    """
    nodes = {
        rank: None if found.identity is None else found.identity.node_rank
        for rank, found in state.ranks.items()
    }
    derived = {
        rank: {(message.code, message.text) for message in found.messages}
        for rank, found in state.ranks.items()
    }
    holding = {
        message.rank
        for message in state.messages()
        if held is not None and message.printed and message.code != "run.failed" and held(message)
    }
    chosen: dict[tuple[str, str], Message] = {}
    for message in state.messages():
        key = (message.code, message.text)
        if key in chosen:
            continue
        if message.printed:
            if held is None or not held(message):
                continue
            if message.code == "run.failed" and message.rank in holding:
                continue
        elif message.severity is Severity.WARNING:
            # Kept off this rank by scope: said unless a lower rank of the world
            # (global) or of its node (local), as the printing one is, has it.
            if any(
                key in derived[rank]
                for rank, node in nodes.items()
                if rank < message.rank
                and (message.scope is Scope.GLOBAL or node == nodes[message.rank])
            ):
                continue
        else:
            continue
        chosen[key] = message
    return [
        (message, tuple(rank for rank, keys in derived.items() if key in keys))
        for key, message in chosen.items()
    ]
