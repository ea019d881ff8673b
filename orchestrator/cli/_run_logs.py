"""Reading the runs the command line is given: run directories (with their
manifest) and log files, read strictly."""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import pickle
import re
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FunctionType
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs

from events import EventsError, LaunchRecord, LogError, RunFinished, RunStarted, merge, read_log
from events._builders import builder, field_names

from .._run_directory import (
    RunDirectoryError,
    list_logs,
    longer_copy,
    no_logs_text,
    read_manifest,
    run_id_of,
)
from ._errors import InputError, UsageError, raised_as
from ._output import diagnose

if TYPE_CHECKING:
    from events import (
        Divergence,
        Event,
        FoldedRank,
        RankFolder,
        Replay,
        Slice,
    )

__all__ = [
    "RankLog",
    "RunLogs",
    "log_files",
    "process_alive",
    "rank_of_file",
    "read_run",
    "recorded_slices",
]


def log_files(path: Path) -> list[Path]:
    """The rank logs of a run directory, or the log file ``path``.

    Raises:
        UsageError: the path does not exist, is a directory of run
            directories (``startup-runs``) rather than a run directory, or
            is a manifest.
        InputError: a directory holds no rank logs.
    """
    if path.is_dir():
        listed = list_logs(path)
        found = [*listed.logs.values(), *listed.odd_logs]
        if not found and not holds_logs(path):
            runs = run_directories_in(path)
            if runs:
                raise UsageError(_name_one_run(path, runs))
            # With a manifest it is a launch whose ranks wrote nothing.
            raise InputError(f"{path}: {no_logs_text(run_id_of(path))}")
        return found
    if path.name == "manifest.json" and path.exists():
        raise UsageError(
            f"{path}: a launch's manifest, not a rank log: name its run directory, {path.parent}"
        )
    if not (path.exists() or path.is_symlink()):
        raise UsageError(f"{path}: no such file or directory")
    return [path]


def run_directories_in(path: Path) -> list[Path]:
    """The run directories directly under ``path`` (those holding rank logs
    or a manifest), newest first."""
    runs: list[tuple[float, str, Path]] = []
    with contextlib.suppress(OSError):  # an unreadable directory holds none
        for child in path.iterdir():
            with contextlib.suppress(OSError):
                if child.is_dir() and holds_logs(child):
                    runs.append((child.stat().st_mtime, child.name, child))
    return [run for _mtime, _name, run in sorted(runs, reverse=True)]


def holds_logs(path: Path) -> bool:
    return (path / "manifest.json").exists() or any(path.glob("rank-*.jsonl"))


#: How many run directories a hint names.
_NAMED_RUNS = 3


def holds_runs_text(path: Path, runs: Sequence[Path]) -> str:
    """``PATH: holds N run directories``, of ``runs`` found in ``path``."""
    held = "1 run directory" if len(runs) == 1 else f"{len(runs)} run directories"
    return f"{path}: holds {held}"


def _name_one_run(path: Path, runs: list[Path]) -> str:
    named = ", ".join(map(str, runs[:_NAMED_RUNS]))
    if len(runs) > _NAMED_RUNS:
        named += f", and {len(runs) - _NAMED_RUNS} more"
    return f"{holds_runs_text(path, runs)}, not a run's logs; name one (newest first): {named}"


def _different_runs(run_of: dict[Path, str]) -> str:
    listed = ", ".join(f"{path} (run {run_id})" for path, run_id in run_of.items())
    text = f"the paths are of different runs: {listed}; a report is of one run"
    if len(run_of) == 2:
        a, b = (shlex.quote(str(path)) for path in run_of)
        text += f"; to compare them: startup-orchestrator diff {a} {b}"
    return text


def _rank_key(path: Path) -> tuple[int, str]:
    rank = rank_of_file(path)
    return (1 << 30, path.stem) if rank is None else (rank, "")


def rank_of_file(path: Path) -> int | None:
    """The rank a file's name says (``rank-3.jsonl`` -> 3), if it says one."""
    named = re.fullmatch(r"rank-(\d+)\.jsonl", path.name)
    return None if named is None else int(named[1])


class RankLog(NamedTuple):
    """One log file that holds events, read and folded on its own (the map
    of a replay).

    Attributes:
        folded: the rank folded.
        ended: whether the whole file ends with ``run.finished``.
        decisions: the recorded decisions that current code decides
            differently, each with when it was made (wall clock, rank, seq).
        events: the events to the cutoff, when asked to keep them; else ().
    """

    folded: FoldedRank
    ended: bool
    decisions: tuple[tuple[int, int, int, Divergence], ...]
    events: tuple[Event, ...]


class RunLogs(NamedTuple):
    """A run as read from the command line's paths, each rank folded.

    Attributes:
        logs: every rank log read (strictly) that holds events, in rank
            order.
        launch: the launcher's facts (its manifest) and the ranks whose log
            holds no event; ``None`` when there is neither.
        slices: the slices the ranks were folded with.
        until: the cutoff they were folded to.
    """

    logs: list[RankLog]
    launch: LaunchRecord | None
    slices: tuple[Slice, ...]
    until: int | None

    def replay(self) -> Replay:
        """The run, judged from its folded ranks (:func:`events.replay`).

        Raises:
            InputError: the logs are not of one run, or do not fit the
                launch record (:class:`events.LogError`).
        """
        from events import replay

        with raised_as(InputError, LogError):
            return replay(
                [log.folded for log in self.logs],
                launch=self.launch,
                until=self.until,
                slices=self.slices,
            )

    def decisions(self) -> list[Divergence]:
        """Recorded decisions that the current deciders would make
        differently (a changed reducer shows up here, never as a silent
        change), in the order they were made (wall-clock time, then rank),
        each rank's recomputed from its own events."""
        found = sorted(
            (item for log in self.logs for item in log.decisions), key=lambda item: item[:3]
        )
        return [divergence for *_key, divergence in found]

    def events(self) -> list[Event]:
        """Every rank's kept events (to the cutoff), merged by time."""
        return list(merge(log.events for log in self.logs))


#: The fewest logs a share of a run holds: a run of fewer than twice as many
#: is folded in this process alone (a worker would cost more than it saves).
_SHARE = 64

#: This process's share of a shared run, against an even share: a worker
#: also writes out what it folded, which costs it more than reading it back
#: costs this process (measured on 2 cores; BENCHMARKS.md). 1.10 since the
#: worker pickles field values (:class:`_FieldsPickler`): at 8,192 ranks
#: its share then ends just before this process's, where 1.15 left this
#: process folding 0.1-0.2 s longer.
_OWN_SHARE = 1.10


def read_run(
    paths: Sequence[Path],
    *,
    slices: Sequence[Slice] | None = None,
    until: int | None = None,
    keep_events: bool = False,
) -> RunLogs:
    """Read run directories (their manifest too) or log files strictly, as
    one run, and fold each rank log on its own (in worker processes, one a
    core, for a large run whose events need not be kept): several
    directories are one run's when they are of one run id (one per node of
    a multi-node run). A rank whose log is in several places is read once:
    the copies must be the same log (identical, or one a prefix of the
    other: the longer is read). Of several manifests, the first is the
    launch record.

    The ranks are folded with ``slices`` to ``until``. Without ``slices``,
    a run the reference engine made (or a log that predates recording
    slices) is folded with the engine's; any other run with the kernel's
    generic meaning only, and a note on stderr names the ``--slice`` it was
    recorded with: code named in a log is never loaded unasked.

    Raises:
        UsageError: a path does not exist, or the paths are of different
            runs (``diff`` compares two).
        InputError: a log is corrupt or unreadable, a manifest is invalid,
            a log's name says another rank than its events, a rank has two
            different logs, or nothing was found to report on.
    """
    # The run each command-line path is of (its manifest's, or its first
    # event's): two paths of different runs are two runs to compare.
    run_of: dict[Path, str] = {}
    launch: LaunchRecord | None = None
    for path in paths:
        if path.is_dir():
            with raised_as(InputError, RunDirectoryError):
                manifest = read_manifest(path)
            if manifest is not None:
                run_of[path] = manifest.run_id
                launch = launch or manifest.to_launch_record(source=str(path / "manifest.json"))
    files = [(path, file) for path in paths for file in log_files(path)]
    only_files = [file for _path, file in files]
    chosen = recorded_slices(_first_started(only_files)) if slices is None else tuple(slices)
    logs = _fold_logs(only_files, chosen, until, keep_events)
    if slices is None:
        lowest = min(
            (log.folded for log in logs if log is not None),
            key=lambda folded: folded.rank,
            default=None,
        )
        recorded = recorded_slices(None if lowest is None else lowest.started, note=True)
        if recorded != chosen:
            # The lowest rank is not in the lowest-named file: fold again.
            chosen = recorded
            logs = _fold_logs(only_files, chosen, until, keep_events)
    # rank -> where its log was read, and what: a rank's log may be in
    # several of the directories of a multi-node run (node 0's collected
    # copy and the node's own), to be read once.
    kept: dict[int, tuple[Path, RankLog]] = {}
    empty: list[int] = []
    for (path, file), read in zip(files, logs, strict=True):
        named = rank_of_file(file)
        if read is None:
            if named is not None:
                empty.append(named)
            continue
        folded = read.folded
        run_id = run_of.setdefault(path, folded.run_id)
        if folded.run_id != run_id:
            raise InputError(
                f"{file}: a log of run {folded.run_id} in {path}, which holds run {run_id}; "
                "a report is of one run: move that log out, or replay it on its own"
            )
        rank = folded.rank
        if named is not None and named != rank:
            raise InputError(
                f"{file}: holds the events of rank {rank}, not of rank {named} (a foreign or "
                "renamed log): rename or move it out; validate lists every problem of the run"
            )
        if rank not in kept:
            kept[rank] = (file, read)
            continue
        first, other = kept[rank]
        if other.folded.run_id != folded.run_id:
            continue  # two paths of two runs: named below
        # Two files hold the rank's log: the longer copy is read.
        try:
            longer = longer_copy(first, file)
        except OSError as exc:
            raise InputError(f"{exc.filename}: cannot read: {exc.strerror or exc}") from None
        if longer is None:
            raise InputError(
                f"rank {rank} has two different logs, {first} and {file} (neither is a copy or "
                "a prefix of the other): they are of different runs, or one was changed; "
                "pass the directories of one run only"
            )
        if longer == file:
            kept[rank] = (file, read)
    if len(set(run_of.values())) > 1:
        in_order = {path: run_of[path] for path in paths if path in run_of}
        raise UsageError(_different_runs(in_order))
    empty = [rank for rank in empty if rank not in kept]
    if not kept and not empty and (launch is None or launch.world_size is None):
        raise InputError(f"{', '.join(str(p) for p in paths)}: the logs hold no events")
    by_rank = [kept[rank][1] for rank in sorted(kept)]
    running = frozenset(_still_running(by_rank, launch))
    if empty or running:
        launch = attrs.evolve(
            launch or LaunchRecord(), empty_logs=frozenset(empty), running=running
        )
    return RunLogs(logs=by_rank, launch=launch, slices=chosen, until=until)


def _first_started(files: Sequence[Path]) -> RunStarted | None:
    """The ``run.started`` of the lowest-named log that holds events."""
    for file in sorted(files, key=_rank_key):
        try:
            events = read_log(file).events
        except EventsError:
            return None  # named when the logs are folded
        if events:
            return events[0] if isinstance(events[0], RunStarted) else None
    return None


def recorded_slices(started: RunStarted | None, *, note: bool = False) -> tuple[Slice, ...]:
    """The slices to fold a run with whose lowest rank's ``run.started`` is
    ``started``: the engine's for a run it made (or one that predates
    recording slices), none for any other (with ``note``, said on stderr)."""
    from ..engine import ENGINE, ENGINE_SLICE

    recorded = None if started is None else started.slices
    if recorded is None or recorded == (ENGINE_SLICE,):
        return (ENGINE,)
    if recorded and note:
        diagnose(
            f"note: recorded with slice{'s' if len(recorded) > 1 else ''} "
            f"{', '.join(recorded)}; "
            f"pass {' '.join('--slice ' + shlex.quote(path) for path in recorded)} "
            "for its columns and messages (shown: the generic ones)"
        )
    return ()


class _Job(NamedTuple):
    folder: RankFolder
    keep_events: bool

    def fold(self, file: Path) -> RankLog | str | None:
        """One log read strictly and folded, its recorded decisions checked
        (``None``: it holds no event); what is wrong with it, in words, if
        it cannot be."""
        from .._decisions import check_decisions
        from ..engine import ENGINE_DECIDERS

        try:
            read = read_log(file)
            if not read.events:
                return None
            folded = self.folder.fold(read)
        except EventsError as exc:
            return str(exc)
        events = read.events
        if folded.until is not None:
            events = tuple(event for event in events if event.seq <= folded.until)
        decisions = tuple(
            (events[d.seq].wall_ns, folded.rank, d.seq, d)
            for d in check_decisions(events, ENGINE_DECIDERS)
            if d.seq is not None
        )
        return RankLog(
            folded=folded,
            ended=isinstance(read.events[-1], RunFinished),
            decisions=decisions,
            events=events if self.keep_events else (),
        )


def _fold_logs(
    files: Sequence[Path], slices: tuple[Slice, ...], until: int | None, keep_events: bool
) -> list[RankLog | None]:
    """Each of ``files`` read and folded (:meth:`_Job.fold`), in order.

    A run of many logs whose events are not kept is shared among the cores:
    this process folds the first share while a forked worker a core folds
    each of the others into a file of its own, read back once this
    process's share is done (events would cost more to send than to fold
    here). A worker that fails in any way leaves its share to this process,
    and a process that runs other threads folds every log itself (a thread
    holding a lock when the process forks would leave the worker stuck).

    Raises:
        InputError: a log is corrupt or unreadable (the first in order).
    """
    from events import RankFolder

    job = _Job(RankFolder(slices, until), keep_events)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    shares = min(cores, len(files) // _SHARE)
    if keep_events or shares < 2 or not hasattr(os, "fork") or threading.active_count() > 1:
        return [_checked(job.fold(file)) for file in files]
    first = int(len(files) / shares * _OWN_SHARE)
    size = -(-(len(files) - first) // (shares - 1))
    here, *there = [files[:first]] + [
        files[start : start + size] for start in range(first, len(files), size)
    ]
    workers: list[_Worker | None] = []
    try:
        for part in there:
            try:
                workers.append(_Worker(job, part))
            except OSError:
                workers.append(None)  # no process or file to be had: folded here
        folded = [_checked(job.fold(file)) for file in here]
        for worker, part in zip(workers, there, strict=True):
            reads = None if worker is None else worker.results()
            folded.extend(_checked(read) for read in (reads or map(job.fold, part)))
        return folded
    finally:
        for worker in workers:
            if worker is not None:
                worker.stop()


class _Worker:
    """A forked process folding a share of a run's logs into a file of its
    own (unnamed, gone once closed), a batch of :data:`_BATCH` at a time.
    It never outlives the process that started it by more than a batch: a
    worker whose parent is gone (killed) stops."""

    _BATCH = 64

    def __init__(self, job: _Job, files: Sequence[Path]) -> None:
        import tempfile

        # Open for as long as the worker: read back, or closed when stopped.
        self.out = tempfile.TemporaryFile()  # noqa: SIM115
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        try:
            self.pid: int | None = os.fork()
        except OSError:
            self.out.close()
            raise
        if self.pid == 0:  # the worker: Ctrl-C is for the process that started it
            status = 1
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                for start in range(0, len(files), self._BATCH):
                    if os.getppid() != parent:
                        break  # no one will read it
                    batch = [job.fold(file) for file in files[start : start + self._BATCH]]
                    _FieldsPickler(self.out, pickle.HIGHEST_PROTOCOL).dump(batch)
                else:
                    self.out.flush()
                    status = 0
            finally:
                os._exit(status)

    def results(self) -> list[RankLog | str | None] | None:
        """What the worker folded, once it has ended; ``None`` if it
        failed."""
        assert self.pid is not None
        _pid, status = os.waitpid(self.pid, 0)
        self.pid = None
        if status != 0:
            return None
        self.out.seek(0)
        found: list[RankLog | str | None] = []
        try:
            while True:
                found.extend(pickle.load(self.out))
        except EOFError:
            return found
        finally:
            self.out.close()

    def stop(self) -> None:
        """Kill the worker if it still runs (this process was interrupted)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.pid = None
        self.out.close()


class _FieldsPickler(pickle.Pickler):
    """Pickles what a worker folded, its frozen attrs instances (events,
    states, timings, messages) as their field values: each is read back by
    its class's builder (:func:`events._builders.builder`, no keyword
    parsing or guarded stores) instead of attrs' ``__setstate__``, which
    stores a dict of its fields one at a time. A third smaller, and quicker
    both ways. Any other object pickles as usual."""

    def reducer_override(self, obj: Any) -> Any:
        cls: type = type(obj)  # type, not type[Any]: functools.cache takes a Hashable
        fields = _fields_of(cls)
        if fields is not None:
            return _builder(cls), fields(obj)
        if cls is FunctionType and obj in _BUILT:
            # A builder, named once per pickle: made again where it is read.
            return _builder, (_BUILT[obj],)
        return NotImplemented


#: Each builder made (:func:`_builder`), with the class it builds.
_BUILT: dict[Callable[..., Any], type[Any]] = {}


@functools.cache
def _builder(cls: type[Any]) -> Callable[..., Any]:
    """The function building a ``cls`` from its field values, in attrs
    order, made once per process."""
    made = builder(cls)
    _BUILT[made] = cls
    return made


@functools.cache
def _fields_of(cls: type[Any]) -> Callable[[Any], tuple[Any, ...]] | None:
    """The tuple of an instance's field values, in attrs order, for a class
    its builder builds as its ``__init__`` would; ``None`` for any other."""
    try:
        names = field_names(cls)
    except TypeError:
        return None
    if len(names) < 2:  # an attrgetter of one field gives its value, not a tuple
        return lambda obj: tuple(getattr(obj, name) for name in names)
    return operator.attrgetter(*names)


def _checked(read: RankLog | str | None) -> RankLog | None:
    if isinstance(read, str):
        raise InputError(read)
    return read


def _still_running(logs: Sequence[RankLog], launch: LaunchRecord | None) -> Iterator[int]:
    """The ranks whose log has no end and whose process runs here now
    (:func:`process_alive`), and no launcher saw it end."""
    processes = launch.processes if launch is not None else {}
    for log in logs:
        first = log.folded.started
        if first is None or log.ended:
            continue
        ended = processes.get(first.rank)
        if (ended is None or not ended.ended) and process_alive(
            first.host, first.pid, first.wall_ns
        ):
            yield first.rank


def process_alive(host: str, pid: int, since_ns: int) -> bool | None:
    """Whether process ``pid`` of ``host`` (a rank's ``run.started``, a
    launcher's manifest) runs now: on this host, a live pid that started no
    later than ``since_ns`` (so a pid used again since is not taken for it).
    ``None`` when that cannot be seen from here: it ran on another host, or
    this system has no ``/proc``."""
    import platform

    if host != platform.node() or not os.path.exists("/proc/self/stat"):
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
        with open("/proc/stat", "rb") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith(b"btime"))
        if fields[0] == b"Z":
            return False  # a zombie: it ended, its parent has not reaped it
        # When it started, to the kernel's clock tick.
        ticks = int(fields[19])
        started_ns = boot * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return False  # it does not run (or this system does not say when it started)
    return started_ns <= since_ns + 1_000_000_000
