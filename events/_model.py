"""The event model: one envelope, a closed set of payload types.

Every event is a frozen, slotted, keyword-only attrs instance deriving from
:class:`Event`. The envelope fields (defined on :class:`Event`) place the
event in its stream and in the trace; the subclass fields are the payload.

Event types (``TYPE`` tag in parentheses)::

    Event
    ├── RunStarted      (run.started)       first event of every rank's log
    ├── StepStarted     (step.started)      a step, candidate or attempt began
    ├── StepSucceeded   (step.succeeded)    outcome ok, with a JSON result
    ├── StepUnavailable (step.unavailable)  absent / unavailable / invalid
    ├── StepFailed      (step.failed)       an error that propagated
    ├── StepTimedOut    (step.timed_out)
    ├── StepCancelled   (step.cancelled)
    ├── StepCrashed     (step.crashed)      an isolated step's process died
    ├── DecisionMade    (decision.made)     the live run acted on a derived value
    └── RunFinished     (run.finished)      last event: ready / failed / interrupted

A step's lifecycle is ``step.started`` followed by exactly one terminal step
event carrying the same ``step`` and ``span_id``; terminal states are final.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import attrs

from ._exception_info import ExceptionInfo, FrameInfo, ThreadStack

__all__ = [
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "TERMINAL_STEP_EVENTS",
    "DecisionMade",
    "Event",
    "JsonValue",
    "Outcome",
    "RankIdentity",
    "RunFinished",
    "RunOutcome",
    "RunStarted",
    "StallReason",
    "StepCancelled",
    "StepCrashed",
    "StepFailed",
    "StepKind",
    "StepStalled",
    "StepStarted",
    "StepSucceeded",
    "StepTimedOut",
    "StepUnavailable",
    "Stop",
    "child_steps",
    "outcome_of",
]

#: The version written on every record by this release of the codec.
#: 0: pre-release; 1: integer nanoseconds; 2: exception types by public path;
#: 3: where a failure started (``step.failed``), how a stopped run was stopped
#: (``run.finished``).
SCHEMA_VERSION = 3

if TYPE_CHECKING:
    JsonValue: TypeAlias = (
        bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"] | None
    )
else:
    # At run time a JSON value is whatever orjson produced; the codec passes
    # ``Any`` through untouched, which is exactly right for it.
    JsonValue = Any


class Outcome(enum.StrEnum):
    """How a step, candidate or attempt ended.

    ``ok``          it worked;
    ``absent``      an optional thing is not installed (expected);
    ``unavailable`` an environment failure, recorded and not raised;
    ``invalid``     it loaded but rejects this configuration;
    ``failed``      an error that propagated out of the run;
    ``timed_out``, ``cancelled``, ``crashed`` as named.
    """

    OK = "ok"
    ABSENT = "absent"
    UNAVAILABLE = "unavailable"
    INVALID = "invalid"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    CRASHED = "crashed"


class RunOutcome(enum.StrEnum):
    """How a rank's run ended.

    ``ready``, ``failed`` and ``interrupted`` are written in ``run.finished``.
    ``incomplete`` and ``running`` are never written: readers derive
    ``incomplete`` for a rank whose log has no ``run.finished`` (the process
    died, was killed, or never started), and ``running`` for a rank that had
    not finished at a cutoff (``replay --until``), which says nothing about
    how it ended.
    """

    READY = "ready"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    INCOMPLETE = "incomplete"
    RUNNING = "running"


class StepKind(enum.StrEnum):
    """What a step span stands for: a graph step, one candidate of a
    candidate set, or one attempt of a fallback chain."""

    STEP = "step"
    CANDIDATE = "candidate"
    ATTEMPT = "attempt"


@attrs.frozen(kw_only=True)
class RankIdentity:
    """Where a process sits in the launch (torchrun conventions).

    ``role`` names what the process is where a launch's processes are not
    all alike (an engine's own start, recorded in each of its processes:
    ``main``, ``engine core``, ``worker TP1``), and ``parent_pid`` the
    process that started it; both are ``None`` for a launcher's ranks.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    role: str | None = None
    parent_pid: int | None = None


@attrs.frozen(kw_only=True)
class Event:
    """The envelope every event carries.

    Attributes:
        schema_version: record schema version (:data:`SCHEMA_VERSION`).
        run_id: the launch; shared by every rank.
        rank: global rank that wrote the event.
        seq: position in the rank's log; gapless from 0. ``-1`` until a log
            assigns it on append.
        wall_ns: ``time.time_ns()`` when the event happened.
        mono_ns: ``time.monotonic_ns()`` when the event happened.
        step: step path (``kernels/triton``); ``""`` for run events.
        trace_id: 32 lower-case hex digits.
        span_id: 16 lower-case hex digits; the span of the step (or the rank's
            root span for run events).
        parent_span_id: the parent span, or ``None`` for a root span.
    """

    TYPE: ClassVar[str] = ""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    rank: int
    seq: int = -1
    wall_ns: int
    mono_ns: int
    step: str = ""
    trace_id: str = "0" * 32
    span_id: str = "0" * 16
    parent_span_id: str | None = None


@attrs.frozen(kw_only=True)
class RunStarted(Event):
    """A rank began its startup. Always ``seq == 0``."""

    TYPE: ClassVar[str] = "run.started"

    identity: RankIdentity
    host: str
    pid: int
    versions: Mapping[str, str] = attrs.field(factory=dict)
    config: Mapping[str, JsonValue] = attrs.field(factory=dict)
    graph: str = ""
    #: OpenTelemetry resource attributes the rank ran with (from
    #: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``), so a replay
    #: elsewhere rebuilds the same resource; ``None`` in logs that predate it.
    resource: Mapping[str, str] | None = None
    #: The simulated host the probes answered from (a profile name, or a
    #: profile file with its content hash); ``None`` on a real host. Reports
    #: say so first, so a simulated start is never mistaken for a real one.
    simulated: str | None = None
    #: The faults injected on this rank's run, one canonical spec each
    #: (``1:tokenizers=RuntimeError:boom``); reports show them in their header.
    injected: tuple[str, ...] = ()
    #: The slices that give the graph's steps meaning, by import path
    #: (``my_engine.slices:SLICE``; a slice no module holds by its name
    #: alone), so a replay elsewhere can say which ``--slice`` to pass;
    #: ``None`` in logs that predate it.
    slices: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class StepStarted(Event):
    """A step (or candidate, or attempt) began.

    ``attributes`` are descriptive facts kept on the span (candidate name,
    priority, backend...); ``depends_on`` names the steps it waited for.
    """

    TYPE: ClassVar[str] = "step.started"

    kind: StepKind = StepKind.STEP
    depends_on: tuple[str, ...] = ()
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class StepSucceeded(Event):
    """Outcome ``ok`` with the step's JSON result."""

    TYPE: ClassVar[str] = "step.succeeded"

    result: JsonValue = None


#: The outcomes of ``step.unavailable``: recorded, not raised.
_UNAVAILABLE_OUTCOMES = frozenset({Outcome.ABSENT, Outcome.UNAVAILABLE, Outcome.INVALID})


@attrs.frozen(kw_only=True)
class StepUnavailable(Event):
    """Outcome ``absent``, ``unavailable`` or ``invalid``: recorded, not raised.

    ``reasons`` are human-readable (``"PermissionError: [Errno 13] ..."``);
    ``cause`` is the recorded exception, if one caused it.
    """

    TYPE: ClassVar[str] = "step.unavailable"

    outcome: Outcome
    reasons: tuple[str, ...] = ()
    cause: ExceptionInfo | None = None

    def __attrs_post_init__(self) -> None:
        if self.outcome not in _UNAVAILABLE_OUTCOMES:
            raise ValueError(
                f"StepUnavailable.outcome must be absent, unavailable or invalid, "
                f"not {self.outcome!s}"
            )


@attrs.frozen(kw_only=True)
class StepFailed(Event):
    """An error the step's policy does not record; it leaves the step.

    ``origin`` is the step where the failure started: this step itself, or
    the step below it whose failure (an error, a timeout, a crash) went up
    through it. ``None`` only in logs written before schema 3, whose readers
    infer it from the causes."""

    TYPE: ClassVar[str] = "step.failed"

    cause: ExceptionInfo
    origin: str | None = None


@attrs.frozen(kw_only=True)
class StepTimedOut(Event):
    """The step ran past ``timeout_s``; ``elapsed_ns`` is what it had used."""

    TYPE: ClassVar[str] = "step.timed_out"

    timeout_s: float
    elapsed_ns: int


@attrs.frozen(kw_only=True)
class StepCancelled(Event):
    """The step was cancelled because another step failed or the run was
    interrupted; ``reason`` says which."""

    TYPE: ClassVar[str] = "step.cancelled"

    reason: str = ""


@attrs.frozen(kw_only=True)
class StepCrashed(Event):
    """An isolated step's process died: ``exit_code`` or ``signal`` and the
    last lines it wrote to stderr."""

    TYPE: ClassVar[str] = "step.crashed"

    exit_code: int | None = None
    signal: int | None = None
    stderr_tail: tuple[str, ...] = ()


class StallReason(enum.StrEnum):
    """Why a running step's threads were looked at (:class:`StepStalled`)."""

    #: It has run past the rank's stall threshold (again, with backoff).
    STALLED = "stalled"
    #: It timed out: where it was when the run gave up on it.
    TIMED_OUT = "timed out"
    #: It was cancelled (a stop, or a sibling's failure) while its thread
    #: still ran: the thread is abandoned where it was.
    ABANDONED = "abandoned"


_WHEN = {StallReason.TIMED_OUT: ", at its timeout", StallReason.ABANDONED: ", abandoned"}


@attrs.frozen(kw_only=True)
class StepStalled(Event):
    """A step was still running: for how long, why it was looked at, and
    the stacks of the threads doing its work (the worker thread of a
    blocking step; the event loop's thread for an async step). Not a
    terminal event: the step goes on, or ends later."""

    TYPE: ClassVar[str] = "step.stalled"

    elapsed_ns: int
    why: StallReason = StallReason.STALLED
    threads: tuple[ThreadStack, ...] = ()

    @property
    def waiting_in(self) -> FrameInfo | None:
        """Where the step's first thread waits (:attr:`ThreadStack.waiting_in`)."""
        return next((t.waiting_in for t in self.threads if t.waiting_in is not None), None)

    def summary(self) -> str:
        """``waiting in wait_for_fabric (fabric.py:42) after 30.0 s`` (and
        ``, abandoned`` or ``, at its timeout``); ``""`` without a stack."""
        frame = self.waiting_in
        if frame is None:
            return ""
        when = _WHEN.get(self.why, "")
        return f"waiting in {frame.where()} after {self.elapsed_ns / 1e9:.1f} s{when}"


@attrs.frozen(kw_only=True)
class DecisionMade(Event):
    """The live run acted on a derived decision (``name``, ``value``).

    Replay recomputes the decision from the events before this one and
    reports a divergence if the current reducers decide differently.
    """

    TYPE: ClassVar[str] = "decision.made"

    name: str
    value: JsonValue = None
    inputs: Mapping[str, JsonValue] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class RunFinished(Event):
    """Last event of a rank's log."""

    TYPE: ClassVar[str] = "run.finished"

    outcome: RunOutcome
    cause: ExceptionInfo | None = None
    failed_step: str | None = None
    stop: Stop | None = None


@attrs.frozen(kw_only=True)
class Stop:
    """A stop asked from outside a run (a signal, or its owner's ``stop()``),
    which ended it ``interrupted``: what ``run.finished`` records of it.

    Attributes:
        signal: the signal's name (``SIGTERM``), or ``None`` for a stop that
            was not a signal.
        reason: what is known of why it came (``"its launcher (pid 12)
            exited"``), or ``None``.
    """

    signal: str | None = None
    reason: str | None = None

    def __str__(self) -> str:
        """``received SIGTERM: its launcher (pid 12) exited``, ``stopped``."""
        head = f"received {self.signal}" if self.signal else "stopped"
        return head + (f": {self.reason}" if self.reason else "")


#: Step events that end a step's lifecycle.
TERMINAL_STEP_EVENTS: tuple[type[Event], ...] = (
    StepSucceeded,
    StepUnavailable,
    StepFailed,
    StepTimedOut,
    StepCancelled,
    StepCrashed,
)

#: Tag → class, the closed set the codec accepts.
EVENT_TYPES: Mapping[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (RunStarted, StepStarted)  # noqa: RUF005 - unpacked, mypy types them object
    + TERMINAL_STEP_EVENTS
    + (StepStalled, DecisionMade, RunFinished)
}


#: The outcome each event class of this module stands for; a replayed
#: fold asks once per event, so the common case is one lookup.
_OUTCOMES: Mapping[type[Event], Outcome | None] = {
    **dict.fromkeys((RunStarted, StepStarted, StepStalled, DecisionMade, RunFinished)),
    StepSucceeded: Outcome.OK,
    StepFailed: Outcome.FAILED,
    StepTimedOut: Outcome.TIMED_OUT,
    StepCancelled: Outcome.CANCELLED,
    StepCrashed: Outcome.CRASHED,
}


def outcome_of(event: Event) -> Outcome | None:
    """The :class:`Outcome` a terminal step event stands for, else ``None``."""
    cls = type(event)
    if cls in _OUTCOMES:
        return _OUTCOMES[cls]
    if isinstance(event, StepUnavailable):
        return event.outcome
    # An event of a class derived from these: the terminal class it derives from decides.
    return next((_OUTCOMES[base] for base in TERMINAL_STEP_EVENTS if isinstance(event, base)), None)


def child_steps(
    events: Iterable[Event], parent: object, kind: StepKind
) -> list[tuple[StepStarted, Event | None]]:
    """The direct children of kind ``kind`` of step ``parent``, in start
    order, each with its terminal event (``None`` while still running)."""
    prefix = f"{parent}/"
    children: dict[str, tuple[StepStarted, Event | None]] = {}
    for event in events:
        step = event.step
        if not step.startswith(prefix) or "/" in step[len(prefix) :]:
            continue
        if isinstance(event, StepStarted):
            children[step] = (event, None)
        elif isinstance(event, TERMINAL_STEP_EVENTS) and step in children:
            children[step] = (children[step][0], event)
    return [child for child in children.values() if child[0].kind is kind]
