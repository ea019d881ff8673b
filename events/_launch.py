"""What is known of a run besides its logs: the launcher's view of it.

A run is judged against its expected ranks (SPEC §6). The logs say most of
it, but not what happened to a rank that wrote nothing, nor how a process
that stopped writing ended. Whoever launched the ranks knows more: the
world size it started, each rank's pid, when it started and how it ended.
:class:`LaunchRecord` carries those facts into :func:`events.replay`, from a
run manifest (the command line's local launcher writes one) or from a
launcher environment; :class:`RankProcess` is one rank's process.

These are plain data: reading a manifest file is the caller's business.
"""

from __future__ import annotations

import hashlib
import signal
from collections.abc import Mapping

import attrs

__all__ = [
    "MAX_WORLD_SIZE",
    "LaunchRecord",
    "RankProcess",
    "derive_trace_id",
    "implausible_world",
    "launch_span_id",
    "signal_name",
]

#: The largest world a run is read as. A log or manifest that claims more
#: (a flipped digit in a 1 KB file) would make every view's cost follow the
#: number, not the logs: it is named instead.
MAX_WORLD_SIZE = 65_536


def implausible_world(world_size: int, source: str, present: int) -> str | None:
    """Why ``world_size``, claimed by ``source``, cannot be the world of a
    run with ``present`` logs; ``None`` when it can."""
    if world_size <= MAX_WORLD_SIZE:
        return None
    logs = "1 log is" if present == 1 else f"{present:,} logs are"
    return (
        f"{source} claims {world_size:,} ranks; {logs} present, and a run of at most "
        f"{MAX_WORLD_SIZE:,} ranks is read (is the file damaged?)"
    )


def derive_trace_id(run_id: str) -> str:
    """The trace id of a run without a launcher ``TRACEPARENT``: derived from
    the run id, so every rank of the launch lands in the same trace."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:32]


def launch_span_id(trace_id: str, run_id: str) -> str:
    """The span id of a launch's own span, the parent of every rank's root
    span in a run of several ranks: derived from the trace and the run, so
    ranks started apart (by torchrun, SLURM or Open MPI) agree on it without
    talking, and a replay rebuilds the span under the same id."""
    return hashlib.sha256(f"launch/{trace_id}/{run_id}".encode()).hexdigest()[:16]


def signal_name(number: int) -> str:
    """The name of signal ``number`` as :attr:`RankProcess.signal` holds it
    (``SIGKILL``); ``"signal 99"`` for a number this platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@attrs.frozen(kw_only=True)
class RankProcess:
    """One rank's process as its launcher saw it.

    Attributes:
        rank: the global rank.
        pid: its process id, once started.
        started_wall_ns: when it was started (``time.time_ns()``).
        ended_wall_ns: when the launcher saw it end; ``None`` while running
            or when the launcher itself stopped first.
        exit_code: its exit status, when it exited.
        signal: the name of the signal that killed it (``SIGKILL``).
        stopped_by_launcher: why the launcher signalled it, when it did
            (``"SIGTERM: rank 2 died"``): such an end is a consequence of
            something else, never a root cause.
        host, node_rank, local_rank: where it ran, when known (a multi-node
            run's collecting rank learns them over the process group).
        not_delivered: why its log did not reach the run directory that
            collected the run's logs (``"did not deliver its log to rank 0
            within 30 s"``), when it did not.
        collected: for a run whose logs one rank collected (see
            ``not_delivered``), whether this rank's log is in that rank's
            run directory; ``None`` for a launcher's record.
        lost: what the launcher knows of a rank that ended without an exit
            status it could read (a Ray actor that died or stopped answering:
            ``"Ray actor 9f3c... on node 1a2b...: ActorDiedError: ..."``);
            ``None`` otherwise.
        observer: who saw it end, when that is not the launcher: the rank
            that started it and watched it (``rank 1, engine core``).
    """

    rank: int = attrs.field(validator=attrs.validators.ge(0))
    pid: int | None = None
    started_wall_ns: int | None = None
    ended_wall_ns: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    stopped_by_launcher: str | None = None
    host: str | None = None
    node_rank: int | None = None
    local_rank: int | None = None
    not_delivered: str | None = None
    collected: bool | None = None
    lost: str | None = None
    observer: str | None = None

    @property
    def ended(self) -> bool:
        """Whether the launcher saw the process end (or lost it)."""
        return self.exit_code is not None or self.signal is not None or self.lost is not None

    def describe(self, *, since_ns: int | None = None) -> str:
        """``"rank 0 (pid 1373) was killed by SIGKILL at +4.1 s"`` and the
        like; times are relative to ``since_ns`` (the launch) when given."""
        known = {"pid": self.pid, "node": self.node_rank, "host": self.host or None}
        where = ", ".join(f"{name} {value}" for name, value in known.items() if value is not None)
        who = f"rank {self.rank}" + (f" ({where})" if where else "")
        if self.not_delivered is not None:
            return f"{who} {self.not_delivered}"
        if self.collected is not None:
            # The collecting rank knows where the log is, not how the
            # process ended.
            return f"{who}: its log is {'' if self.collected else 'not '}in the run directory"
        if self.pid is None:
            return f"{who} was never started: its launcher stopped first"
        return f"{who} {self.how(since_ns=since_ns)}"

    def how(self, *, since_ns: int | None = None) -> str:
        """How it ended: ``was killed by SIGKILL at +4.1 s`` and the like."""
        at = ""
        if self.ended_wall_ns is not None and since_ns is not None:
            at = f" at +{max(0, self.ended_wall_ns - since_ns) / 1e9:.1f} s"
        if self.signal is not None:
            how = f"was killed by {self.signal}{at}"
        elif self.exit_code is not None:
            how = f"exited with code {self.exit_code}{at}"
        elif self.lost is not None:
            how = f"was lost{at}: {self.lost}"
        else:
            how = "had not ended when its launcher stopped"
        if self.stopped_by_launcher:
            how += f" (the launcher sent {self.stopped_by_launcher})"
        return how


@attrs.frozen(kw_only=True)
class LaunchRecord:
    """The launcher's facts about a run, for judging it as a whole.

    Attributes:
        run_id: the run the launcher started (checked against the logs).
        world_size: how many ranks the launch has; ``None`` when unknown
            (the logs' ``run.started`` events say it then).
        started_wall_ns: when the launch began.
        finished_wall_ns: when the launcher saw the last rank end.
        trace_parent: the span the launch's own span is a child of (the
            launcher's ``TRACEPARENT``), when there was one.
        processes: rank -> :class:`RankProcess`.
        empty_logs: ranks whose log file exists but holds no complete event
            (the rank is known by the file's name only).
        source: where the facts come from, for reports (a manifest path).
        running: ranks whose process the reader of the logs saw alive
            (their log has no end, and the process that wrote it runs on the
            reader's host): still running, not dead.
    """

    run_id: str | None = None
    world_size: int | None = None
    started_wall_ns: int | None = None
    finished_wall_ns: int | None = None
    trace_parent: str | None = None
    processes: Mapping[int, RankProcess] = attrs.field(factory=dict)
    empty_logs: frozenset[int] = frozenset()
    source: str | None = None
    running: frozenset[int] = frozenset()

    def ended_wall_ns(self, rank: int) -> int | None:
        """When the launcher (or a watching parent) saw ``rank``'s process
        end, wall-clock ns; ``None`` when it did not see it end."""
        process = self.processes.get(rank)
        return None if process is None else process.ended_wall_ns
