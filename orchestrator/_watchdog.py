"""Where a stuck step waits, recorded while it waits.

A rank's watchdog is a daemon thread of its own, so it sees the steps in
flight even when the event loop itself is blocked. A step that has run
longer than the stall threshold gets a ``step.stalled`` event with the
stacks of the threads doing its work, and again at twice, four times...
the threshold while it stays in flight:

* a blocking step's (or an async step's ``to_thread`` call's) worker
  thread, from :class:`~orchestrator._threads.StepThreads`;
* for an isolated step, its child process's threads, which the child
  sends when the run's loop asks it (:func:`~orchestrator._isolation.run_isolated`);
  a child or a loop that does not answer in time leaves the record without
  stacks, saying how long the step has run;
* for an async step with no worker thread, the event loop's thread when
  the loop does not answer (something called a blocking function on it):
  recorded for the steps whose code is on that stack.

A healthy step costs nothing: the watchdog wakes once per threshold, or
earlier for a step that is due, and looks at a dictionary.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from events import Redactor, StallReason, ThreadStack

if TYPE_CHECKING:
    from anyio.lowlevel import EventLoopToken

    from ._threads import StepThreads

__all__ = ["DEFAULT_STALL_S", "AskChild", "InFlight", "Watchdog"]

T = TypeVar("T")

#: Seconds a step may run before its rank records where it waits.
DEFAULT_STALL_S = 10.0

#: How long the loop has to answer before it counts as blocked.
_LOOP_ANSWER_NS = 500_000_000
#: How long the loop and an isolated step's child have to send the child's
#: stacks (the child has :data:`~orchestrator._isolation.STACKS_WAIT_S`).
_CHILD_ANSWER_NS = 2_000_000_000

#: Asks an isolated step's child for its threads' stacks (a coroutine
#: function, run on the run's loop; ``()`` when the child does not answer).
AskChild = Callable[[], Coroutine[Any, Any, tuple[ThreadStack, ...]]]


@attrs.define
class InFlight:
    """A step that started and has not ended."""

    step: str
    span_id: str
    parent: str
    started_ns: int
    code: CodeType | None
    #: When it is next due to be looked at (``time.monotonic_ns()``).
    due_ns: int
    #: Asks its child process for its stacks, while an isolated step's runs.
    child: AskChild | None = None


@attrs.frozen
class _Question:
    """A question put to the run's loop (through it, to a step's child),
    settled on the watchdog's thread when answered or at its deadline; the
    watchdog never waits for an answer."""

    answer: Future[Any]
    deadline_ns: int
    #: The steps it is about, not looked at again while it is open.
    flights: tuple[InFlight, ...]
    answered: Callable[[Any], None]
    unanswered: Callable[[], None]


#: Records one stall: (step in flight, why, elapsed ns, the stacks).
Record = Callable[[InFlight, StallReason, int, tuple[ThreadStack, ...]], None]


class Watchdog:
    """Watches one run's steps in flight (see the module docstring).

    Args:
        threads: the run's worker threads.
        threshold_s: the stall threshold, or ``None`` for no watching.
        record: appends a stall to the run's log.
        redactor: for the captured stacks.
    """

    def __init__(
        self, threads: StepThreads, threshold_s: float | None, record: Record, redactor: Redactor
    ) -> None:
        self._threads = threads
        self._threshold_ns = None if threshold_s is None else int(threshold_s * 1e9)
        self._record = record
        self._redactor = redactor
        self._lock = threading.Lock()
        self._in_flight: dict[str, InFlight] = {}
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop_ident: int | None = None
        self._loop_token: EventLoopToken | None = None
        #: The open questions (the watchdog's thread's own).
        self._asked: list[_Question] = []

    # --- the run's side (its event loop's thread) ------------------------------------------

    def start(self) -> None:
        """Start watching, from the run's event loop."""
        import anyio.lowlevel

        self._loop_ident = threading.get_ident()
        self._loop_token = anyio.lowlevel.current_token()
        if self._threshold_ns is None:
            return
        self._thread = threading.Thread(target=self._watch, name="startup watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; nothing is recorded after this returns."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def started(self, step: str, span_id: str, parent: str, code: CodeType | None) -> None:
        now = time.monotonic_ns()
        due = now + self._threshold_ns if self._threshold_ns is not None else 0
        with self._lock:
            self._in_flight[step] = InFlight(step, span_id, parent, now, code, due)

    def in_child(self, step: str, ask: AskChild | None) -> None:
        """Isolated ``step`` runs in a child process that ``ask`` asks for its
        threads' stacks when the step stalls (``None``: the child is gone)."""
        with self._lock:
            flight = self._in_flight.get(step)
            if flight is not None:
                flight.child = ask

    def ended(self, step: str) -> InFlight | None:
        with self._lock:
            return self._in_flight.pop(step, None)

    # --- the watchdog's thread ----------------------------------------------------------------

    def _watch(self) -> None:
        assert self._threshold_ns is not None
        while not self._stopped.is_set():
            self._wake.clear()
            now = time.monotonic_ns()
            self._settle_answers(now)
            with self._lock:
                due = [f for f in self._in_flight.values() if f.due_ns <= now]
                soonest = min(
                    [f.due_ns for f in self._in_flight.values()]
                    + [asked.deadline_ns for asked in self._asked],
                    default=now + self._threshold_ns,
                )
            if due:
                self._look_at(due, now)
                continue
            self._wake.wait(max(soonest - now, 1_000_000) / 1e9)

    def _look_at(self, due: Sequence[InFlight], now: int) -> None:
        on_loop: list[tuple[InFlight, int]] = []
        for flight in due:
            with self._lock:
                if self._in_flight.get(flight.step) is not flight:
                    continue  # ended meanwhile
                elapsed = now - flight.started_ns
                flight.due_ns = flight.started_ns + 2 * elapsed
                child = flight.child
            if any(flight is other for asked in self._asked for other in asked.flights):
                continue
            stacks = self._threads.stacks(flight.step, self._redactor)
            if child is not None:
                # Its work is in its child process, asked for its stacks: a
                # child that does not answer (holding its GIL) leaves the
                # stall without them, and holds back no other step's.
                record = functools.partial(self._settle, flight, elapsed, stacks)
                self._ask(child, _CHILD_ANSWER_NS, (flight,), record, record)
            elif stacks:
                self._settle(flight, elapsed, stacks)
            else:
                on_loop.append((flight, elapsed))
        if on_loop:
            # No thread works for these steps: they wait on their children
            # (the loop answers), or something blocks the loop, its stack
            # saying which of them.
            blocked = functools.partial(self._blocked_loop, on_loop)
            flights = tuple(flight for flight, _ in on_loop)
            self._ask(_nothing, _LOOP_ANSWER_NS, flights, lambda _: None, blocked)

    def _settle_answers(self, now: int) -> None:
        open_questions = []
        for asked in self._asked:
            if asked.answer.done():
                asked.answered(asked.answer.result())
            elif now >= asked.deadline_ns:
                asked.unanswered()
            else:
                open_questions.append(asked)
        self._asked = open_questions

    def _settle(
        self,
        flight: InFlight,
        elapsed: int,
        stacks: tuple[ThreadStack, ...],
        more: tuple[ThreadStack, ...] | None = None,
    ) -> None:
        with self._lock:
            # An answer takes a while: the step may have ended meanwhile.
            if self._stopped.is_set() or self._in_flight.get(flight.step) is not flight:
                return
        self._record(flight, StallReason.STALLED, elapsed, stacks + (more or ()))

    def _blocked_loop(self, on_loop: Sequence[tuple[InFlight, int]]) -> None:
        """The loop has not answered in time (a blocking call on it): the
        steps whose code is on its stack stall there."""
        assert self._loop_ident is not None
        frame: FrameType | None = sys._current_frames().get(self._loop_ident)
        stack = ThreadStack.capture("event loop", frame, redactor=self._redactor)
        for flight, elapsed in on_loop:
            if _runs(stack, flight.code):
                self._settle(flight, elapsed, (stack,))

    def _ask(
        self,
        ask: Callable[[], Coroutine[Any, Any, T]],
        within_ns: int,
        flights: tuple[InFlight, ...],
        answered: Callable[[T | None], None],
        unanswered: Callable[[], None],
    ) -> None:
        """Puts ``ask`` to the run's loop: ``answered`` is given what it
        returns (``None`` once the loop has ended), or ``unanswered`` is
        called when ``within_ns`` have passed first."""
        import anyio.from_thread

        answer: Future[T | None] = Future()

        def call() -> None:
            # Blocks while the loop does: a daemon of its own.
            try:
                answer.set_result(anyio.from_thread.run(ask, token=self._loop_token))
            except Exception:  # the loop has ended
                answer.set_result(None)
            self._wake.set()

        threading.Thread(target=call, name="startup watchdog: loop call", daemon=True).start()
        deadline_ns = time.monotonic_ns() + within_ns
        self._asked.append(_Question(answer, deadline_ns, flights, answered, unanswered))


async def _nothing() -> None:
    # Never yields: a trio loop shutting down would cancel a checkpoint,
    # raising Cancelled in the thread that asked.
    pass


def _runs(stack: ThreadStack, code: CodeType | None) -> bool:
    return code is not None and any(
        frame.name == code.co_name
        and frame.lineno is not None
        and frame.filename == code.co_filename
        for frame in stack.frames
    )
