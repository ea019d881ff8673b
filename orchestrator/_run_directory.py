"""The run directory: one run's logs, claimed atomically, and its manifest.

Layout::

    startup-runs/<run-id>/
        .run-id            the run that owns the directory (the claim)
        manifest.json      written by a launcher that starts the ranks itself,
                           or by the rank 0 that collected a multi-node run
        rank-0.jsonl       one JSON Lines log per rank
        rank-1.jsonl
        ...

**One run directory holds one run.** A run claims its directory before it
writes anything (:func:`claim_run_directory`); ranks of the same run join
the claim. Each rank creates its own log exclusively (``O_EXCL``), and a
launcher its manifest, so of two runs started into one directory at the
same moment the loser is refused before its first event.

The **manifest** is the launcher's record of the launch (:class:`Manifest`),
rewritten atomically as the launch goes, so whatever kills the launcher the
manifest on disk is whole. The views read it to tell what the logs cannot:
"rank 0 (pid 1373) was killed by SIGKILL at +4.1 s; its log is empty". A
launch without a launcher of ours (torchrun across nodes) gets its manifest
from its rank 0, which collects the other ranks' logs at the end
(:func:`store_collected_log`); the logs of one run may then lie in several
directories, one per node, checked as one run by
:func:`check_run_directories`.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import platform
import re
import stat
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from events import DecodeError, LaunchRecord, RankProcess, Redactor, format_ranks, implausible_world
from events._codec import decode, structure
from events._files import write_file
from events._reader import COMPRESSED

from ._errors import OrchestratorError

if TYPE_CHECKING:
    from events import Event

    from ._faults import FaultPlan

__all__ = [
    "CLAIM_FILE",
    "MANIFEST_FILE",
    "Collected",
    "LaunchBook",
    "LauncherProcess",
    "Manifest",
    "RunDirectory",
    "RunDirectoryError",
    "RunProblem",
    "check_run_directories",
    "claim_run_directory",
    "list_logs",
    "longer_copy",
    "rank_log_path",
    "read_manifest",
    "read_run_directory",
    "refuse_foreign_rank",
    "refused_by_system",
    "run_id_of",
    "store_collected_log",
]

#: The file whose content is the id of the run that owns the directory.
CLAIM_FILE = ".run-id"
#: The launcher's manifest.
MANIFEST_FILE = "manifest.json"
#: Version of the manifest document.
MANIFEST_VERSION = 1

#: A rank's log; or the log compressed in place (as a bug report's may be),
#: listed where the plain log is missing, so that reading it names it.
_RANK_LOG = re.compile(
    rf"^rank-(\d+)\.jsonl(?:{'|'.join(re.escape(suffix) for _, suffix in COMPRESSED.values())})?$"
)
#: Why a file that is not regular (a FIFO named ``rank-0.jsonl``) was never opened.
_NOT_REGULAR = "is not a regular file; it was not read"


class RunDirectoryError(OrchestratorError):
    """A run directory cannot be used: held by another run, or unwritable.

    Attributes:
        path: the directory (or the file in it) concerned.
        reason: what is wrong and what to do.
        held_by: the run id that holds the directory, when that is the reason.
    """

    def __init__(self, path: Path, reason: str, *, held_by: str | None = None) -> None:
        self.path = path
        self.reason = reason
        self.held_by = held_by
        super().__init__(f"{path}: {reason}")


def rank_log_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"rank-{rank}.jsonl"


def claim_run_directory(run_dir: Path, run_id: str) -> None:
    """Make ``run_dir`` this run's (creating it), or join the claim of the
    same run (another rank of the launch got there first).

    Raises:
        RunDirectoryError: the directory holds another run (``held_by``), or
            holds rank logs of a run that left no claim, or cannot be
            created or written.
    """
    if os.path.lexists(run_dir) and not run_dir.is_dir():  # a dangling link too
        raise RunDirectoryError(
            run_dir, "is not a directory; name a directory (made if missing) with --run-dir"
        )
    then = "; name one that can be made with --run-dir"
    with refused_by_system(run_dir, "cannot create the run directory", then):
        run_dir.mkdir(parents=True, exist_ok=True)
    claim = run_dir / CLAIM_FILE
    holder = _read_claim(claim)
    if holder is None and (stored := _stored_logs(run_dir)):
        # A rank claims before it writes its log: one of the same run may
        # have done both since the claim was read.
        holder = _read_claim(claim)
        if holder is None:
            raise RunDirectoryError(
                run_dir,
                f"already holds the logs of another run ({stored[0]}); "
                "use a new --run-id or --run-dir",
            )
    if holder is None:
        with refused_by_system(run_dir, "cannot write the run directory"):
            created = write_file(claim, f"{run_id}\n".encode(), exclusive=True)
        if created:
            return
        holder = _read_claim(claim)
    if holder != run_id:
        raise RunDirectoryError(
            run_dir,
            f"already holds run {holder}; one run directory holds one run: "
            "use a new --run-id or --run-dir",
            held_by=holder,
        )


def refuse_foreign_rank(run_dir: Path, launcher_pid: int | None) -> None:
    """Refuse a rank that the launch whose manifest ``run_dir`` holds did
    not start (``launcher_pid``: this rank's launcher, ``None`` for none of
    ours). A rank calls it once its own log exists, as a launcher checks
    for logs once its manifest exists: of a run and a launch started into
    one directory at once, at least one sees the other.

    Raises:
        RunDirectoryError: the directory holds another launch's manifest, or
            a manifest that cannot be read.
    """
    manifest = read_manifest(run_dir)
    if manifest is None or (
        manifest.collected_by is None
        and manifest.launcher.pid == launcher_pid
        and manifest.launcher.host == platform.node()
    ):
        return
    raise RunDirectoryError(
        run_dir,
        f"holds the manifest of launch {manifest.run_id} ({manifest.world_size} ranks, "
        f"launcher pid {manifest.launcher.pid} on {manifest.launcher.host}), which did not start "
        "this process; use a new --run-id or --run-dir for a run of its own",
    )


@contextlib.contextmanager
def refused_by_system(path: Path, what: str, then: str = "") -> Iterator[None]:
    """An :class:`OSError` inside, as a :class:`RunDirectoryError` saying ``what`` failed."""
    try:
        yield
    except OSError as exc:
        raise RunDirectoryError(path, f"{what}: {exc.strerror or exc}{then}") from None


def _read_regular(path: Path) -> str | None:
    """``path``'s text, ``None`` when it does not exist; a file that is not
    regular or cannot be read raises :class:`RunDirectoryError`."""
    with refused_by_system(path, "cannot read"):
        try:
            if not stat.S_ISREG(path.stat().st_mode):
                raise RunDirectoryError(path, _NOT_REGULAR)
            return path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None


def _read_claim(claim: Path) -> str | None:
    return (_read_regular(claim) or "").strip() or None


def _stored_logs(run_dir: Path) -> list[str]:
    # Empty or not: a rank of ours creates its log only once it has claimed.
    return sorted(path.name for path in run_dir.glob("rank-*.jsonl"))


# --- the manifest ---------------------------------------------------------------------


def _span_id(_instance: object, _attribute: object, value: str | None) -> None:
    if value is not None and (re.fullmatch("[0-9a-f]{16}", value) is None or not value.strip("0")):
        raise ValueError(f"bad {value!r}: expected 16 lower-case hex digits, not all 0")


def _given(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not value or (isinstance(value, int) and value < 1):
        raise ValueError(f"bad {attribute.name} {value!r}")


@attrs.frozen(kw_only=True)
class LauncherProcess:
    """The process that wrote a manifest (``launcher`` in the file);
    ``trace_parent`` is the span of its ``TRACEPARENT``, the parent of the
    launch's own span."""

    pid: int = 0
    host: str = ""
    started_wall_ns: int = 0
    finished_wall_ns: int | None = None
    trace_parent: str | None = attrs.field(default=None, validator=_span_id)


@attrs.frozen(kw_only=True)
class Manifest:
    """A launcher's record of one launch (``manifest.json``).

    Attributes:
        injected: the injected faults, one canonical spec each.
        ranks: one entry per rank started so far, by rank.
        collected_by: for a manifest written by a rank that collected the
            other ranks' logs over the process group, that rank (the
            launcher is then its process); ``None`` for a launcher's.
    """

    run_id: str = attrs.field(validator=_given)
    command: tuple[str, ...] = ()
    world_size: int = attrs.field(validator=_given)
    simulated: str | None = None
    injected: tuple[str, ...] = ()
    launcher: LauncherProcess
    ranks: tuple[RankProcess, ...] = ()
    collected_by: int | None = None

    @classmethod
    def begin(
        cls,
        *,
        run_id: str,
        world_size: int,
        faults: FaultPlan,
        simulating: object = None,
        caller_span: tuple[str, str] | None = None,
        command: Sequence[str] = (),
        collected_by: int | None = None,
    ) -> Manifest:
        """The manifest of a launch this process starts now: ``simulating``
        is the simulated host, named by a profile's name, a profile file's
        path or a label (``None``: the real host); ``caller_span`` is the
        launcher's ``TRACEPARENT`` as ``(trace id, span id)``."""
        # A path first: a pathlib.Path has a ``name`` too, its last part.
        if isinstance(simulating, str | os.PathLike):
            simulated: str | None = os.fspath(simulating)
        else:
            name = getattr(simulating, "name", None)
            simulated = name if isinstance(name, str) else None
        return cls(
            run_id=run_id,
            command=tuple(command),
            world_size=world_size,
            simulated=simulated,
            injected=tuple(fault.describe() for fault in faults.faults),
            launcher=LauncherProcess(
                pid=os.getpid(),
                host=platform.node(),
                started_wall_ns=time.time_ns(),
                trace_parent=None if caller_span is None else caller_span[1],
            ),
            collected_by=collected_by,
        )

    def to_json(self) -> dict[str, Any]:
        """The manifest document (the fields added since version 1 only
        when set), its command line and injected faults redacted as every
        recorded text is."""
        redact = Redactor.from_environment()
        return {
            "manifest_version": MANIFEST_VERSION,
            **attrs.asdict(
                attrs.evolve(
                    self,
                    command=tuple(redact(part) for part in self.command),
                    injected=tuple(redact(fault) for fault in self.injected),
                ),
                filter=lambda field, value: value is not None or field.name not in _OPTIONAL,
            ),
        }

    @classmethod
    def from_json(cls, data: object, *, source: str = MANIFEST_FILE) -> Manifest:
        """Read a manifest document, strictly.

        Raises:
            RunDirectoryError: not a manifest of a version this release reads.
        """
        document = dict(data) if isinstance(data, dict) else {}
        version = document.pop("manifest_version", None)
        try:
            if version != MANIFEST_VERSION:
                raise ValueError(
                    f"manifest_version {version!r}; this release reads {MANIFEST_VERSION}"
                )
            return structure(cls, document)
        except (DecodeError, ValueError) as exc:
            raise RunDirectoryError(Path(source), f"not a valid manifest ({exc})") from None

    def with_rank(self, entry: RankProcess) -> Manifest:
        others = [rank for rank in self.ranks if rank.rank != entry.rank]
        return attrs.evolve(self, ranks=tuple(sorted([*others, entry], key=lambda r: r.rank)))

    def rank(self, rank: int) -> RankProcess | None:
        return next((entry for entry in self.ranks if entry.rank == rank), None)

    def to_launch_record(self, source: str | None = None) -> LaunchRecord:
        return LaunchRecord(
            run_id=self.run_id,
            world_size=self.world_size,
            started_wall_ns=self.launcher.started_wall_ns,
            finished_wall_ns=self.launcher.finished_wall_ns,
            trace_parent=self.launcher.trace_parent,
            processes={entry.rank: entry for entry in self.ranks},
            source=source,
        )

    def write(self, run_dir: Path, *, exclusive: bool = False) -> None:
        """Write ``manifest.json`` atomically; with ``exclusive`` it must
        not exist yet.

        Raises:
            RunDirectoryError: ``exclusive`` and another launch wrote one, or
                the directory is not writable.
        """
        path = run_dir / MANIFEST_FILE
        content = (json.dumps(self.to_json(), indent=2) + "\n").encode()
        with refused_by_system(run_dir, "cannot write the manifest"):
            written = write_file(path, content, exclusive=exclusive)
        if not written:
            raise RunDirectoryError(
                run_dir,
                "another launch is already writing to this run directory "
                "(it has a manifest); use a new --run-id or --run-dir",
            )


@attrs.define
class LaunchBook:
    """A launch's record as it goes, kept by whatever starts the ranks (the
    command line's launcher, the Ray driver): its manifest, created with the
    claim of the run directory, written again whole as ranks start and end.

    A write that fails (a full disk) does not stop the launch (the ranks'
    logs hold the run): the first failure is kept in :attr:`unwritten`, for
    the launcher to raise once its ranks have ended.
    """

    run_dir: Path
    manifest: Manifest
    unwritten: RunDirectoryError | None = None

    @classmethod
    def claim(cls, run_dir: Path, manifest: Manifest) -> LaunchBook:
        """Claim ``run_dir`` and create the manifest exclusively, before any
        rank starts, so that a second launch into the directory stops having
        written nothing; then look for logs, as a rank looks for a manifest
        once its log exists (:func:`refuse_foreign_rank`).

        Raises:
            RunDirectoryError: the directory holds another run, another
                launch, or logs of a run this launch did not start.
        """
        claim_run_directory(run_dir, manifest.run_id)
        manifest.write(run_dir, exclusive=True)
        if present := _stored_logs(run_dir):
            (run_dir / MANIFEST_FILE).unlink(missing_ok=True)
            shown = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
            raise RunDirectoryError(
                run_dir,
                f"already holds {shown} of run {manifest.run_id} started without this "
                "launch; use a new --run-id or --run-dir",
            )
        return cls(run_dir, manifest)

    def record(self, *entries: RankProcess) -> None:
        for entry in entries:
            self.manifest = self.manifest.with_rank(entry)
        self._write()

    def ended(self, rank: int, **how: Any) -> None:
        """``rank`` ended now, as ``how`` (fields of its :class:`~events.RankProcess`) says."""
        entry = self.manifest.rank(rank) or RankProcess(rank=rank)
        self.record(attrs.evolve(entry, ended_wall_ns=time.time_ns(), **how))

    def finish(self, *, not_started: str | None = None) -> None:
        """The launch ended now; with ``not_started``, why every rank
        without an entry was not started."""
        manifest = self.manifest
        if not_started is not None:
            for rank in range(manifest.world_size):
                if manifest.rank(rank) is None:
                    manifest = manifest.with_rank(
                        RankProcess(rank=rank, stopped_by_launcher=not_started)
                    )
        launcher = attrs.evolve(manifest.launcher, finished_wall_ns=time.time_ns())
        self.manifest = attrs.evolve(manifest, launcher=launcher)
        self._write()

    def _write(self) -> None:
        try:
            self.manifest.write(self.run_dir)
        except RunDirectoryError as exc:
            self.unwritten = self.unwritten or exc


#: Fields of the manifest, its launcher and its rank entries written only
#: when set (added after version 1 was first released; older readers ignore
#: them, this one defaults them). No field of these names is otherwise ``None``.
_OPTIONAL = frozenset(
    {"trace_parent", "collected_by", "host", "node_rank", "local_rank"}
    | {"not_delivered", "collected", "lost", "observer"}
)


def read_manifest(run_dir: Path) -> Manifest | None:
    """The manifest of ``run_dir``, or ``None`` when it has none.

    Raises:
        RunDirectoryError: the manifest is not a regular file, is unreadable
            or is not valid.
    """
    path = run_dir / MANIFEST_FILE
    try:
        text = _read_regular(path)
        if text is None:
            return None
        data = json.loads(text)
    except ValueError as exc:  # not UTF-8, or not JSON
        raise RunDirectoryError(path, f"cannot read: {exc}") from None
    return Manifest.from_json(data, source=str(path))


# --- reading a run directory ------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RunDirectory:
    """What a run directory holds, found without reading any log:
    ``odd_logs`` are files named ``rank-*.jsonl`` whose name is not a rank,
    ``claim`` the run id in ``.run-id``."""

    path: Path
    logs: Mapping[int, Path]
    odd_logs: tuple[Path, ...] = ()
    manifest: Manifest | None = None
    claim: str | None = None

    def launch_record(self, empty_logs: Sequence[int] = ()) -> LaunchRecord | None:
        """The launch facts for :func:`events.replay`: the manifest's, and
        the ranks whose log holds no event."""
        if self.manifest is None and not empty_logs:
            return None
        base = (
            self.manifest.to_launch_record(source=str(self.path / MANIFEST_FILE))
            if self.manifest is not None
            else LaunchRecord(run_id=self.claim)
        )
        return attrs.evolve(base, empty_logs=frozenset(empty_logs))


def read_run_directory(run_dir: Path) -> RunDirectory:
    """List a run directory's logs and read its manifest and claim.

    Raises:
        RunDirectoryError: the manifest is unreadable or invalid.
    """
    return attrs.evolve(list_logs(run_dir), manifest=read_manifest(run_dir))


def list_logs(run_dir: Path) -> RunDirectory:
    """The directory's logs and claim, without its manifest."""
    logs: dict[int, Path] = {}
    odd: list[Path] = []
    # In name order: a plain log before its compressed copy.
    for path in sorted(run_dir.glob("rank-*.jsonl*")):
        match = _RANK_LOG.match(path.name)
        if match is None or str(int(match[1])) != match[1]:
            if path.suffix == ".jsonl":
                odd.append(path)
        else:
            logs.setdefault(int(match[1]), path)
    claim = None
    with contextlib.suppress(RunDirectoryError):
        claim = _read_claim(run_dir / CLAIM_FILE)
    return RunDirectory(
        path=run_dir, logs=dict(sorted(logs.items())), odd_logs=tuple(odd), claim=claim
    )


# --- checking a run directory as a whole -------------------------------------------------


@attrs.frozen(kw_only=True)
class RunProblem:
    """A problem of a run directory as a whole (not of one log's lines).

    Attributes:
        path: the directory or file concerned.
        message: what is wrong.
        fatal: whether the run cannot be read as one (a foreign or duplicate
            rank, a run id that differs); a missing rank is not fatal: the
            run reads, and is ``incomplete``.
    """

    path: Path
    message: str
    fatal: bool = True

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def check_run_directories(run_dirs: Sequence[Path]) -> tuple[list[Path], list[RunProblem]]:
    """Check run directories (one, or one per node) as one run: one run id
    across logs, claims and manifests, no duplicate or foreign ranks, one
    world size, every rank of it with a non-empty log. A rank's copies in
    several directories are one log when one is a prefix of the other
    (:func:`longer_copy`); files that are not regular are problems, never
    opened.

    Returns:
        The regular log files, in rank order, and the run's problems.
    """
    from events import RunStarted

    problems: list[RunProblem] = []
    where = run_dirs[0] if len(run_dirs) == 1 else Path(", ".join(str(d) for d in run_dirs))

    def name(path: Path) -> str:  # with its directory when there are several
        return str(path) if len(run_dirs) > 1 else path.name

    def problem(message: str, path: Path = where, *, fatal: bool = True) -> None:
        problems.append(RunProblem(path=path, message=message, fatal=fatal))

    # ``value (the files that say it)``, in a problem of values that differ
    def said(value: object, paths: Iterable[Path]) -> str:
        return f"{value} ({', '.join(map(name, paths))})"

    listed: list[RunDirectory] = []
    for run_dir in run_dirs:
        found = list_logs(run_dir)
        try:
            found = attrs.evolve(found, manifest=read_manifest(run_dir))
        except RunDirectoryError as exc:
            problem(exc.reason, exc.path)
        listed.append(found)
        for odd in found.odd_logs:
            problem("not a rank log name (rank-<N>.jsonl); ignored", odd)
    logs: dict[int, Path] = {}
    for found in listed:
        for rank, path in found.logs.items():
            kept = logs.setdefault(rank, path)
            if kept is path:
                continue
            # Comparing copies reads them: only regular files (a FIFO would
            # block), each reported below or here.
            if not _regular(path):
                problem(_NOT_REGULAR, path)
                continue
            if not _regular(kept):
                problem(_NOT_REGULAR, kept)
                logs[rank] = path
                continue
            try:
                longer = longer_copy(kept, path)
            except OSError as exc:
                problem(f"cannot read: {exc.strerror}", path)
                continue
            if longer is None:
                problem(
                    f"rank {rank} has two different logs, {kept} and {path} (neither is a "
                    "copy or a prefix of the other): they are of different runs or one was "
                    "changed; keep the directories of one run only",
                    path,
                )
            else:
                logs[rank] = longer
    manifests = [(found.path, found.manifest) for found in listed if found.manifest is not None]
    claims = [(found.path, found.claim) for found in listed if found.claim is not None]
    files: list[Path] = []
    run_ids: dict[str, list[Path]] = {}
    worlds: dict[int, list[Path]] = {}
    holders: dict[int, list[Path]] = {}
    # The processes of a recorded engine start (each names its role) join
    # the run as they are started, each knowing the world so far: their
    # world sizes differ by design, and the run's is the largest.
    joined = True
    for rank, path in sorted(logs.items()):
        try:
            if not stat.S_ISREG(path.stat().st_mode):
                problem(_NOT_REGULAR, path)
                continue
            files.append(path)
            first = _first_event(path)
        except OSError as exc:
            problem(f"cannot read: {exc.strerror}", path)
            continue
        except DecodeError:
            continue  # the line-by-line check reports it
        if first is None:
            problem(
                f"rank {rank} wrote no events (empty log): never started, "
                "or killed before its first event",
                path,
                fatal=False,
            )
            continue
        run_ids.setdefault(first.run_id, []).append(path)
        holders.setdefault(first.rank, []).append(path)
        if first.rank != rank:
            problem(
                f"holds the events of rank {first.rank}, not of rank {rank} "
                "(a foreign or renamed log)",
                path,
            )
        if isinstance(first, RunStarted):
            worlds.setdefault(first.identity.world_size, []).append(path)
            joined = joined and first.identity.role is not None
    for rank, paths in sorted(holders.items()):
        if len(paths) > 1:
            problem(f"{len(paths)} logs hold rank {rank}: {', '.join(p.name for p in paths)}")
    ids = [*run_ids.items(), *((claim, [d / CLAIM_FILE]) for d, claim in claims)]
    ids += [(m.run_id, [d / MANIFEST_FILE]) for d, m in manifests]
    if len({run_id for run_id, _ in ids}) > 1:
        problem(f"more than one run id: {'; '.join(said(*found) for found in ids)}")
    sizes = [*worlds.items(), *((m.world_size, [d / MANIFEST_FILE]) for d, m in manifests)]
    world_sizes = {size for size, _ in sizes}
    if len(world_sizes) > 1 and not (joined and worlds and not manifests):
        problem(f"the world sizes differ: {'; '.join(said(*found) for found in sizes)}")
    world = max(world_sizes, default=0)
    claimant = next((d / MANIFEST_FILE for d, m in manifests if m.world_size == world), None)
    why = implausible_world(world, name(claimant or worlds[world][0]) if world else "", len(logs))
    if why is not None:
        problem(why)
        world = 0  # its missing ranks are not listed

    def no_log(ranks: list[int], more: str = "") -> None:
        has = "has" if len(ranks) == 1 else "have"
        problem(
            f"{format_ranks(ranks)} of world size {world} {has} no log "
            f"(never started, or killed before its first event){more}",
            fatal=False,
        )

    # The ranks without a log that nothing more is known of are one problem,
    # as rank ranges: a lost node of a large launch is one line, not one per
    # rank. A rank whose launcher says more of it keeps a line of its own.
    silent: list[int] = []
    for rank in range(world):
        if rank in logs:
            continue
        entries = (manifest.rank(rank) for _, manifest in manifests)
        more = next((f"; {e.describe()}" for e in entries if e and e.not_delivered), "")
        if more:
            no_log([rank], more)
        else:
            silent.append(rank)
    if silent:
        no_log(silent)
    for rank in logs:
        if world and rank >= world:
            problem(f"rank {rank} is outside the world size {world}", logs[rank])
    if not logs and not problems:
        problem(no_logs_text(next((found.claim for found in listed if found.claim), None)))
    return files, problems


def no_logs_text(claim: str | None) -> str:
    """What a run directory without rank logs or manifest is, said for its
    ``claim`` (the run id in ``.run-id``, if any): a launch claims the
    directory, then writes the manifest, then starts ranks, so a claim alone
    is a launch stopped in between."""
    if claim is None:
        return "no rank-*.jsonl logs in this directory"
    return (
        f"no rank-*.jsonl logs or manifest, only the claim of run {claim}: "
        "its launch was stopped before it started a rank"
    )


def run_id_of(run_dir: Path) -> str | None:
    """The run a directory holds, as far as a glance tells: its claim, else
    its manifest's, else its first log's first event."""
    found = list_logs(run_dir)
    if found.claim is not None:
        return found.claim
    with contextlib.suppress(RunDirectoryError):
        manifest = read_manifest(run_dir)
        if manifest is not None:
            return manifest.run_id
    for path in found.logs.values():
        with contextlib.suppress(OSError, DecodeError):
            first = _first_event(path) if _regular(path) else None
            if first is not None:
                return first.run_id
    return None


def _first_event(path: Path) -> Event | None:
    """A log's first event (``None``: it has no complete line, it holds no event).

    Raises:
        OSError: it cannot be read.
        DecodeError: its first line is not an event.
    """
    with path.open("rb") as file:
        line = file.readline()
    return decode(line.rstrip(b"\n")) if line.endswith(b"\n") else None


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False


# --- one rank's log in several places ----------------------------------------------------


def longer_copy(a: Path, b: Path) -> Path | None:
    """Of two copies of a rank's log, the one to read: the longer when one
    is a prefix of the other (``a`` when identical), ``None`` when they differ.

    Raises:
        OSError: a file cannot be read.
    """
    if a.samefile(b):
        return a
    first, second = a.read_bytes(), b.read_bytes()
    if second.startswith(first):
        return b if len(second) > len(first) else a
    if first.startswith(second):
        return a
    return None


class Collected(enum.StrEnum):
    """What :func:`store_collected_log` did with a rank's log."""

    WRITTEN = "written"
    #: The same log, or a longer one, was there (a shared filesystem).
    PRESENT = "present"
    #: A prefix of it was there: replaced by the whole log, atomically.
    EXTENDED = "extended"
    #: A different log of the rank is there: kept, nothing written.
    CONFLICT = "conflict"


def store_collected_log(run_dir: Path, rank: int, content: bytes) -> Collected:
    """Put ``content`` (rank ``rank``'s whole log, received over the
    process group or from its Ray actor) into ``run_dir``, unless it
    already has it; never half written, never over a different log.

    Raises:
        RunDirectoryError: the directory cannot be written or read.
    """
    path = rank_log_path(run_dir, rank)
    with refused_by_system(run_dir, f"cannot store the log of rank {rank}"):
        if write_file(path, content, exclusive=True):
            return Collected.WRITTEN
        present = path.read_bytes()
        if present.startswith(content):
            return Collected.PRESENT
        if not content.startswith(present):
            return Collected.CONFLICT
        write_file(path, content)
        return Collected.EXTENDED
