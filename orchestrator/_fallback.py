"""Fallback chains: try alternatives in order until one works.

Each attempt is its own child step and span (kind ``attempt``), with its
position recorded (``attempt``, ``attempts``, ``backend``). An attempt that
fails while another remains is an *attempt-phase* outcome; the last failure
exhausts the chain, which is *terminal*. The chain's result (which backend
worked, if any) is a recorded decision (``fallback.result``) derived from
the events, so replay recomputes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from events import JsonValue, StepKind

from ._context import StepBody, StepContext, StepResult, _unique_children
from ._policy import ErrorPolicy

__all__ = ["Attempt", "ChainResult", "run_fallback_chain"]


@attrs.frozen(kw_only=True)
class Attempt:
    """One link of a chain: ``body`` returns a JSON value when it works,
    returns :class:`~orchestrator.Unavailable` or raises when it does not."""

    name: str
    body: StepBody
    attributes: Mapping[str, JsonValue] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ChainResult:
    """How a chain ended.

    Attributes:
        backend: the attempt that worked, or ``None`` if the chain is exhausted.
        value: that attempt's result.
        attempts: every attempt that ran, in order.
    """

    backend: str | None
    value: JsonValue
    attempts: tuple[StepResult, ...]

    @property
    def exhausted(self) -> bool:
        """Whether every attempt failed."""
        return self.backend is None


async def run_fallback_chain(
    context: StepContext,
    attempts: Sequence[Attempt],
    *,
    policy: ErrorPolicy | None = None,
    timeout: float | None = None,
) -> ChainResult:
    """Run ``attempts`` in order as child steps of ``context``'s step until one
    is ``ok``.

    Raises:
        ValueError: ``attempts`` is empty or repeats a name.
        BaseException: whatever an attempt raised that ``policy`` propagates.
    """
    if not attempts:
        raise ValueError("a fallback chain needs at least one attempt")
    _unique_children([attempt.name for attempt in attempts], "fallback attempts")
    results: list[StepResult] = []
    for index, attempt in enumerate(attempts):
        result = await context.run_child(
            attempt.name,
            attempt.body,
            kind=StepKind.ATTEMPT,
            policy=policy,
            timeout=timeout,
            attributes={
                "backend": attempt.name,
                "attempt": index,
                "attempts": len(attempts),
                "fallback_left": index < len(attempts) - 1,
                **attempt.attributes,
            },
        )
        results.append(result)
        if result.ok:
            break
    backend = context.decide("fallback.result", {"parent": context.step})
    return ChainResult(
        backend=None if backend is None else str(backend),
        # The loop stops at the first attempt that worked: the last one run.
        value=result.value if backend is not None and result.ok else None,
        attempts=tuple(results),
    )
