"""Candidate sets: probe many alternatives concurrently, pick by priority.

Each candidate is probed as its own child step (kind ``candidate``, with its
name and priority on the span). A probe loads the candidate and validates the
configuration: it returns a list of reasons why the candidate does not fit
(empty when it fits), or raises. The step's error policy decides which
exceptions are recorded (the candidate is ``unavailable`` with reason
``"Type: message"``) and which propagate (the sibling probes are cancelled).

Selection is a recorded decision (``candidates.select``) derived from the
events by priority, never by completion order, so concurrency cannot change
the result and replay recomputes it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import anyio
import attrs

from events import JsonValue, Outcome, StepKind

from ._context import StepContext, StepResult, Unavailable, _unique_children
from ._errors import OrchestratorError
from ._policy import ErrorPolicy

__all__ = [
    "Candidate",
    "CandidateReport",
    "ExplicitCandidateInvalidError",
    "NoValidCandidateError",
    "Selection",
    "select_candidate",
]


class NoValidCandidateError(OrchestratorError, ValueError):
    """No candidate of a set is valid here (also a :class:`ValueError`).

    Logs record it as ``orchestrator.NoValidCandidateError``, so message
    rules match its type, never its text.

    Attributes:
        what: what was being chosen (``backend``).
        reasons: each candidate's reasons, by name, in priority order.
        where: for what it was chosen (``this configuration``).
    """

    def __init__(
        self, what: str, reasons: Mapping[str, Sequence[str]], where: str = "this configuration"
    ) -> None:
        self.what = what
        self.where = where
        self.reasons = {name: tuple(found) for name, found in reasons.items()}
        # As vLLM 0.33 writes it: {NAME: [reason, reason], NAME: [...]}.
        details = ", ".join(f"{name}: [{', '.join(found)}]" for name, found in self.reasons.items())
        super().__init__(f"No valid {what} found for {where}. Reasons: {{{details}}}.")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.what, self.reasons, self.where)


class ExplicitCandidateInvalidError(OrchestratorError, ValueError):
    """The explicitly selected candidate is not valid here: it does not fit
    the configuration, or probing it failed (then raised from the original
    exception). Also a :class:`ValueError`.

    Logs record it as ``orchestrator.ExplicitCandidateInvalidError``.

    Attributes:
        what: what was being chosen (``backend``).
        candidate: the selected candidate's name.
        reason: why, as printed (``['reason', ...]`` or ``[Type: message]``).
    """

    def __init__(self, what: str, candidate: str, reason: str) -> None:
        self.what = what
        self.candidate = candidate
        self.reason = reason
        super().__init__(
            f"Selected {what} {candidate} is not valid for this configuration. Reason: {reason}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.what, self.candidate, self.reason)


#: A probe: load the candidate, validate the configuration, return the
#: reasons it does not fit (empty: it fits). Blocking or async.
Probe = Callable[[StepContext], Sequence[str]] | Callable[[StepContext], Awaitable[Sequence[str]]]


@attrs.frozen(kw_only=True)
class Candidate:
    """One alternative: ``priority`` 0 is the most preferred."""

    name: str
    priority: int
    probe: Probe
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class CandidateReport:
    """How one candidate fared."""

    name: str
    priority: int
    outcome: Outcome
    reasons: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        """Whether the candidate fits this configuration."""
        return self.outcome is Outcome.OK


@attrs.frozen(kw_only=True)
class Selection:
    """The chosen candidate and every candidate's report, in priority order."""

    selected: str
    explicit: bool
    reports: tuple[CandidateReport, ...]

    @property
    def considered(self) -> tuple[str, ...]:
        """The names of the candidates that were probed, in priority order."""
        return tuple(r.name for r in self.reports)

    @property
    def valid(self) -> tuple[str, ...]:
        """The names of the valid candidates, in priority order."""
        return tuple(r.name for r in self.reports if r.valid)


def _wrap(candidate: Candidate) -> Callable[[StepContext], Any]:
    """The child-step body for ``candidate``: keeps a blocking probe blocking
    (so it runs in a worker thread) and an async probe async."""

    def verdict(reasons: Sequence[str] | None) -> JsonValue | Unavailable:
        if reasons:
            return Unavailable(outcome=Outcome.INVALID, reasons=tuple(map(str, reasons)))
        return {"candidate": candidate.name, "priority": candidate.priority}

    probe = candidate.probe
    if inspect.iscoroutinefunction(probe):

        async def probe_async(context: StepContext) -> Any:
            return verdict(await probe(context))

        return probe_async

    def probe_blocking(context: StepContext) -> Any:
        return verdict(probe(context))  # type: ignore[arg-type]

    return probe_blocking


async def select_candidate(
    context: StepContext,
    candidates: Sequence[Candidate],
    *,
    explicit: str | None = None,
    what: str = "backend",
    where: str = "this configuration",
    policy: ErrorPolicy | None = None,
    timeout: float | None = None,
) -> Selection:
    """Probe ``candidates`` and select one.

    Automatic (``explicit`` is ``None``): all candidates are probed
    concurrently; the valid one with the best priority is selected.
    Explicit: only the named candidate is probed, with no fallback.

    Raises:
        NoValidCandidateError: no candidate is valid (``No valid WHAT found
            for WHERE. Reasons: {NAME: [reason, ...], ...}.``).
        ExplicitCandidateInvalidError: the explicit candidate is not valid
            (``Selected backend X is not valid for this configuration.
            Reason: ...``: ``[Type: message]``, raised from the original
            exception, when probing failed; the list of reasons when the
            candidate does not fit).
        ValueError: ``candidates`` is empty or repeats a name; the explicit
            candidate is unknown (the message lists the valid names).
        BaseException: whatever a probe raised that ``policy`` propagates.
    """
    ordered = sorted(candidates, key=lambda c: c.priority)
    if not ordered:
        raise ValueError(f"no {what} candidates to choose from on this platform")
    names = [c.name for c in ordered]
    _unique_children(names, f"{what} candidates")
    if explicit is not None:
        if explicit not in names:
            raise ValueError(f"Unknown {what} {explicit!r}; valid {what}s here: {', '.join(names)}")
        ordered = [ordered[names.index(explicit)]]
    results: dict[str, StepResult] = {}

    async def probe(candidate: Candidate) -> None:
        results[candidate.name] = await context.run_child(
            candidate.name,
            _wrap(candidate),
            kind=StepKind.CANDIDATE,
            policy=policy,
            timeout=timeout,
            attributes={
                "candidate": candidate.name,
                "priority": candidate.priority,
                **candidate.attributes,
            },
        )

    if explicit is not None:
        await probe(ordered[0])
    else:
        async with anyio.create_task_group() as group:
            for candidate in ordered:
                group.start_soon(probe, candidate)
    reports = tuple(
        CandidateReport(
            name=c.name,
            priority=c.priority,
            outcome=results[c.name].outcome,
            reasons=results[c.name].reasons,
        )
        for c in ordered
    )
    if explicit is None:
        selected = context.decide("candidates.select", {"parent": context.step})
        if selected is None:
            raise NoValidCandidateError(what, {r.name: r.reasons for r in reports}, where)
        return Selection(selected=str(selected), explicit=False, reports=reports)
    result = results[explicit]
    if not result.ok:
        # As the seed has it: validation reasons print as the list they are;
        # an environment failure (or a timeout) prints as ``[Type: message]``.
        if result.outcome is Outcome.INVALID:
            reason = repr(list(result.reasons))
        else:
            reason = f"[{'; '.join(result.reasons)}]"
        error = ExplicitCandidateInvalidError(what, explicit, reason)
        if result.error is not None:
            raise error from result.error
        raise error
    context.record_decision(
        "candidates.select", explicit, {"parent": context.step, "explicit": explicit}
    )
    return Selection(selected=explicit, explicit=True, reports=reports)
