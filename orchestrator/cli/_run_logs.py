"""Reading the runs the command line is given: run directories (with their
manifest) and log files, read strictly."""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from events import EventsError

from ._errors import InputError, UsageError

if TYPE_CHECKING:
    from events import LaunchRecord, LogContents

__all__ = ["DEFAULT_RUNS", "RunLogs", "log_files", "rank_of_file", "read_run"]

#: Where ``run`` puts its run directories unless told otherwise.
DEFAULT_RUNS = Path("startup-runs")


def log_files(paths: Sequence[Path]) -> list[Path]:
    """Expand run directories into their rank logs.

    Raises:
        UsageError: a path does not exist, or is a directory of run
            directories (``startup-runs``) rather than a run directory.
        InputError: a directory holds no rank logs.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("rank-*.jsonl"), key=_rank_key)
            if not found and not (path / "manifest.json").exists():
                runs = run_directories_in(path)
                if runs:
                    raise UsageError(_name_one_run(path, runs))
                # With a manifest it is a launch whose ranks wrote nothing.
                raise InputError(f"{path}: no rank-*.jsonl logs in this directory")
            files.extend(found)
        elif path.exists() or path.is_symlink():
            files.append(path)
        else:
            raise UsageError(f"{path}: no such file or directory")
    return files


def run_directories_in(path: Path) -> list[Path]:
    """The run directories directly under ``path`` (those holding rank logs
    or a manifest), newest first."""
    runs: list[tuple[float, str, Path]] = []
    try:
        children = list(path.iterdir())
    except OSError:
        return []
    for child in children:
        try:
            if not child.is_dir():
                continue
            if (child / "manifest.json").exists() or next(child.glob("rank-*.jsonl"), None):
                runs.append((child.stat().st_mtime, child.name, child))
        except OSError:
            continue
    return [run for _mtime, _name, run in sorted(runs, reverse=True)]


#: How many run directories a hint names.
_NAMED_RUNS = 3


def _name_one_run(path: Path, runs: list[Path]) -> str:
    named = ", ".join(str(run) for run in runs[:_NAMED_RUNS])
    more = f", and {len(runs) - _NAMED_RUNS} more" if len(runs) > _NAMED_RUNS else ""
    held = "1 run directory" if len(runs) == 1 else f"{len(runs)} run directories"
    return f"{path}: holds {held}, not a run's logs; name one (newest first): {named}{more}"


def _different_runs(run_of: dict[Path, str]) -> str:
    listed = ", ".join(f"{path} (run {run_id})" for path, run_id in run_of.items())
    text = f"the paths are of different runs: {listed}; a report is of one run"
    if len(run_of) == 2:
        a, b = (shlex.quote(str(path)) for path in run_of)
        text += f"; to compare them: startup-orchestrator diff {a} {b}"
    return text


def _same_log(kept: Path, found: Path, rank: int) -> Path:
    """Of two files holding ``rank``'s log, the one to read (see
    :func:`orchestrator._run_directory.longer_copy`).

    Raises:
        InputError: they are two different logs, or one cannot be read.
    """
    from .._run_directory import longer_copy

    try:
        longer = longer_copy(kept, found)
    except OSError as exc:
        raise InputError(f"{exc.filename}: cannot read: {exc.strerror or exc}") from None
    if longer is None:
        raise InputError(
            f"rank {rank} has two different logs, {kept} and {found} (neither is a copy or a "
            "prefix of the other): they are of different runs, or one was changed; "
            "pass the directories of one run only"
        )
    return longer


def _rank_key(path: Path) -> tuple[int, str]:
    stem = path.stem.removeprefix("rank-")
    return (int(stem), "") if stem.isdigit() else (1 << 30, stem)


def rank_of_file(path: Path) -> int | None:
    """The rank a file's name says (``rank-3.jsonl`` -> 3), if it says one."""
    stem = path.name.removesuffix(".jsonl").removeprefix("rank-")
    if path.name.startswith("rank-") and path.name.endswith(".jsonl") and stem.isdigit():
        return int(stem)
    return None


class RunLogs(NamedTuple):
    """A run as read from the command line's paths.

    Attributes:
        contents: every rank log read (strictly), in rank order.
        launch: the launcher's facts (its manifest) and the ranks whose log
            holds no event; ``None`` when there is neither.
    """

    contents: list[LogContents]
    launch: LaunchRecord | None


def read_run(paths: Sequence[Path]) -> RunLogs:
    """Read run directories (their manifest too) or log files strictly, as
    one run: several directories are one run's when they are of one run id
    (one per node of a multi-node run). A rank whose log is in several
    places is read once: the copies must be the same log (identical, or one
    a prefix of the other: the longer is read). Of several manifests, the
    first is the launch record.

    Raises:
        UsageError: a path does not exist, or the paths are of different
            runs (``diff`` compares two).
        InputError: a log is corrupt or unreadable, a manifest is invalid,
            a log's name says another rank than its events, a rank has two
            different logs, or nothing was found to report on.
    """
    from events import read_log

    from .._run_directory import RunDirectoryError, read_manifest

    contents: list[LogContents] = []
    empty: list[int] = []
    manifests = []
    for path in paths:
        if path.is_dir():
            try:
                manifest = read_manifest(path)
            except RunDirectoryError as exc:
                raise InputError(str(exc)) from None
            if manifest is not None:
                manifests.append((path, manifest))
    # The run each command-line path is of (its manifest's, or its first
    # event's): two paths of different runs are two runs to compare.
    run_of: dict[Path, str] = {path: manifest.run_id for path, manifest in manifests}
    # rank -> where its log was read: a rank's log may be in several of the
    # directories of a multi-node run (node 0's collected copy and the
    # node's own), to be read once.
    read_from: dict[int, tuple[Path, int]] = {}
    for path in paths:
        for file in log_files([path]):
            try:
                read = read_log(file)
            except EventsError as exc:
                raise InputError(str(exc)) from exc
            if read.events:
                run_id = run_of.setdefault(path, read.events[0].run_id)
                if read.events[0].run_id != run_id:
                    raise InputError(
                        f"{file}: a log of run {read.events[0].run_id} in {path}, which holds "
                        f"run {run_id}; a report is of one run: move that log out, or replay "
                        "it on its own"
                    )
                rank = read.events[0].rank
                named = rank_of_file(file)
                if named is not None and named != rank:
                    raise InputError(
                        f"{file}: holds the events of rank {rank}, not of rank {named} (a "
                        "foreign or renamed log): rename or move it out; validate lists every "
                        "problem of the run"
                    )
                if rank not in read_from:
                    read_from[rank] = (file, len(contents))
                    contents.append(read)
                    continue
                kept, index = read_from[rank]
                if read.events[0].run_id != contents[index].events[0].run_id:
                    continue  # two paths of two runs: named below
                longer = _same_log(kept, file, rank)
                if longer == file:
                    read_from[rank] = (file, index)
                    contents[index] = read
                continue
            named = rank_of_file(file)
            if named is not None:
                empty.append(named)
    if len(set(run_of.values())) > 1:
        in_order = {path: run_of[path] for path in paths if path in run_of}
        raise UsageError(_different_runs(in_order))
    empty = [rank for rank in empty if rank not in read_from]
    launch = None
    if manifests:
        path, manifest = manifests[0]
        launch = manifest.to_launch_record(source=str(path / "manifest.json"))
    if empty:
        import attrs

        from events import LaunchRecord

        launch = attrs.evolve(launch or LaunchRecord(), empty_logs=frozenset(empty))
    if not contents and not empty and (launch is None or launch.world_size is None):
        raise InputError(f"{', '.join(str(p) for p in paths)}: the logs hold no events")
    running = frozenset(_still_running(contents, launch))
    if running:
        import attrs

        from events import LaunchRecord

        launch = attrs.evolve(launch or LaunchRecord(), running=running)
    return RunLogs(contents=contents, launch=launch)


def _still_running(contents: Sequence[LogContents], launch: LaunchRecord | None) -> Iterator[int]:
    """The ranks whose log has no end and whose process runs here now: the
    log's ``run.started`` names this host and a live pid that started no
    later than the log did (so a pid used again since is not taken for it),
    and no launcher saw it end."""
    import platform

    from events import RunFinished, RunStarted

    host = platform.node()
    processes = launch.processes if launch is not None else {}
    for read in contents:
        first, last = read.events[0], read.events[-1]
        if not isinstance(first, RunStarted) or isinstance(last, RunFinished):
            continue
        ended = processes.get(first.rank)
        if first.host != host or (ended is not None and ended.ended):
            continue
        started_ns = _process_started_ns(first.pid)
        if started_ns is not None and started_ns <= first.wall_ns + 1_000_000_000:
            yield first.rank


def _process_started_ns(pid: int) -> int | None:
    """When process ``pid`` started (wall clock, to the kernel's clock tick),
    ``None`` if it does not run (or this system does not say)."""
    import os

    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        with open("/proc/stat", "rb") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith(b"btime"))
        if fields[0] == b"Z":
            return None  # a zombie: it ended, its parent has not reaped it
        ticks = int(fields[19])
        return boot * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
