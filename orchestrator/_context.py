"""What a running step sees: its identity, its dependencies, the importer;
and what it needs of the run it belongs to.

:class:`StepContext` talks to its run only through the narrow
:class:`StepRun` protocol. The runner's live run implements it in the
parent process; an isolated step's child process implements it with the
facts the parent sent (and refuses what only the parent can do: run child
steps, record decisions). Neither side imports the other: both depend on
this module.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
import orjson

from events import ExceptionInfo, JsonValue, Outcome, RankIdentity, StepKind

from ._importer import Importer
from ._policy import RECORDED_OUTCOMES, ErrorPolicy

if TYPE_CHECKING:
    from ._threads import StepThreads

__all__ = ["StepBody", "StepContext", "StepResult", "StepRun", "Unavailable", "check_json"]

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class StepResult:
    """How a step (or child step) ended, as its dependants see it.

    Attributes:
        step: the step path.
        outcome: its outcome.
        value: the JSON result when ``ok``.
        reasons: why it is not ok (``"OSError: ..."``, validation reasons).
        exception: the recorded exception, if one ended it.
    """

    step: str
    outcome: Outcome
    value: JsonValue = None
    reasons: tuple[str, ...] = ()
    exception: ExceptionInfo | None = None
    #: The live exception behind ``exception`` (same process only), so a
    #: caller can ``raise ... from result.error``. Not part of equality.
    error: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def ok(self) -> bool:
        """Whether the outcome is ``ok``."""
        return self.outcome is Outcome.OK


def check_json(step: str, value: Any) -> None:
    """Raise a :class:`TypeError` naming ``step`` when ``value``, its body's
    result, is not JSON (in the run's process and an isolated step's child)."""
    try:
        orjson.dumps(value)
    except TypeError as exc:
        raise TypeError(
            f"step {step!r} returned {type(value).__name__}, which is not JSON "
            f"serialisable; return JSON values (dict, list, str, numbers, None): {exc}"
        ) from None


@attrs.frozen(kw_only=True)
class Unavailable:
    """Return this from a step body to end the step ``absent``,
    ``unavailable`` or ``invalid`` without raising.

    ``return Unavailable(outcome=Outcome.INVALID, reasons=("head size 80",))``
    """

    outcome: Outcome = Outcome.UNAVAILABLE
    reasons: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        if self.outcome not in RECORDED_OUTCOMES:
            raise ValueError(f"Unavailable.outcome must not be {self.outcome}")


class StepRun(Protocol):
    """What a :class:`StepContext` needs of the run its step belongs to (see
    the module docstring); what a run cannot do it refuses with a
    :class:`RuntimeError` naming what the step should do instead."""

    run_id: str
    identity: RankIdentity
    config: Mapping[str, JsonValue]
    host: Any
    services: Mapping[str, Any]
    trace_id: str
    importer: Importer

    #: the threads at work for its steps (the watchdog's view of them)
    threads: StepThreads

    async def run_child(
        self,
        *,
        parent: StepContext,
        name: str,
        body: StepBody,
        kind: StepKind,
        policy: ErrorPolicy | None,
        timeout: float | None,
        attributes: Mapping[str, JsonValue],
    ) -> StepResult:
        """See :meth:`StepContext.run_child`."""

    def decide(self, context: StepContext, name: str, inputs: dict[str, JsonValue]) -> JsonValue:
        """See :meth:`StepContext.decide`."""

    def record_decision(
        self, context: StepContext, name: str, value: JsonValue, inputs: dict[str, JsonValue]
    ) -> None:
        """See :meth:`StepContext.record_decision`."""

    def children_of(self, step: str) -> Sequence[StepResult]:
        """See :meth:`StepContext.child_results`."""


class StepContext:
    """Handed to every step body.

    Blocking methods (``import_module``, ``find_spec``) may be called from
    blocking bodies (which run in worker threads) and from async bodies via
    :meth:`to_thread`. ``run_child`` and ``to_thread`` are awaited from async
    bodies; ``decide`` and ``record_decision`` are called from async bodies
    (they append to the log on the event loop).
    """

    def __init__(
        self, run: StepRun, *, step: str, span_id: str, dependencies: Mapping[str, StepResult]
    ) -> None:
        self._run = run
        self._step = step
        self._span_id = span_id
        self._dependencies = dependencies

    # Identity --------------------------------------------------------------------------

    @property
    def step(self) -> str:
        """This step's path."""
        return self._step

    @property
    def run_id(self) -> str:
        """The run's id, shared by every rank."""
        return self._run.run_id

    @property
    def identity(self) -> RankIdentity:
        """This process's rank identity."""
        return self._run.identity

    @property
    def config(self) -> Mapping[str, JsonValue]:
        """The run configuration (recorded in ``run.started``)."""
        return self._run.config

    @property
    def host(self) -> Any:
        """The host-facts object the run was given (real or simulated)."""
        return self._run.host

    @property
    def services(self) -> Mapping[str, Any]:
        """Objects the caller handed to the run for steps to use (a process
        group, a workspace factory...), by name."""
        return self._run.services

    @property
    def trace_id(self) -> str:
        """The run's trace id (32 hex digits)."""
        return self._run.trace_id

    @property
    def span_id(self) -> str:
        """This step's span id (16 hex digits)."""
        return self._span_id

    @property
    def traceparent(self) -> str:
        """A W3C ``traceparent`` naming this step's span (for child processes)."""
        return f"00-{self._run.trace_id}-{self._span_id}-01"

    # Dependencies ----------------------------------------------------------------------

    def dependency(self, name: str) -> StepResult:
        """How dependency ``name`` ended.

        Raises:
            KeyError: ``name`` is not a dependency of this step.
        """
        try:
            return self._dependencies[name]
        except KeyError:
            raise KeyError(
                f"{name!r} is not a dependency of step {self._step!r}; "
                f"its dependencies: {', '.join(self._dependencies) or '(none)'}"
            ) from None

    def result(self, name: str) -> JsonValue:
        """The JSON result of dependency ``name`` (``None`` unless it is ok)."""
        return self.dependency(name).value

    # Imports ---------------------------------------------------------------------------

    def import_module(self, name: str) -> ModuleType:
        """Import ``name`` through the run's importer (blocking)."""
        return self._run.importer.import_module(name)

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        """Find ``name`` through the run's importer (blocking); ``None`` if it
        is not installed."""
        return self._run.importer.find_spec(name)

    # Concurrency -----------------------------------------------------------------------

    async def to_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking ``fn(*args)`` in a worker thread under the run's
        capacity limiter; abandoned (not waited for) if this step is
        cancelled or times out. The thread is a daemon: a call that never
        returns does not keep the process alive, and while it runs the
        watchdog knows it works for this step (its stack is what a stall
        of this step records)."""
        return await self._run.threads.run(self.step, fn, *args)

    def thread_at_work(self, thread: threading.Thread) -> contextlib.AbstractContextManager[None]:
        """While the block runs, ``thread`` (one of the caller's own, doing
        this step's work: the worker threads of :meth:`to_thread` are
        known already) is at work for this step, so that a stall of this
        step records where that thread waits."""
        return self._run.threads.working(self.step, thread)

    async def run_child(
        self,
        name: str,
        body: StepBody,
        *,
        kind: StepKind = StepKind.STEP,
        policy: ErrorPolicy | None = None,
        timeout: float | None = None,
        attributes: Mapping[str, JsonValue] | None = None,
    ) -> StepResult:
        """Run ``body`` as a child step ``<this step>/<name>`` with its own
        events and span, nested under this step's span.

        Outcomes follow ``policy`` (default: the policy of the graph step
        this one is, or runs under). A propagating error is recorded on the
        child and leaves this call as the runner's carrier of it, an
        :class:`Exception` that is not the child's own type: let it go on,
        and it is recorded on this step and fails the run. A body that
        catches it ends that failure there (no later step is cancelled for
        it); to handle a child's errors by type, give the child a ``policy``
        that records them and read the :class:`StepResult` returned.
        """
        return await self._run.run_child(
            parent=self,
            name=name,
            body=body,
            kind=kind,
            policy=policy,
            timeout=timeout,
            attributes=attributes or {},
        )

    def decide(self, name: str, inputs: Mapping[str, JsonValue] | None = None) -> JsonValue:
        """Derive decision ``name`` from this rank's events so far through the
        run's registered decider, record a ``decision.made`` event, and return
        the value. Replay recomputes it the same way.

        Raises:
            KeyError: no decider named ``name`` was registered.
        """
        return self._run.decide(self, name, dict(inputs or {}))

    def record_decision(
        self, name: str, value: JsonValue, inputs: Mapping[str, JsonValue] | None = None
    ) -> None:
        """Record a decision made outside any decider (replay cannot check it)."""
        self._run.record_decision(self, name, value, dict(inputs or {}))

    def child_results(self) -> Sequence[StepResult]:
        """The results of this step's children so far, in the order they ended."""
        return self._run.children_of(self._step)


def _unique_children(names: Sequence[str], what: str) -> None:
    """Raise :class:`ValueError` if ``names`` (of ``what``) repeats one: each
    is a child step named after it, and a repeated name would make two of
    them one step path (two candidates' probes one report)."""
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{what} must have unique names; repeated: {repeated}")


#: A step body takes the step's context and returns a JSON value (or an
#: :class:`~orchestrator.Unavailable` to end absent, unavailable or invalid).
#: An ``async def`` body runs on the event loop; a plain function runs in a
#: worker thread (or a subprocess, with process isolation).
StepBody = (
    Callable[[StepContext], Awaitable[JsonValue | Unavailable]]
    | Callable[[StepContext], JsonValue | Unavailable]
)
