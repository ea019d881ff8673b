"""Decisions: values the live run derives from its own events and acts on.

A decider is a pure function of a rank's events so far (and the decision's
inputs). The live run calls it through ``StepContext.decide`` and records a
``decision.made`` event with the value; :func:`check_decisions` calls it
again on the same events during replay and reports an :class:`events.Divergence`
when the current code decides differently (a changed reducer shows up as a
reported divergence, never as a silent change).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from events import DecisionMade, Event, JsonValue, Outcome, StepKind, outcome_of
from events._model import child_steps

if TYPE_CHECKING:
    from events import Divergence

__all__ = [
    "DEFAULT_DECIDERS",
    "Decider",
    "check_decisions",
    "decide_candidate",
    "decide_fallback",
]

#: Computes a decision from a rank's events so far and the decision's inputs.
#: Must be pure: replay calls it again on the same events.
Decider = Callable[[Sequence[Event], Mapping[str, JsonValue]], JsonValue]


def decide_candidate(events: Sequence[Event], inputs: Mapping[str, JsonValue]) -> JsonValue:
    """``candidates.select``: among the candidate children of
    ``inputs["parent"]`` that ended ``ok``, the one with the best (lowest)
    priority; ``None`` if none is ok. Completion order never matters."""
    candidates = child_steps(events, inputs["parent"], StepKind.CANDIDATE)
    valid = [started for started, end in candidates if end and outcome_of(end) is Outcome.OK]
    if not valid:
        return None
    best = min(valid, key=lambda c: (_number(c.attributes.get("priority")), c.step))
    return best.attributes.get("candidate", best.step.rpartition("/")[2])


def decide_fallback(events: Sequence[Event], inputs: Mapping[str, JsonValue]) -> JsonValue:
    """``fallback.result``: the first attempt (in chain order) of
    ``inputs["parent"]`` that ended ``ok``; ``None`` if the chain is exhausted."""
    attempts = child_steps(events, inputs["parent"], StepKind.ATTEMPT)
    for started, end in sorted(attempts, key=lambda c: _number(c[0].attributes.get("attempt"))):
        if end and outcome_of(end) is Outcome.OK:
            return started.attributes.get("backend", started.step.rpartition("/")[2])
    return None


def _number(value: JsonValue) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


#: The deciders every runner knows.
DEFAULT_DECIDERS: Mapping[str, Decider] = {
    "candidates.select": decide_candidate,
    "fallback.result": decide_fallback,
}


def check_decisions(
    events: Iterable[Event],
    deciders: Mapping[str, Decider] | None = None,
) -> list[Divergence]:
    """Recompute every recorded decision from the events before it (per rank)
    and list those that differ. A decision without a decider is skipped."""
    from events import Divergence  # the replay side of events: when checked

    table = {**DEFAULT_DECIDERS, **(deciders or {})}
    by_rank: defaultdict[int, list[Event]] = defaultdict(list)
    divergences: list[Divergence] = []
    for event in events:
        history = by_rank[event.rank]
        if isinstance(event, DecisionMade) and (decider := table.get(event.name)) is not None:
            try:
                value = decider(tuple(history), event.inputs)
            except Exception as exc:  # a decider that cannot decide is a divergence too
                value = f"<{type(exc).__name__}: {exc}>"
            if value != event.value:
                divergences.append(Divergence.of_decision(event, value))
        history.append(event)
    return divergences
