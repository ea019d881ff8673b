"""Errors raised by the orchestrator.

::

    OrchestratorError
    ├── GraphError                 the graph is not valid; nothing ran
    │   ├── DuplicateStepError
    │   ├── UnknownDependencyError
    │   └── CycleError
    ├── RankEnvironmentError       RANK/WORLD_SIZE/... are inconsistent
    ├── FaultSpecError             a fault injection spec cannot be parsed
    ├── StepTimeoutError           a step whose policy propagates timeouts ran out of time
    ├── StepCrashedError           an isolated step's process died and the policy propagates it
    ├── IsolatedStepError          an isolated step raised a non-builtin exception
    ├── StartupInterrupted         a run was stopped from outside (recorded, then raised)
    ├── GroupError                 a collective across the process group failed (``_group``)
    ├── RunDirectoryError          a run directory is held or unwritable (``_run_directory``)
    ├── orchestrator.engine:       the reference engine's errors (``engine/_config``)
    │   ├── EngineConfigError        (also ValueError)
    │   ├── ProfileError             (also ValueError)
    │   ├── PlatformConflictError    (also RuntimeError)
    │   └── UnspecifiedPlatformError (also RuntimeError)
    ├── orchestrator.cli:          the command line's (``cli/_errors``)
    │   └── CommandLineError
    │       ├── UsageError
    │       └── InputError
    └── orchestrator.ray:          the Ray embedding's (``ray/_launch``)
        └── RayLaunchError           a launch on Ray could not be made

Every error the orchestrator raises on purpose is under
:class:`OrchestratorError`; where a builtin base was promised
(``FaultSpecError`` is a ``ValueError``, ``StepTimeoutError`` a
``TimeoutError``), it is kept as a second base, so ``except ValueError`` still
catches it. Each class's ``__module__`` is the public package that exports it
(``orchestrator.StepTimeoutError``), the name logs, reports and spans record.

Probe errors themselves are never wrapped: a RuntimeError raised by a probe
leaves :func:`orchestrator.run` as that same RuntimeError object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from events import ExceptionInfo, Stop
from events._errors import public_module

__all__ = [
    "CycleError",
    "DuplicateStepError",
    "FaultSpecError",
    "GraphError",
    "IsolatedStepError",
    "OrchestratorError",
    "RankEnvironmentError",
    "StartupInterrupted",
    "StepCrashedError",
    "StepTimeoutError",
    "UnknownDependencyError",
]


class OrchestratorError(Exception):
    """Base class of the orchestrator's own errors."""

    __module__ = "orchestrator"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Named by the public package that exports it (see the module docstring).
        cls.__module__ = public_module(cls.__module__)


class GraphError(OrchestratorError):
    """The graph cannot run; raised when it is built, before any step runs."""


class DuplicateStepError(GraphError):
    """Two steps share a name: two steps of a graph, or a child step that a
    body starts again under the same path (a path names one step of a run,
    so that its log says which one each event is of).

    Attributes:
        step: the repeated name (a child's whole path).
        child: whether it is a child step started a second time.
    """

    def __init__(self, step: str, *, child: bool = False) -> None:
        self.step = step
        self.child = child
        if child:
            parent, _, name = step.rpartition("/")
            message = (
                f"step {step!r} already ran in this run; give each child of {parent!r} its "
                f"own name (a retry as {name + '-2'!r}, say)"
            )
        else:
            message = f"step {step!r} is defined twice; step names must be unique"
        super().__init__(message)


class UnknownDependencyError(GraphError):
    """A step depends on a step the graph does not have.

    Attributes:
        step: the dependent step.
        dependency: the missing name.
        known: the steps the graph has.
    """

    def __init__(self, step: str, dependency: str, known: Sequence[str]) -> None:
        self.step = step
        self.dependency = dependency
        self.known = tuple(known)
        super().__init__(
            f"step {step!r} depends on unknown step {dependency!r}; "
            f"known steps: {', '.join(sorted(self.known)) or '(none)'}"
        )


class CycleError(GraphError):
    """The dependencies form a cycle.

    Attributes:
        cycle: the steps of the cycle, the first repeated at the end.
    """

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = tuple(cycle)
        super().__init__(
            f"dependency cycle: {' -> '.join(self.cycle)}; remove one of these dependencies"
        )


class RankEnvironmentError(OrchestratorError):
    """The launcher's rank variables are missing, malformed or inconsistent.

    Attributes:
        variable: the offending variable (e.g. ``RANK``).
        value: its value.
        reason: what is wrong.
    """

    def __init__(self, variable: str, value: object, reason: str) -> None:
        self.variable = variable
        self.value = value
        self.reason = reason
        super().__init__(f"{variable}={value!r}: {reason}")


class FaultSpecError(OrchestratorError, ValueError):
    """A fault injection spec is malformed.

    Attributes:
        spec: the whole spec.
        part: the part that is wrong.
        reason: what would be valid.
    """

    def __init__(self, spec: str, part: str, reason: str) -> None:
        self.spec = spec
        self.part = part
        self.reason = reason
        super().__init__(f"bad fault spec {spec!r}: {part!r}: {reason}")


class StepTimeoutError(OrchestratorError, TimeoutError):
    """A step ran past its timeout and its policy says to propagate that.

    Attributes:
        step: the step.
        timeout_s: its timeout.
    """

    def __init__(self, step: str, timeout_s: float) -> None:
        self.step = step
        self.timeout_s = timeout_s
        super().__init__(f"step {step!r} did not finish within {timeout_s:g} s")


class StepCrashedError(OrchestratorError):
    """An isolated step's process died and its policy says to propagate that.

    Attributes:
        step: the step.
        exit_code: the process's exit code, if it exited.
        signal: the signal that killed it, if one did.
        stderr_tail: the last lines it wrote to stderr.
    """

    def __init__(
        self, step: str, exit_code: int | None, signal: int | None, stderr_tail: Sequence[str]
    ) -> None:
        self.step = step
        self.exit_code = exit_code
        self.signal = signal
        self.stderr_tail = tuple(stderr_tail)
        how = f"signal {signal}" if signal is not None else f"exit code {exit_code}"
        super().__init__(f"isolated step {step!r} crashed ({how})")


class IsolatedStepError(OrchestratorError):
    """An isolated step raised an exception that cannot be rebuilt in this
    process (it is not a builtin exception type).

    Attributes:
        step: the step.
        info: the exception as recorded in the child.
    """

    def __init__(self, step: str, info: ExceptionInfo) -> None:
        self.step = step
        self.info = info
        super().__init__(f"isolated step {step!r} raised {info.reason}")


class StartupInterrupted(OrchestratorError):
    """A run was stopped from outside. Recorded as the cause of an
    ``interrupted`` run (the run is cancelled, not failed by it), and raised
    by :meth:`orchestrator.Startup.run` once everything is flushed.

    Attributes:
        signal: the signal's name (``SIGTERM``), or ``None`` for a stop that
            was not a signal.
        reason: what is known of why it came (``"its launcher (pid 12)
            exited"``), or ``None``.
    """

    def __init__(self, signal: str | None = None, reason: str | None = None) -> None:
        self.signal = signal
        self.reason = reason
        super().__init__(str(self.stop))

    @property
    def stop(self) -> Stop:
        """What ``run.finished`` records of it."""
        return Stop(signal=self.signal, reason=self.reason)
