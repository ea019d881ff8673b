"""Small, realistic event streams for the log and reducer tests."""

from __future__ import annotations

import attrs

import events
from events import ExceptionInfo, Outcome, RankIdentity, RunOutcome

PERMISSION_DENIED = ExceptionInfo(
    type="PermissionError",
    message="[Errno 13] Permission denied: '/root/.cache/flashinfer'",
    reason="PermissionError: [Errno 13] Permission denied: '/root/.cache/flashinfer'",
    errno=13,
    strerror="Permission denied",
    filename="/root/.cache/flashinfer",
)


def rank_stream(
    run_id: str = "run-1", rank: int = 0, *, wall_ns: int = 1_000
) -> list[events.Event]:
    """A whole rank's startup, ``seq`` 0..6: two steps, one unavailable.

    Wall-clock times are ``wall_ns + 10 * seq``; monotonic times start at 0.
    """
    envelope = {"run_id": run_id, "rank": rank}
    drafts: list[events.Event] = [
        events.RunStarted(
            **envelope,
            wall_ns=0,
            mono_ns=0,
            identity=RankIdentity(rank=rank, world_size=3),
            host="node-a",
            pid=100 + rank,
            versions={"python": "3.11"},
        ),
        events.StepStarted(**envelope, wall_ns=0, mono_ns=0, step="platform"),
        events.StepStarted(
            **envelope,
            wall_ns=0,
            mono_ns=0,
            step="attention/flashinfer",
            kind=events.StepKind.CANDIDATE,
            depends_on=("platform",),
        ),
        events.StepSucceeded(**envelope, wall_ns=0, mono_ns=0, step="platform", result={"n": 1}),
        events.StepUnavailable(
            **envelope,
            wall_ns=0,
            mono_ns=0,
            step="attention/flashinfer",
            outcome=Outcome.UNAVAILABLE,
            reasons=(PERMISSION_DENIED.reason,),
            cause=PERMISSION_DENIED,
        ),
        events.DecisionMade(**envelope, wall_ns=0, mono_ns=0, name="attention", value="sdpa"),
        events.RunFinished(**envelope, wall_ns=0, mono_ns=0, outcome=RunOutcome.READY),
    ]
    return [
        attrs.evolve(event, seq=seq, wall_ns=wall_ns + 10 * seq, mono_ns=100 * seq)
        for seq, event in enumerate(drafts)
    ]


def numbered(run_id: str, rank: int, count: int) -> list[events.Event]:
    """``count`` distinct ``step.started`` events (``step`` = ``s<i>``), seq unset."""
    return [
        events.StepStarted(run_id=run_id, rank=rank, wall_ns=i, mono_ns=i, step=f"s{i}")
        for i in range(count)
    ]
