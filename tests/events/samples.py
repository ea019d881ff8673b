"""Small, realistic event streams for the log and reducer tests."""

from __future__ import annotations

import attrs
import orjson

import events
from events import Outcome, StepKind
from events.testing import EventStream, exception_info

PERMISSION_DENIED = exception_info(
    "PermissionError",
    "[Errno 13] Permission denied: '/root/.cache/flashinfer'",
    errno=13,
    strerror="Permission denied",
    filename="/root/.cache/flashinfer",
)


def rank_stream(
    run_id: str = "run-1", rank: int = 0, *, wall_ns: int = 1_000
) -> list[events.Event]:
    """A whole rank's startup, ``seq`` 0..6: two steps, one unavailable.

    Wall-clock times are ``wall_ns + 10 * seq``; monotonic times are
    ``100 * seq``, running ten times as fast, so a test can tell which clock
    a duration came from.
    """
    stream = EventStream(
        run_id=run_id, rank=rank, world_size=max(3, rank + 1), wall_ns=wall_ns, tick_ns=10
    )
    stream.run_started(host="node-a", pid=100 + rank, versions={"python": "3.11"})
    stream.started("platform")
    stream.started("attention/flashinfer", kind=StepKind.CANDIDATE, depends_on=("platform",))
    stream.succeeded("platform", {"n": 1})
    stream.unavailable("attention/flashinfer", Outcome.UNAVAILABLE, cause=PERMISSION_DENIED)
    stream.decision("attention", "sdpa")
    return [attrs.evolve(event, mono_ns=100 * event.seq) for event in stream.run_finished()]


def numbered(run_id: str, rank: int, count: int) -> list[events.Event]:
    """``count`` distinct ``step.started`` events (``step`` = ``s<i>``), seq
    unset, as a log's ``append`` takes them."""
    return [
        events.StepStarted(run_id=run_id, rank=rank, wall_ns=i, mono_ns=i, step=f"s{i}")
        for i in range(count)
    ]


def foreign_chain(depth: int) -> bytes:
    """The JSON of an exception record ``depth`` links deep along ``cause``
    (``link 0`` innermost), as another program may write it: deeper than
    orjson writes, so built as text."""

    def link(index: int) -> bytes:
        message = f"link {index}"
        return orjson.dumps(
            {"type": "RuntimeError", "message": message, "reason": f"RuntimeError: {message}"}
        )[:-1]

    opening = b"".join(link(index) + b',"cause":' for index in range(depth - 1, 0, -1))
    return opening + link(0) + b"}" * depth


def with_foreign_cause(line: bytes, cause: bytes) -> bytes:
    """A log line whose ``cause`` is replaced by the JSON ``cause``."""
    record = orjson.loads(line)
    return orjson.dumps(record).replace(orjson.dumps(record["cause"]), cause) + b"\n"
