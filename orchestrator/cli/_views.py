"""The read-only commands: replay, explain, blame, critical-path, diff, validate.

They read logs (JSON only: nothing in a log is executed or imported) and
print; they never change a log. The only code they load is what the user
names on the command line (``replay --slice``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from events import Event, LogProblem, Replay, RunOutcome, Slice, format_ranks, validate
from events._files import check_writable, write_file
from events._slices import SLICE_FILE_MODULE
from exporters import terminal_text

from .._run_directory import MANIFEST_FILE, RunProblem, check_run_directories, run_id_of
from ._errors import CommandLineError, InputError, UsageError
from ._output import diagnose, emit
from ._run_logs import (
    RunLogs,
    holds_logs,
    holds_runs_text,
    log_files,
    rank_of_file,
    read_run,
    run_directories_in,
)

__all__ = ["given_slices", "run_command"]


def load_slice(spec: str) -> Slice:
    """The :class:`events.Slice` that ``--slice MODULE:NAME`` names.

    ``MODULE`` is a dotted module name on ``sys.path``, or the path of a
    ``.py`` file, which is executed as a module (as ``python FILE`` would,
    but not as ``__main__``); ``NAME`` is a module attribute holding a
    ``Slice``.

    Raises:
        UsageError: the spec is malformed, the module cannot be loaded, or
            the attribute is missing or not a ``Slice``.
    """
    module_name, _, name = spec.rpartition(":")
    if not module_name or not name.isidentifier():
        raise UsageError(f"--slice {spec!r}: expected MODULE:NAME, e.g. my_engine.slices:SLICE")
    path = Path(module_name)
    if module_name.endswith(".py") and not path.is_file():
        raise UsageError(f"--slice {spec}: no such file: {path}")
    try:
        if module_name.endswith(".py"):
            # A file named .py always has a spec, with the source loader.
            loader_spec = importlib.util.spec_from_file_location(
                f"{SLICE_FILE_MODULE}{path.stem}", path
            )
            assert loader_spec is not None
            assert loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[loader_spec.name] = module
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except Exception as exc:
        # A module of the caller's that is not importable here (a run
        # records the import path it was made with) can still be named.
        missing = isinstance(exc, ModuleNotFoundError) and f"{module_name}.".startswith(
            f"{exc.name}."
        )
        where = f"; put its directory on PYTHONPATH, or pass its file: FILE.py:{name}"
        raise UsageError(
            f"--slice {spec}: cannot load {module_name}: {type(exc).__name__}: {exc}"
            + (where if missing else "")
        ) from None
    if not hasattr(module, name):
        raise UsageError(f"--slice {spec}: {module_name} has no attribute {name}")
    value = getattr(module, name)
    if not isinstance(value, Slice):
        raise UsageError(
            f"--slice {spec}: {name} is of type {type(value).__name__}, not events.Slice"
        )
    return value


def _replayed(args: argparse.Namespace, **reading: Any) -> tuple[RunLogs, Replay]:
    """The run of the paths (:func:`read_run` with ``reading``), replayed;
    ``--rank`` must be a rank of it."""
    run = read_run(args.paths, slices=given_slices(args), **reading)
    result = run.replay()
    rank = args.rank
    if rank is not None and rank >= result.world_size and rank not in result.states:
        ranks = "rank 0" if result.world_size == 1 else f"ranks 0-{result.world_size - 1}"
        raise UsageError(f"--rank {rank}: the run has {ranks} (world size {result.world_size})")
    return run, result


def command_replay(args: argparse.Namespace) -> int:
    """Report outcome and root cause first, then state, messages, divergences."""
    export = args.export
    # Output files are checked before anything is printed: a bad destination
    # is one error line, not a report followed by an error.
    trace = None if export is None else export[1]
    if trace is not None:
        check_output(f"--export jaeger-json={trace}", trace, inputs=args.paths)
    if args.html is not None:
        check_output(f"--html {args.html}", args.html, inputs=args.paths)
        if trace is not None and os.path.abspath(trace) == os.path.abspath(args.html):
            raise UsageError(f"--html {args.html}: --export writes that file; name another")
    run, result = _replayed(args, until=args.until, keep_events=export is not None)
    decisions = print_report(args, run, result, rank=args.rank)
    if export is not None:
        # Cut at --until, a rank is running there, however it ended later.
        cut = result if args.until is None else attrs.evolve(result, launch=None)
        _export(export, run.events(), cut)
    if args.html is not None:
        from exporters import report_html

        page = report_html(result, divergences=grouped_decision_divergences(decisions))
        try:
            write_file(args.html, page.encode())
        except OSError as exc:
            raise InputError(f"--html {args.html}: cannot write: {exc.strerror}") from None
    return 0 if result.outcome is RunOutcome.READY else 1


def given_slices(args: argparse.Namespace) -> list[Slice] | None:
    """The slices ``--slice`` names; ``None`` (as recorded) without any."""
    return [load_slice(spec) for spec in args.slices] if args.slices else None


def print_report(
    args: argparse.Namespace,
    run: RunLogs,
    result: Replay,
    *,
    rank: int | None,
    printed_above: str | None = None,
) -> list[Any]:
    """Print the report of ``result``, the replay of ``run`` (``--json``: its
    document, decision divergences added with code ``decision.divergence``),
    to ``--level``, of ``rank`` alone if given; returns the run's decision
    divergences."""
    from exporters import report_json, report_text

    decisions = run.decisions()
    if not args.json:
        emit(report_text(result, min_severity=args.level, rank=rank, printed_above=printed_above))
        if decisions:
            grouped = grouped_decision_divergences(decisions)
            emit(
                "Decision divergences (the current code decides differently than the run did):\n"
                + "\n".join(f"  ERROR {divergence.text}" for divergence in grouped)
            )
        return decisions
    document = report_json(result)
    document["divergences"] += [
        {
            "code": divergence.code,
            "severity": divergence.severity.name.lower(),
            "subject": divergence.subject,
            "rank": divergence.ranks[0],
            "seq": divergence.seq,
            "step": divergence.step,
            "recorded": divergence.recorded,
            "recomputed": divergence.recomputed,
            "text": divergence.text,
        }
        for divergence in decisions
    ]
    if rank is not None:
        document["ranks"] = [r for r in document["ranks"] if r["rank"] == rank]
        document["messages"] = [
            {**m, "ranks": [rank]} for m in document["messages"] if rank in m["ranks"]
        ]
    # What json.dumps(indent=2) writes, in a twentieth of the time: a log
    # holds no NaN or integer past 64 bits for it to differ on.
    emit(orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())
    return decisions


def grouped_decision_divergences(found: list[Any]) -> list[Any]:
    """Decision divergences that differ only in their rank, as one each with
    every such rank (``ranks 0-1023 seq 17 (attention): ...``), in the order
    of their first rank: a decider that changed decides differently on every
    rank of a large launch alike. The JSON report keeps one per rank."""
    groups: dict[tuple[str, ...], list[Any]] = {}
    for divergence in found:
        key = (
            repr(divergence.seq),
            repr(divergence.step),
            divergence.subject,
            divergence.values[0][0],
            repr(divergence.recomputed),
            # A decision's text is "rank N ..." (Divergence.of_decision).
            divergence.text.removeprefix(f"rank {divergence.ranks[0]} "),
        )
        groups.setdefault(key, []).append(divergence)
    grouped = []
    for (*_key, text), members in groups.items():
        # One member is rebuilt as it was: its text is "rank N " and the rest.
        first = members[0]
        ranks = tuple(sorted(rank for member in members for rank in member.ranks))
        values = ((first.values[0][0], ranks),)
        grouped.append(attrs.evolve(first, values=values, text=f"{format_ranks(ranks)} {text}"))
    return grouped


def check_output(
    option: str,
    path: Path,
    error: type[CommandLineError] = InputError,
    *,
    inputs: Sequence[Path] = (),
) -> None:
    """Raises ``error`` when ``path``, where ``option`` writes, cannot be
    written (the exporters would only say that spans were "not
    delivered"), and :class:`UsageError` when it is one of the files read
    from ``inputs`` (a log, or a run directory's log or manifest), before
    anything is written or printed."""
    if _replaces_input(path, inputs):
        raise UsageError(f"{option}: one of the run's logs or its manifest; name another file")
    try:
        check_writable(path)
    except OSError as exc:
        raise error(f"{option}: cannot write: {exc.strerror}") from None


def _replaces_input(path: Path, inputs: Sequence[Path]) -> bool:
    """Whether writing ``path`` would replace a file read from ``inputs`` (a
    log given), or put one where a run directory given (or about to be
    made) keeps its logs and manifest."""
    for given in inputs:
        with contextlib.suppress(OSError):
            if given.is_dir() or not os.path.lexists(given):
                named = path.match("rank-*.jsonl") or path.name == MANIFEST_FILE
                if named and path.parent.resolve() == given.resolve():
                    return True
            # A link there is replaced, not the file it names.
            elif os.path.samestat(path.lstat(), given.stat()):
                return True
    return False


def _export(export: tuple[str, Path | None], events: Iterable[Event], replayed: Replay) -> None:
    from exporters import (
        ExportersError,
        JaegerJsonExporter,
        console_exporter,
        export_events,
        exporter_from_environment,
    )

    kind, path = export
    if kind == "jaeger-json":
        assert path is not None
        exporter: Any = JaegerJsonExporter(path)
    elif kind == "console":
        exporter = console_exporter(sys.stderr)
    else:
        exporter = exporter_from_environment()
        if exporter is None:
            raise UsageError(
                "--export otlp: set OTEL_EXPORTER_OTLP_ENDPOINT (or "
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) to the collector's address"
            )
    try:
        count = export_events(events, exporter, replayed=replayed)
    except ExportersError as exc:
        raise InputError(f"--export {kind}: {exc}") from None
    finally:
        exporter.shutdown()
    diagnose(f"exported {count} spans ({kind}{'' if path is None else ' ' + str(path)})")


def _view(render: str, *, header: bool = False) -> Callable[[argparse.Namespace], int]:
    """The command that prints ``exporters``' view ``render`` of a run."""

    def command(args: argparse.Namespace) -> int:
        import exporters

        _run, result = _replayed(args)
        if header:
            # The run's outcome, what was simulated or injected, and the
            # ranks without events come first, as in the report.
            emit(exporters.report_header(result))
        emit(getattr(exporters, render)(result, rank=args.rank))
        return 0

    return command


def command_diff(args: argparse.Namespace) -> int:
    """What changed between two runs; as diff(1), exit 1 when they differ,
    0 when they do not (2 for bad input)."""
    from exporters import decisions_of, diff_text, report_json, run_differences

    slices = given_slices(args)
    sides = []
    for paths in _diff_sides([args.run_a, args.run_b, *args.more]):
        result = read_run(paths, slices=slices).replay()
        sides.append((report_json(result), decisions_of(result), " ".join(map(str, paths))))
    (a, decisions_a, label_a), (b, decisions_b, label_b) = sides
    both = {"decisions_a": decisions_a, "decisions_b": decisions_b}
    emit(diff_text(a, b, **both, label_a=label_a, label_b=label_b))
    return 1 if run_differences(a, b, **both) else 0


def _diff_sides(paths: list[Path]) -> list[list[Path]]:
    """The two runs ``diff`` compares: two paths are one run each (two
    copies of one run may be compared); more are the directories of two
    multi-node runs, grouped by run id in the order given.

    Raises:
        UsageError: more than two paths that do not hold exactly two runs.
    """
    if len(paths) == 2:
        return [[paths[0]], [paths[1]]]
    runs: dict[str, list[Path]] = {}
    for path in paths:
        if not path.is_dir():
            raise UsageError(
                f"{path}: not a run directory; with more than two paths, diff compares the "
                "run directories of two multi-node runs"
            )
        run_id = run_id_of(path)
        if run_id is None:
            raise UsageError(f"{path}: holds no run (no claim, manifest or event)")
        runs.setdefault(run_id, []).append(path)
    if len(runs) != 2:
        listed = "; ".join(
            f"run {run_id}: {', '.join(str(p) for p in found)}" for run_id, found in runs.items()
        )
        raise UsageError(f"diff compares two runs; the paths hold {len(runs)}: {listed}")
    return list(runs.values())


def command_validate(args: argparse.Namespace) -> int:
    """Every integrity problem of every path, a run directory checked as a
    whole (the directories of one run id together: one per node of a
    multi-node run); goes on over every path and ends with a summary; exit
    1 if there is any problem."""
    # File names and messages come from outside: printed as terminal text.
    for path in args.paths:
        if not path.is_dir():
            log_files(path)  # it exists, and is not a manifest
    # One run at the place of its first directory; one whose run is unknown stands alone.
    runs: dict[object, list[Path]] = {}
    for index, path in enumerate(_expand_run_parents(args.paths)):
        run_id = run_id_of(path) if path.is_dir() else None
        runs.setdefault(run_id or index, []).append(path)

    def show(problem: RunProblem | LogProblem, kind: str) -> None:
        emit(terminal_text(f"{problem} [{kind}, {'error' if problem.fatal else 'warning'}]"))

    files = problems = 0
    for group in runs.values():
        logs, run_problems = check_run_directories(group) if group[0].is_dir() else (group, [])
        for run_problem in run_problems:
            show(run_problem, "run")
        clean: list[Path] = []
        for file in logs:
            found = validate(file)
            for problem in found:
                show(problem, problem.kind)
            if not found:
                clean.append(file)
            problems += len(found)
        files += len(logs)
        problems += len(run_problems)
        for line in _clean_lines(group, clean):
            emit(terminal_text(line))
    emit(f"{len(args.paths)} path(s), {files} file(s), {problems} problem(s)")
    return 1 if problems else 0


def _expand_run_parents(paths: Sequence[Path]) -> list[Path]:
    """The paths, with a directory of run directories (``startup-runs``)
    replaced by the run directories it holds, oldest first; says so."""
    expanded: list[Path] = []
    for path in paths:
        try:
            runs = run_directories_in(path) if path.is_dir() and not holds_logs(path) else []
        except OSError:
            runs = []  # checked as it is: the check names why it cannot be read
        if not runs:
            expanded.append(path)
            continue
        emit(terminal_text(f"{holds_runs_text(path, runs)}; checking each"))
        expanded.extend(reversed(runs))
    return expanded


#: Up to this many clean logs of a run directory are named one per line (a
#: node's worth); more are one line of rank ranges.
_CLEAN_LOGS_NAMED = 8


def _clean_lines(group: list[Path], clean: list[Path]) -> list[str]:
    """What ``validate`` says of the logs without problems of one run (its
    directories, or one file): a clean 1,024-rank run is not 1,024 lines."""
    if len(clean) <= _CLEAN_LOGS_NAMED or not group[0].is_dir():
        return [f"{file}: ok" for file in clean]
    ranks = [rank_of_file(file) for file in clean]
    named = [file for file, rank in zip(clean, ranks, strict=True) if rank is None]
    numbered = [rank for rank in ranks if rank is not None]
    return [
        *(f"{file}: ok" for file in named),
        f"{', '.join(map(str, group))}: {len(numbered)} logs ok, {format_ranks(numbered)}",
    ]


def run_command(args: argparse.Namespace) -> int:
    """Run the read-only command ``args.command`` with Python's cyclic
    garbage collector paused (and resumed after, as it was).

    A large run is hundreds of thousands of events and the states derived
    from them, none of them in a reference cycle; the collector would walk
    them all again each time enough new objects pile up, for nothing (about
    a seventh of a 1,024-rank replay). Memory is freed by reference counting
    all the same.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _COMMANDS[args.command](args)
    finally:
        if enabled:
            gc.enable()


_COMMANDS: Mapping[str, Callable[[argparse.Namespace], int]] = {
    "replay": command_replay,
    "explain": _view("explain_text", header=True),
    "blame": _view("blame_text"),
    "critical-path": _view("critical_path_text"),
    "diff": command_diff,
    "validate": command_validate,
}
