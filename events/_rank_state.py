"""What one rank's startup derived (:class:`RankState`) and why a rank did
not end ready (:class:`RootCause`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ._exception_info import ExceptionInfo
from ._failures import _Failure
from ._launch import RankProcess
from ._model import JsonValue, RankIdentity, RunFinished, RunOutcome, StepStalled

__all__ = ["RankState", "RootCause"]


#: Why a rank has no events, without a launcher's record, when it is of a
#: node none of whose logs were read: each node keeps its own copy.
ELSEWHERE = "another node's"


@attrs.frozen(kw_only=True)
class RootCause:
    """Why a rank did not end ready.

    Attributes:
        rank: the rank.
        step: the deepest step the failure started in (for a rank that died
            or was interrupted, the one step it was in); ``None`` if no one
            step is known (several were in flight, or none).
        exception: the recorded exception, or ``None`` (a rank that died, or
            an interruption without one).
        outcome: the rank's outcome (``failed``, ``interrupted``,
            ``incomplete``).
        wall_ns: when it happened (for a rank that died: its last event; for
            a rank that wrote no events: when its launcher saw it end, else 0).
        seq: the event that recorded it (``-1``: none).
        in_flight: for a rank that died or was interrupted, every step that
            was running at that moment (innermost steps only).
        no_events: why the rank has no events, when it has none
            (``"no log"``, ``"empty log"`` or :data:`ELSEWHERE`).
        process: what its launcher saw of its process, when known.
        left_out: what the rank went on without (a :class:`~events.Collective`'s
            ``what``, ``the process group``) when that is why it is the root
            cause: its own outcome may then be ``ready``, its peers' failures
            being its doing; ``step`` and ``exception`` say where and why.
        waiting: where ``step`` was last seen waiting (its latest
            ``step.stalled``: at its timeout, its abandonment, or the last
            look of the watchdog), when it was seen so.
    """

    rank: int
    step: str | None
    exception: ExceptionInfo | None
    outcome: RunOutcome
    wall_ns: int
    seq: int
    in_flight: tuple[str, ...] = ()
    no_events: str | None = None
    process: RankProcess | None = None
    left_out: str | None = None
    waiting: StepStalled | None = None

    def describe(self, *, since_ns: int | None = None) -> str:
        """One line: ``rank 5, step cache_dir: RuntimeError: ...``; for a rank
        that wrote no events, what its launcher saw (times relative to
        ``since_ns``)."""
        if self.no_events is not None:
            if self.process is not None:
                log = "empty" if self.no_events == "empty log" else "missing"
                return f"{self.process.describe(since_ns=since_ns)}; its log is {log}"
            if self.no_events == ELSEWHERE:
                return (
                    f"rank {self.rank}'s log is not here: it is another node's "
                    "(each node keeps its own copy; read them together)"
                )
            return (
                f"rank {self.rank} wrote no events ({self.no_events}): never started, "
                "or killed before its first event"
            )
        where = f"rank {self.rank}" + (f", step {self.step}" if self.step else "")
        if self.left_out is not None:
            why = "" if self.exception is None else f": {self.exception.reason}"
            return f"{where}{why}; {self.left_out_text()}"
        if self.exception is not None:
            parts = [f"{where}: {self.exception.reason}"]
        else:
            parts = [
                f"{where}: the process died before the rank finished (no run.finished)"
                if self.outcome is RunOutcome.INCOMPLETE
                else f"{where}: {self.outcome.value}, no exception recorded"
            ]
            if len(self.in_flight) > 1:
                parts.append(f"steps in flight: {', '.join(self.in_flight)}")
            if self.process is not None and self.process.ended:
                parts.append(self.process.describe(since_ns=since_ns))
        parts.append(self.waiting_text())
        return "; ".join(part for part in parts if part)

    def waiting_text(self) -> str:
        """Where the step waited (:meth:`StepStalled.summary`), or ``""``
        when it was never seen waiting."""
        return "" if self.waiting is None else self.waiting.summary()

    def left_out_text(self) -> str:
        """What going on without a collective did (``""`` when it did not)."""
        if self.left_out is None:
            return ""
        return (
            f"rank {self.rank} went on without {self.left_out}, and the ranks that "
            "waited for it there failed"
        )


def _innermost(steps: Iterable[str]) -> tuple[str, ...]:
    """The steps of ``steps`` that no other step of it encloses, in order
    (``kernels`` and ``kernels/triton`` give ``kernels/triton``)."""
    ordered = list(dict.fromkeys(steps))
    return tuple(
        step for step in ordered if not any(other.startswith(step + "/") for other in ordered)
    )


@attrs.frozen(kw_only=True)
class _StateTracking:
    """Bookkeeping between events. Internal."""

    root_span_id: str | None = None
    failures: tuple[_Failure, ...] = ()
    #: the rank's ``run.finished``, once folded
    finished: RunFinished | None = None
    #: steps cancelled so far (an interrupted run cancels those in flight)
    cancelled: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class RankState:
    """What one rank's startup derived.

    Attributes:
        rank: the global rank.
        run_id: the launch.
        identity: from ``run.started``.
        outcome: ``ready | failed | interrupted``, or ``incomplete`` while
            (or because) the log has no ``run.finished``.
        facts: what the slices derived (fact name -> JSON value), starting
            from their declared initial values.
        failure: the earliest failure that reached the graph.
        open_steps: steps started and not ended, in start order.
        last_event_step: the step of the latest step event.
        last_wall_ns, last_seq: the latest event.
        stalls: each step's latest ``step.stalled``: where it was last seen
            waiting (a step that ran past the stall threshold, timed out or
            was abandoned).
        tracking: derivation bookkeeping; not part of the stable surface.
    """

    rank: int
    run_id: str | None = None
    identity: RankIdentity | None = None
    outcome: RunOutcome = RunOutcome.INCOMPLETE
    facts: Mapping[str, JsonValue] = attrs.field(factory=dict)
    failure: RootCause | None = None
    open_steps: tuple[str, ...] = ()
    last_event_step: str | None = None
    last_wall_ns: int = 0
    last_seq: int = -1
    stalls: Mapping[str, StepStalled] = attrs.field(factory=dict)
    tracking: _StateTracking = attrs.field(factory=_StateTracking)

    @property
    def finished(self) -> bool:
        """Whether the log has its ``run.finished``."""
        return self.outcome is not RunOutcome.INCOMPLETE

    @property
    def last_step(self) -> str | None:
        """The innermost step still running (the step a dead rank was in),
        else the step of the latest step event."""
        return self.open_steps[-1] if self.open_steps else self.last_event_step

    @property
    def in_flight(self) -> tuple[str, ...]:
        """The innermost steps that were running when the rank stopped: for
        a rank without ``run.finished``, those started and never ended; for
        an interrupted rank, those the interruption cancelled; else none."""
        if not self.finished:
            return _innermost(self.open_steps)
        if self.outcome is RunOutcome.INTERRUPTED:
            return _innermost(self.tracking.cancelled)
        return ()

    @property
    def root_cause(self) -> RootCause | None:
        """Why this rank did not end ready (``None`` for a ready rank): its
        earliest failure that reached the graph (the deepest step of that
        propagation; a failure a parent absorbed does not count), else the
        cause ``run.finished`` names, else, for a rank that died, the step it
        was in (the innermost step that started and never ended) with no
        exception."""
        if self.outcome is RunOutcome.READY:
            return None
        if self.failure is not None:
            return self.failure
        # Died mid-propagation: the failure was on its way up (a finished
        # rank has none pending).
        if going_up := [f for f in self.tracking.failures if f.cause is not None]:
            return _root_cause(going_up[0], None, self.rank, self.outcome, self.stalls)
        in_flight = self.in_flight
        # An unfinished rank has no run.finished: its last event speaks.
        finished = self.tracking.finished
        step = None if finished is None else finished.failed_step
        if not step:
            # The one step a stopped rank was in: none when several were.
            step = (in_flight[0] if in_flight else self.last_step) if len(in_flight) < 2 else None
        if step is not None:
            waiting = self.stalls.get(step)
        else:
            # With several in flight, the one that had waited longest when last seen.
            seen = [self.stalls[s] for s in in_flight if s in self.stalls]
            waiting = max(seen, key=lambda stall: stall.elapsed_ns, default=None)
        return RootCause(
            rank=self.rank,
            step=step,
            exception=None if finished is None else finished.cause,
            outcome=self.outcome,
            wall_ns=(0 if finished is None else finished.wall_ns) or self.last_wall_ns,
            seq=self.last_seq if finished is None else finished.seq,
            in_flight=in_flight,
            waiting=waiting,
        )


def _root_cause(
    failure: _Failure,
    fallback: ExceptionInfo | None,
    rank: int,
    outcome: RunOutcome,
    stalls: Mapping[str, StepStalled],
) -> RootCause:
    return RootCause(
        rank=rank,
        step=failure.step,
        exception=failure.cause or fallback,
        outcome=outcome,
        wall_ns=failure.wall_ns,
        seq=failure.seqs[0],
        waiting=stalls.get(failure.step),
    )
