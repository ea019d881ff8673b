"""Building event streams by hand, for tests.

A test of a projection, an exporter or a report needs a rank's events
shaped as the runner writes them. :class:`EventStream` writes them one call
per event, and keeps the envelope right so the test states only what it is
about::

    from events import RunOutcome, StepKind
    from events.testing import EventStream, exception_info

    stream = EventStream(run_id="run-1", rank=0, world_size=2).run_started()
    stream.started("kernels")
    stream.started("kernels/fast", kind=StepKind.CANDIDATE)
    stream.unavailable("kernels/fast", cause=exception_info("OSError", "no libfast.so"))
    stream.succeeded("kernels", result="slow")
    events = stream.run_finished(RunOutcome.READY)

What the stream keeps for you, as the runner does:

- ``seq`` goes up by one from 0, in the order of the calls;
- the clock: each event takes the stream's current ``wall_ns`` and
  ``mono_ns``, which then move on by ``tick_ns`` (:meth:`EventStream.advance`
  moves them further, for a step that took long);
- the trace: every event carries ``trace_id`` (by default derived from the
  run id as the runner derives it); run events sit on the rank's root span
  (:attr:`EventStream.root_span_id`), whose parent is the launcher's span;
  each step gets a fresh span whose parent is the span of its nearest open
  ancestor path (``kernels/fast`` under an open ``kernels``), else the root
  span; a step's terminal event repeats its span and parent; a decision sits
  on its step's span with no parent, as the runner records it. Span ids are
  deterministic: the same calls build the same stream.

The stream checks the step lifecycle (a step starts once while open and ends
once) and nothing else: to test how a reader copes with a malformed log,
edit :attr:`EventStream.events` with ``attrs.evolve`` or slicing.

Only the standard library, attrs and this package are imported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Self

from ._exception_info import ExceptionInfo, FrameInfo, ThreadStack
from ._launch import derive_trace_id
from ._model import (
    DecisionMade,
    Event,
    JsonValue,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    RunStarted,
    StallReason,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStalled,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
    Stop,
)

__all__ = ["BASE_WALL_NS", "EventStream", "exception_info"]

#: The wall clock a stream starts at by default: 2026-01-01T00:00:00Z, a
#: whole number of microseconds (as every default tick is), so exporters
#: with microsecond resolution round-trip it exactly.
BASE_WALL_NS = 1_767_225_600_000_000_000


def exception_info(
    type_name: str,
    message: str = "",
    *,
    cause: ExceptionInfo | None = None,
    context: ExceptionInfo | None = None,
    frames: Sequence[FrameInfo] = (),
    notes: Sequence[str] = (),
    exceptions: Sequence[ExceptionInfo] = (),
    errno: int | None = None,
    strerror: str | None = None,
    filename: str | None = None,
    module_name: str | None = None,
    module_path: str | None = None,
) -> ExceptionInfo:
    """An :class:`ExceptionInfo` as :meth:`ExceptionInfo.capture` would
    record an exception of ``type_name`` (qualified for non-builtins, as
    ``mykernels._C.AbiError``) with ``str(exc) == message``.

    ``reason`` is built as capture builds it (``"OSError: message"``).
    Chains nest: the ``cause`` (``raise
    ... from``) and ``context`` of a record are records themselves::

        exception_info(
            "RuntimeError", "no kernels",
            cause=exception_info("OSError", "libfoo.so: cannot open", errno=2),
        )
    """
    name = type_name.rpartition(".")[2]
    return ExceptionInfo(
        type=type_name,
        message=message,
        reason=f"{name}: {message}",
        errno=errno,
        strerror=strerror,
        filename=filename,
        module_name=module_name,
        module_path=module_path,
        frames=tuple(frames),
        cause=cause,
        context=context,
        notes=tuple(notes),
        exceptions=tuple(exceptions),
    )


class EventStream:
    """One rank's events, appended in order by one call each.

    Args:
        run_id: the run every event belongs to.
        rank: the rank writing the events.
        world_size: ranks in the run (recorded in ``run.started``).
        local_world_size: ranks per node; ``local_rank`` and ``node_rank``
            follow from it (default: every rank on one node).
        trace_id: 32 hex digits (default: derived from ``run_id`` as the
            runner derives it when no launcher gave one).
        launcher_span_id: the parent of the rank's root span (a launcher's
            ``TRACEPARENT``), or ``None`` for a root span of its own.
        wall_ns: wall clock of the first event (default :data:`BASE_WALL_NS`).
        mono_ns: monotonic clock of the first event.
        tick_ns: how far both clocks move after each event (default 1 ms).

    The arguments stay readable as attributes (``identity`` holds the rank
    layout); ``wall_ns`` and ``mono_ns`` are the clock the next event takes,
    and ``root_span_id`` is the span of the run events.

    Raises:
        ValueError: ``rank`` is outside ``world_size``, ``local_world_size``
            is not positive, or ``tick_ns`` is negative.
    """

    def __init__(
        self,
        *,
        run_id: str = "test-run",
        rank: int = 0,
        world_size: int = 1,
        local_world_size: int | None = None,
        trace_id: str | None = None,
        launcher_span_id: str | None = None,
        wall_ns: int = BASE_WALL_NS,
        mono_ns: int = 0,
        tick_ns: int = 1_000_000,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside a world of {world_size}")
        if local_world_size is not None and local_world_size < 1:
            raise ValueError(f"local_world_size must be positive, not {local_world_size}")
        if tick_ns < 0:
            raise ValueError(f"tick_ns must not be negative, not {tick_ns}")
        local = world_size if local_world_size is None else local_world_size
        self.run_id = run_id
        self.rank = rank
        self.identity = RankIdentity(
            rank=rank,
            local_rank=rank % local,
            world_size=world_size,
            local_world_size=local,
            node_rank=rank // local,
        )
        self.trace_id = trace_id or derive_trace_id(run_id)
        self.launcher_span_id = launcher_span_id
        self.wall_ns = wall_ns
        self.mono_ns = mono_ns
        self.tick_ns = tick_ns
        self._events: list[Event] = []
        self._spans = 0
        #: Open steps: path -> (span id, parent span id).
        self._open: dict[str, tuple[str, str | None]] = {}
        self._span_ids: dict[str, str] = {}
        self.root_span_id = self._new_span_id()

    @property
    def events(self) -> list[Event]:
        """The events so far, in order (a new list each time)."""
        return list(self._events)

    @property
    def open_steps(self) -> tuple[str, ...]:
        """Steps started and not ended yet, in the order they started."""
        return tuple(self._open)

    def span_id(self, step: str) -> str:
        """The span id of ``step`` (open or ended; the latest one if it ran
        more than once).

        Raises:
            KeyError: ``step`` never started.
        """
        return self._span_ids[step]

    def advance(self, ns: int) -> Self:
        """Move both clocks on by ``ns`` before the next event."""
        self.wall_ns += ns
        self.mono_ns += ns
        return self

    def run_started(
        self,
        *,
        host: str | None = None,
        pid: int | None = None,
        versions: Mapping[str, str] | None = None,
        config: Mapping[str, JsonValue] | None = None,
        graph: str = "",
        resource: Mapping[str, str] | None = None,
        simulated: str | None = None,
        injected: Sequence[str] = (),
    ) -> Self:
        """Append ``run.started`` with the stream's identity. ``host``
        defaults to ``node-<node rank>`` and ``pid`` to ``4000 + rank``."""
        return self._append(
            RunStarted,
            "",
            (self.root_span_id, self.launcher_span_id),
            identity=self.identity,
            host=f"node-{self.identity.node_rank}" if host is None else host,
            pid=4000 + self.rank if pid is None else pid,
            versions=dict(versions or {}),
            config=dict(config or {}),
            graph=graph,
            resource=None if resource is None else dict(resource),
            simulated=simulated,
            injected=tuple(injected),
        )

    def run_finished(
        self,
        outcome: RunOutcome = RunOutcome.READY,
        *,
        cause: ExceptionInfo | None = None,
        failed_step: str | None = None,
        stop: Stop | None = None,
    ) -> list[Event]:
        """Append ``run.finished`` and return the whole stream. Steps still
        open stay open: a rank that ends with steps in flight is a case some
        tests are about."""
        self._append(
            RunFinished,
            "",
            (self.root_span_id, self.launcher_span_id),
            outcome=outcome,
            cause=cause,
            failed_step=failed_step,
            stop=stop,
        )
        return self.events

    def started(
        self,
        step: str,
        *,
        kind: StepKind = StepKind.STEP,
        attributes: Mapping[str, JsonValue] | None = None,
        depends_on: Sequence[str] = (),
        parent: str | None = None,
    ) -> Self:
        """Append ``step.started`` for ``step`` on a fresh span.

        ``parent`` is the step whose span is the parent (``""`` for the root
        span); by default the nearest open ancestor of the path, else the
        root span.

        Raises:
            ValueError: ``step`` is already open, or ``parent`` is not open.
        """
        if step in self._open:
            raise ValueError(f"step {step!r} is already open")
        if parent is None:
            parent = step.rpartition("/")[0]
            while parent and parent not in self._open:
                parent = parent.rpartition("/")[0]
        if parent == "":
            parent_span = self.root_span_id
        elif parent in self._open:
            parent_span = self._open[parent][0]
        else:
            raise ValueError(f"parent step {parent!r} of {step!r} is not open")
        span_id = self._new_span_id()
        self._open[step] = (span_id, parent_span)
        self._span_ids[step] = span_id
        return self._append(
            StepStarted,
            step,
            self._open[step],
            kind=kind,
            depends_on=tuple(depends_on),
            attributes=dict(attributes or {}),
        )

    def end(self, event_type: type[Event], step: str, **payload: Any) -> Self:
        """Close ``step`` with a terminal event of ``event_type`` built from
        ``payload`` (for a test that goes through every terminal type).

        Raises:
            ValueError: ``step`` is not open.
        """
        try:
            span = self._open.pop(step)
        except KeyError:
            raise ValueError(f"step {step!r} is not open") from None
        return self._append(event_type, step, span, **payload)

    def succeeded(self, step: str, result: JsonValue = None) -> Self:
        """Close ``step`` with ``step.succeeded`` and its JSON ``result``."""
        return self.end(StepSucceeded, step, result=result)

    def unavailable(
        self,
        step: str,
        outcome: Outcome = Outcome.UNAVAILABLE,
        *,
        cause: ExceptionInfo | None = None,
        reasons: Sequence[str] | None = None,
    ) -> Self:
        """Close ``step`` with ``step.unavailable`` (``absent``,
        ``unavailable`` or ``invalid``); ``reasons`` default to the cause's
        reason, as the runner records them."""
        if reasons is None:
            reasons = () if cause is None else (cause.reason,)
        return self.end(StepUnavailable, step, outcome=outcome, reasons=tuple(reasons), cause=cause)

    def failed(self, step: str, cause: ExceptionInfo, *, origin: str | None = None) -> Self:
        """Close ``step`` with ``step.failed`` that started at ``origin``
        (this step, or the step below whose failure goes up through it);
        ``None`` leaves it to the readers to infer from the causes, as for a
        log written before schema 3."""
        return self.end(StepFailed, step, cause=cause, origin=origin)

    def timed_out(
        self, step: str, timeout_s: float = 5.0, *, elapsed_ns: int | None = None
    ) -> Self:
        """Close ``step`` with ``step.timed_out``; ``elapsed_ns`` defaults to
        the whole timeout."""
        elapsed = round(timeout_s * 1e9) if elapsed_ns is None else elapsed_ns
        return self.end(StepTimedOut, step, timeout_s=timeout_s, elapsed_ns=elapsed)

    def cancelled(self, step: str, reason: str = "") -> Self:
        """Close ``step`` with ``step.cancelled``."""
        return self.end(StepCancelled, step, reason=reason)

    def crashed(
        self,
        step: str,
        *,
        exit_code: int | None = None,
        signal: int | None = 9,
        stderr_tail: Sequence[str] = (),
    ) -> Self:
        """Close ``step`` with ``step.crashed`` (by default killed by signal 9)."""
        return self.end(
            StepCrashed, step, exit_code=exit_code, signal=signal, stderr_tail=tuple(stderr_tail)
        )

    def stalled(
        self,
        step: str,
        elapsed_s: float = 10.0,
        *,
        waiting_in: FrameInfo | None = None,
        why: StallReason = StallReason.STALLED,
    ) -> Self:
        """Append ``step.stalled`` on the span of the open ``step``: its
        worker thread waits in ``waiting_in`` (by default
        ``wait_for_fabric (fabric.py:42)``).

        Raises:
            ValueError: ``step`` is not open.
        """
        if step not in self._open:
            raise ValueError(f"a stall needs its step open; {step!r} is not")
        frame = waiting_in or FrameInfo(filename="fabric.py", lineno=42, name="wait_for_fabric")
        return self._append(
            StepStalled,
            step,
            self._open[step],
            elapsed_ns=round(elapsed_s * 1e9),
            why=why,
            threads=(ThreadStack(thread=f"step {step}", frames=(frame,)),),
        )

    def decision(
        self,
        name: str,
        value: JsonValue,
        *,
        step: str = "",
        inputs: Mapping[str, JsonValue] | None = None,
    ) -> Self:
        """Append ``decision.made``: on the span of the open ``step``, as the
        runner records a step's decision, or on the root span for ``""``.

        Raises:
            ValueError: ``step`` is not open.
        """
        if step == "":
            span = (self.root_span_id, self.launcher_span_id)
        elif step in self._open:
            span = (self._open[step][0], None)
        else:
            raise ValueError(f"a decision needs its step open; {step!r} is not")
        return self._append(
            DecisionMade,
            step,
            span,
            name=name,
            value=value,
            inputs=dict(inputs or {}),
        )

    def _new_span_id(self) -> str:
        # Rank and counter in the id, so ids never repeat across the ranks of
        # a merged stream and a failing test names a span one can find.
        self._spans += 1
        return f"{(self.rank + 1) % 0x10000:04x}{self._spans:012x}"

    def _append(
        self, event_type: type[Event], step: str, span: tuple[str, str | None], **payload: Any
    ) -> Self:
        """Append ``event_type`` on ``span`` (its id, its parent's)."""
        span_id, parent_span_id = span
        self._events.append(
            event_type(
                run_id=self.run_id,
                rank=self.rank,
                seq=len(self._events),
                wall_ns=self.wall_ns,
                mono_ns=self.mono_ns,
                step=step,
                trace_id=self.trace_id,
                span_id=span_id,
                parent_span_id=parent_span_id,
                **payload,
            )
        )
        return self.advance(self.tick_ns)
