"""Hypothesis strategies for every event type of :mod:`events`.

Values stay inside what JSON can carry: strings without lone surrogates,
64-bit integers and finite floats.
"""

from __future__ import annotations

import attrs
from hypothesis import strategies as st

import events

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
NON_NEGATIVE = st.integers(min_value=0, max_value=2**63 - 1)
FINITE = st.floats(allow_nan=False, allow_infinity=False)

#: Any text JSON can carry (lone surrogates cannot be encoded as UTF-8).
TEXT = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=12)
#: Identifiers: step paths, names, ids.
NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_/.-", min_size=1, max_size=16)
HEX32 = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
HEX16 = st.text(alphabet="0123456789abcdef", min_size=16, max_size=16)

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | INT64 | FINITE | TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(TEXT, children, max_size=3),
    max_leaves=8,
)
JSON_OBJECTS = st.dictionaries(TEXT, JSON_VALUES, max_size=3)

RANK_IDENTITIES = st.builds(
    events.RankIdentity,
    rank=st.integers(0, 1023),
    local_rank=st.integers(0, 7),
    world_size=st.integers(1, 1024),
    local_world_size=st.integers(1, 8),
    node_rank=st.integers(0, 127),
)

FRAMES = st.builds(
    events.FrameInfo,
    filename=TEXT,
    lineno=st.none() | st.integers(0, 100_000),
    name=TEXT,
    line=st.none() | TEXT,
)


def _exception_info(
    cause: st.SearchStrategy[events.ExceptionInfo | None],
    context: st.SearchStrategy[events.ExceptionInfo | None],
    members: st.SearchStrategy[tuple[events.ExceptionInfo, ...]],
) -> st.SearchStrategy[events.ExceptionInfo]:
    return st.builds(
        events.ExceptionInfo,
        type=NAME,
        message=TEXT,
        reason=TEXT,
        errno=st.none() | st.integers(0, 200),
        strerror=st.none() | TEXT,
        filename=st.none() | TEXT,
        module_name=st.none() | NAME,
        module_path=st.none() | TEXT,
        frames=st.lists(FRAMES, max_size=2).map(tuple),
        cause=cause,
        context=context,
        notes=st.lists(TEXT, max_size=2).map(tuple),
        exceptions=members,
        truncated=st.booleans(),
    )


#: Exception trees with causes, contexts and group members, a few levels deep.
EXCEPTION_INFOS: st.SearchStrategy[events.ExceptionInfo] = st.recursive(
    _exception_info(st.none(), st.none(), st.just(())),
    lambda children: _exception_info(
        st.none() | children,
        st.none() | children,
        st.lists(children, max_size=2).map(tuple),
    ),
    max_leaves=5,
)

_ENVELOPE = {
    "run_id": st.just("run"),
    "rank": st.just(0),
    "wall_ns": NON_NEGATIVE,
    "mono_ns": NON_NEGATIVE,
    "step": st.just("") | NAME,
    "trace_id": HEX32,
    "span_id": HEX16,
    "parent_span_id": st.none() | HEX16,
}

RUN_STARTED = st.builds(
    events.RunStarted,
    identity=RANK_IDENTITIES,
    host=TEXT,
    pid=st.integers(1, 2**22),
    versions=st.dictionaries(NAME, TEXT, max_size=3),
    config=JSON_OBJECTS,
    graph=TEXT,
    **_ENVELOPE,
)
STEP_STARTED = st.builds(
    events.StepStarted,
    kind=st.sampled_from(events.StepKind),
    depends_on=st.lists(NAME, max_size=3).map(tuple),
    attributes=JSON_OBJECTS,
    **_ENVELOPE,
)
STEP_SUCCEEDED = st.builds(events.StepSucceeded, result=JSON_VALUES, **_ENVELOPE)
STEP_UNAVAILABLE = st.builds(
    events.StepUnavailable,
    outcome=st.sampled_from(
        [events.Outcome.ABSENT, events.Outcome.UNAVAILABLE, events.Outcome.INVALID]
    ),
    reasons=st.lists(TEXT, max_size=3).map(tuple),
    cause=st.none() | EXCEPTION_INFOS,
    **_ENVELOPE,
)
STEP_FAILED = st.builds(
    events.StepFailed, cause=EXCEPTION_INFOS, origin=st.none() | NAME, **_ENVELOPE
)
STEP_TIMED_OUT = st.builds(
    events.StepTimedOut,
    timeout_s=st.floats(min_value=0, max_value=1e6),
    elapsed_ns=NON_NEGATIVE,
    **_ENVELOPE,
)
STEP_CANCELLED = st.builds(events.StepCancelled, reason=TEXT, **_ENVELOPE)
STEP_CRASHED = st.builds(
    events.StepCrashed,
    exit_code=st.none() | st.integers(-255, 255),
    signal=st.none() | st.integers(1, 64),
    stderr_tail=st.lists(TEXT, max_size=3).map(tuple),
    **_ENVELOPE,
)
DECISION_MADE = st.builds(
    events.DecisionMade, name=NAME, value=JSON_VALUES, inputs=JSON_OBJECTS, **_ENVELOPE
)
RUN_FINISHED = st.builds(
    events.RunFinished,
    outcome=st.sampled_from(
        [events.RunOutcome.READY, events.RunOutcome.FAILED, events.RunOutcome.INTERRUPTED]
    ),
    cause=st.none() | EXCEPTION_INFOS,
    failed_step=st.none() | NAME,
    stop=st.none() | st.builds(events.Stop, signal=st.none() | NAME, reason=st.none() | TEXT),
    **_ENVELOPE,
)

#: One strategy per event type, keyed by type tag (every tag is covered).
BY_TYPE: dict[str, st.SearchStrategy[events.Event]] = {
    "run.started": RUN_STARTED,
    "step.started": STEP_STARTED,
    "step.succeeded": STEP_SUCCEEDED,
    "step.unavailable": STEP_UNAVAILABLE,
    "step.failed": STEP_FAILED,
    "step.timed_out": STEP_TIMED_OUT,
    "step.cancelled": STEP_CANCELLED,
    "step.crashed": STEP_CRASHED,
    "decision.made": DECISION_MADE,
    "run.finished": RUN_FINISHED,
}

EVENTS: st.SearchStrategy[events.Event] = st.one_of(*BY_TYPE.values())


@st.composite
def streams(draw: st.DrawFn, max_size: int = 12) -> list[events.Event]:
    """One rank's stream: events of one (run, rank) with ``seq`` 0, 1, 2..."""
    run_id = draw(NAME)
    rank = draw(st.integers(0, 1023))
    drawn = draw(st.lists(EVENTS, max_size=max_size))
    return [
        attrs.evolve(event, run_id=run_id, rank=rank, seq=seq) for seq, event in enumerate(drawn)
    ]
