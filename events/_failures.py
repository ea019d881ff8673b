"""Failure bookkeeping shared by the messages and the rank state. Internal."""

from __future__ import annotations

import attrs

from ._exception_info import ExceptionInfo
from ._model import Event, Outcome, RunFinished, StepCrashed, StepFailed, StepTimedOut, outcome_of

__all__: list[str] = []


@attrs.frozen(kw_only=True)
class _Failure:
    """A failure on its way up the step tree (or settled)."""

    step: str
    outcome: Outcome
    cause: ExceptionInfo | None
    wall_ns: int
    #: the events behind it, the one it started at first
    seqs: tuple[int, ...]
    #: a message was already derived for it (a timeout or crash)
    reported: bool = False


#: Exception names a propagated timeout or crash arrives as on enclosing
#: steps (for logs before schema 3, which do not record a failure's origin).
_PROPAGATED_NAMES = frozenset({"StepTimeoutError", "StepCrashedError"})


def _continues(failure: _Failure, cause: ExceptionInfo) -> bool:
    """Whether an enclosing step failing with ``cause`` is ``failure`` going
    up, in a log before schema 3."""
    if failure.cause is None:
        return failure.outcome is not Outcome.FAILED and cause.name in _PROPAGATED_NAMES
    return failure.cause is cause or failure.cause == cause


_FAILING = (StepFailed, StepTimedOut, StepCrashed)


def _track(
    pending: tuple[_Failure, ...],
    event: Event,
    root_span_id: str | None,
    *,
    reported: bool = False,
) -> tuple[tuple[_Failure, ...], _Failure | None, bool]:
    """Follow failures up the step tree: a child's failure goes up when its
    parent fails with the same cause, is absorbed when the parent ends any
    other way, and is settled when it fails a graph step (one whose span is
    the run's root span's child, or without spans a top-level path) or the
    run.

    The answer for ``event``: the failures still on their way up; a failure
    that reached a graph step (or the end of the run); whether the step's
    own failure started here (not a child's going up)."""
    if isinstance(event, RunFinished):
        settled = next((f for f in pending if f.step == event.failed_step), None)
        if settled is not None:
            settled = attrs.evolve(settled, seqs=(*settled.seqs, event.seq))
        return (), settled, False
    failing = isinstance(event, _FAILING)
    if not pending and not failing:
        return (), None, False  # nothing on its way up, nor a failure here
    step = event.step
    prefix = step + "/"
    below = [f for f in pending if f.step.startswith(prefix)]
    rest = tuple(f for f in pending if not f.step.startswith(prefix)) if below else pending
    going_up: _Failure | None = None
    if isinstance(event, StepFailed):
        if event.origin is None:
            # A log before schema 3 does not say where it started.
            going_up = next((f for f in below if _continues(f, event.cause)), None)
        else:
            going_up = next((f for f in below if f.step == event.origin), None)
    elif not failing:
        return rest, None, False
    cause = event.cause if isinstance(event, StepFailed) else None
    if going_up is None:
        failure = _Failure(
            step=step,
            outcome=outcome_of(event) or Outcome.FAILED,
            cause=cause,
            wall_ns=event.wall_ns,
            seqs=(event.seq,),
            reported=reported,
        )
    else:
        failure = attrs.evolve(
            going_up, cause=going_up.cause or cause, seqs=(*going_up.seqs, event.seq)
        )
    if root_span_id is not None and event.parent_span_id is not None:
        top_level = event.parent_span_id == root_span_id
    else:
        top_level = "/" not in step
    if top_level and cause is not None:
        return rest, failure, going_up is None
    return (*rest, failure), None, going_up is None
