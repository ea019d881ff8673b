"""A launch's trace once its ranks have ended, rebuilt from its run directory.

Every rank sends its own spans live; the launch's own span, the one root of
a run of several ranks, can only be made once the run's outcome and root
cause are known. Whoever holds the whole record at the end (the command
line's launcher, rank 0 of a torchrun, SLURM or Open MPI launch, the Ray
driver) rebuilds the run's trace here and sends that span, and the spans
of ranks that died before they could end them; the launcher's
``--trace-file`` is the same trace, whole. Internal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from events import LogContents, Slice

from ._run_directory import read_run_directory

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from events import Replay
    from exporters import Tracing

__all__ = ["launch_trace", "replay_run_directory", "send_launch_span", "send_launch_span_of"]


def launch_trace(run_dir: Path, *, slices: Sequence[Slice]) -> list[ReadableSpan]:
    """Every span of the run in ``run_dir`` as :func:`exporters.run_trace`
    makes them (the launch's own span first, when the run has several
    ranks), its logs replayed with ``slices``.

    Raises:
        RunDirectoryError: the manifest cannot be read.
        events.EventsError: a log is corrupt or unreadable.
        ValueError: an event's ids are malformed.
    """
    from events import merge
    from exporters import run_trace

    contents, result = replay_run_directory(run_dir, slices=slices)
    return run_trace(merge(contents), result)


def replay_run_directory(
    run_dir: Path, *, slices: Sequence[Slice]
) -> tuple[list[LogContents], Replay]:
    """The logs in ``run_dir`` that hold events, and the run replayed from
    them with ``slices`` (the ranks without one named): see :func:`launch_trace`."""
    from events import read_log, replay

    found = read_run_directory(run_dir)
    logs = {rank: read_log(path) for rank, path in found.logs.items()}
    contents = [log for log in logs.values() if log.events]
    empty = [rank for rank, log in logs.items() if not log.events]
    return contents, replay(contents, slices=slices, launch=found.launch_record(empty))


def send_launch_span(
    tracing: Tracing, spans: Sequence[ReadableSpan], *, ranks_ended: bool = False
) -> bool:
    """Send the launch's own span of a run's trace (:func:`launch_trace`)
    where ``tracing`` sends spans; the ranks have sent theirs. With
    ``ranks_ended`` (every rank's process is known to have ended: the
    launcher's and the Ray driver's view), also the spans of ranks that died
    with steps in flight, rebuilt as ``incomplete``: a span is sent live when
    it ends, so those were never sent.

    Returns:
        Whether they were delivered (``True`` when there are none to send or
        no collector is asked for).
    """

    def wanted(span: ReadableSpan) -> bool:
        attributes = span.attributes or {}
        incomplete = attributes.get("startup.outcome") == "incomplete"
        return attributes.get("startup.kind") == "launch" or (ranks_ended and incomplete)

    return tracing.send([span for span in spans if wanted(span)])


def send_launch_span_of(
    tracing: Tracing, run_dir: Path, *, slices: Sequence[Slice], ranks_ended: bool = False
) -> None:
    """For whoever holds the whole record once the run has ended: the
    launch's own span of the run in ``run_dir`` (:func:`send_launch_span`),
    when anything asks for spans. Best effort: the logs keep everything,
    and ``replay --export`` sends it later."""
    if not tracing.wanted:
        return
    with contextlib.suppress(Exception):
        send_launch_span(tracing, launch_trace(run_dir, slices=slices), ranks_ended=ranks_ended)
