"""The command line's arguments: every subcommand, its options and their
checks (a bad value is one error line and exit 2, before anything runs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from events import Severity

from ._output import PROG

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not usage plus a message: scripts and humans both read it.
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")


def _integer_at_least(minimum: int, expected: str) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


#: What the run-level commands' help says about their exit status.
_OUTCOMES_EPILOG = (
    "exit status: 0 ready; 1 failed (a probe error propagated, a SystemExit "
    "included), interrupted (SIGINT/SIGTERM, or a KeyboardInterrupt from a probe) or "
    "incomplete (a rank of the world has no log, an empty log, or no run.finished: it "
    "died, was killed, or never started; this outranks the others, and between failed and "
    "interrupted the root cause decides); 2 bad usage, with nothing written."
)

_positive_int = _integer_at_least(1, "a positive integer")
_non_negative_int = _integer_at_least(0, "an integer >= 0")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (> 0), got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds (> 0), got {text!r}")
    return value


def _severity(text: str) -> Severity:
    try:
        return Severity.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: ``--export`` kinds; jaeger-json writes a file, named in the same argument.
_EXPORT_KINDS = "otlp, console, or jaeger-json=FILE"


def _export_spec(text: str) -> list[str]:
    """An argparse type: ``KIND[=FILE]``, as ``[kind]`` or ``["jaeger-json", FILE]``.

    The destination is part of the one argument, so ``--export`` never takes
    a run directory for its file, whichever side of it the paths are.
    """
    kind, equals, destination = text.partition("=")
    if kind in ("otlp", "console") and not equals:
        return [kind]
    if kind == "jaeger-json" and destination:
        return [kind, destination]
    if kind == "jaeger-json":
        raise argparse.ArgumentTypeError(f"{text!r}: name the file, as jaeger-json=FILE")
    raise argparse.ArgumentTypeError(f"{text!r}: expected {_EXPORT_KINDS}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog=PROG,
        description="Start an inference engine's probes as an event-sourced task graph; "
        "replay and explain failed starts from their logs.",
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run",
        help="run the reference engine startup on this host (or a simulated one)",
        description="Run the reference engine startup graph with real probes on this host, "
        "or on a simulated host (--simulate). Each rank claims the run directory, writes "
        "run.started before anything slow, and records SIGINT/SIGTERM at any moment as "
        "interrupted; with --nproc the launcher also writes manifest.json (pids, exit "
        "statuses, signals) and its ranks never outlive it.",
        epilog=_OUTCOMES_EPILOG,
    )
    run.add_argument(
        "--nproc",
        type=_positive_int,
        default=None,
        metavar="N",
        help="start N local rank processes (default: 1, or the torchrun ranks)",
    )
    run.add_argument(
        "--grace",
        type=_positive_float,
        default=None,
        metavar="S",
        help="with --nproc: seconds the launcher waits, once a rank ended other than ready "
        "or a stop was asked, before sending SIGTERM to the ranks still running, and again "
        "before SIGKILL (default: $STARTUP_ORCHESTRATOR_GRACE_S, else 10)",
    )
    run.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the run directory (default: ./startup-runs/<run-id>)",
    )
    run.add_argument(
        "--run-id",
        default=None,
        metavar="ID",
        help="the run id (default: from the launcher, else a new one)",
    )
    run.add_argument(
        "--simulate",
        default=None,
        metavar="PROFILE",
        help="simulate a host: h200x8, a100x4, b200x8, zen4, xeon, or a JSON file",
    )
    run.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault: [RANKS:]TARGET=EXCEPTION[:MESSAGE] (repeatable)",
    )
    run.add_argument(
        "--inject-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="inject the faults of a JSON file (structured exception arguments)",
    )
    run.add_argument(
        "--attention-backend",
        default=None,
        metavar="NAME",
        help="use this attention backend only (no fallback)",
    )
    run.add_argument(
        "--allreduce-backend",
        choices=("auto", "mnnvl", "trtllm"),
        default="auto",
        help="all-reduce fusion workspace backend (default: auto)",
    )
    run.add_argument(
        "--tp",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tensor-parallel size (default: the number of ranks)",
    )
    run.add_argument("--dtype", default="auto", help="model dtype (default: auto)")
    run.add_argument("--head-size", type=_positive_int, default=128, metavar="N")
    run.add_argument("--kv-cache-dtype", default="auto")
    run.add_argument("--mla", action="store_true", help="multi-head latent attention model")
    run.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help="seconds each probe may take (a plugin's check, an import, a candidate, an "
        "attempt); a step that waits for probes may take that long per level below it plus "
        "once for itself, so the probe that hangs is the one that times out (default: none)",
    )
    run.add_argument(
        "--durability",
        choices=("always", "interval", "never"),
        default="interval",
        help="when the log is fsynced (default: interval)",
    )
    run.add_argument("--json", action="store_true", help="print the JSON report")
    run.add_argument(
        "--level",
        type=_severity,
        default=Severity.INFO,
        help="lowest severity printed (debug, info, warning, error)",
    )
    _add_tracing_options(run)

    replay = commands.add_parser(
        "replay",
        help="re-derive state, messages and root cause from logs",
        description="Merge the ranks of a run directory (or log files), re-derive the state "
        "and messages, and print a report whose first lines name the outcome, whether the "
        "host was simulated or faults injected, and the root cause. The run is judged "
        "against every rank of its world (from manifest.json when the directory has one).",
        epilog=_OUTCOMES_EPILOG,
    )
    replay.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    replay.add_argument("--json", action="store_true", help="print the JSON report")
    replay.add_argument("--rank", type=_non_negative_int, default=None, help="only this rank")
    replay.add_argument(
        "--until",
        type=_non_negative_int,
        default=None,
        metavar="SEQ",
        help="the state as it was after event SEQ of each rank (ranks not finished by then "
        "are 'running', not crashed)",
    )
    replay.add_argument(
        "--level",
        type=_severity,
        default=Severity.INFO,
        help="lowest severity shown: debug, info, warning, error (default: info, as run prints)",
    )
    replay.add_argument(
        "--export",
        type=_export_spec,
        default=None,
        metavar="KIND[=FILE]",
        help="also export the trace: otlp (to the collector OTEL_EXPORTER_OTLP_* name), "
        "console (spans to stderr), or jaeger-json=FILE (a Jaeger-UI JSON file)",
    )
    replay.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write a self-contained HTML report (to attach to a bug report)",
    )
    replay.add_argument(
        "--slice",
        action="append",
        default=None,
        dest="slices",
        metavar="MODULE:NAME",
        help="derive messages and report columns with this events.Slice instead of the "
        "reference engine's, for a run of your own graph; MODULE is an importable module or "
        "a .py file (repeatable)",
    )

    for name, text in (
        ("explain", "the fallback tree of every step, with outcomes and causes"),
        ("blame", "steps by time spent"),
        ("critical-path", "the chain of steps that decided the startup's wall time"),
    ):
        view = commands.add_parser(name, help=text, description=text)
        view.add_argument("paths", nargs="+", type=Path, metavar="PATH")
        view.add_argument("--rank", type=_non_negative_int, default=None, help="only this rank")

    diff = commands.add_parser(
        "diff",
        help="what changed between two runs",
        description="Compare two runs (e.g. a healthy and a failed start): outcomes, "
        "decisions, per-rank state and messages, one line per group of ranks with the "
        "same difference. Exit status, as diff(1): 0 the runs do not differ; 1 they "
        "differ; 2 bad input.",
    )
    diff.add_argument("run_a", type=Path, metavar="RUN_A")
    diff.add_argument("run_b", type=Path, metavar="RUN_B")

    watch = commands.add_parser(
        "watch",
        help="follow a launch in progress: which rank is where, and which is stalled",
        description="Follow a run in progress from its logs alone (another terminal, or "
        "another machine with the run directory mounted; any launcher: local, torchrun, an "
        "embedding one). Prints the outcomes as they land, a line for each rank that has "
        "appended nothing for longer than --stall seconds, naming the step it is in, and, "
        "per group of ranks in the same state, the step in progress and for how long (on a "
        "terminal a block redrawn in place; elsewhere plain lines, each printed once). Ends "
        "when every rank of the world (from manifest.json, else from the ranks' run.started) "
        "has finished.",
        epilog="exit status: as replay's once every rank finished: 0 ready, 1 otherwise; 1 at "
        "--timeout, with a line naming the ranks still running and where; 2 bad usage.",
    )
    watch.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    watch.add_argument(
        "--stall",
        type=_positive_float,
        default=10.0,
        metavar="S",
        help="a rank that appended nothing for longer than this is stalled (default: 10)",
    )
    watch.add_argument(
        "--interval",
        type=_positive_float,
        default=0.5,
        metavar="S",
        help="seconds between looks at the logs (default: 0.5)",
    )
    watch.add_argument(
        "--timeout",
        type=_positive_float,
        default=None,
        metavar="S",
        help="give up after this many seconds, exit 1 (default: wait until the run ends)",
    )

    validate = commands.add_parser(
        "validate",
        help="check logs for every integrity problem (exit 1 if any)",
        description="Check every path: a run directory as a whole (one run id in its logs, "
        ".run-id and manifest.json; no duplicate or foreign ranks; one world size; every rank "
        "with a log that has events) and each log line by line (bad records, sequence gaps, "
        "torn tails, a missing run.started or run.finished). Files that are not regular files "
        "are reported, never read. Goes on over every path and ends with a summary line. "
        "Exit 0 when nothing is wrong, 1 when anything is, 2 when a path does not exist.",
    )
    validate.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    return parser


def _add_tracing_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "tracing",
        "Spans go wherever OTEL_EXPORTER_OTLP_* say (OTEL_SDK_DISABLED=true turns them off); "
        "these options add or override.",
    )
    group.add_argument(
        "--otlp-endpoint", default=None, metavar="URL", help="send spans to this OTLP collector"
    )
    group.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), default=None)
    group.add_argument(
        "--trace-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the trace as a Jaeger-UI JSON file: with --nproc, one file for the "
        "whole launch (every rank's spans, root cause marked), written from the logs once "
        "every rank has ended; under torchrun and the like, each rank of several writes "
        "FILE with a -rank-N suffix",
    )
    group.add_argument("--console-spans", action="store_true", help="print spans to stderr")


class _VersionAction(argparse.Action):
    # The installed version is looked up only when asked for: reading the
    # distribution's metadata on every invocation would slow every command.
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        # stdout, as argparse's own version action prints.
        sys.stdout.write(f"{parser.prog} {_version()}\n")
        parser.exit(0)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("startup-orchestrator")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "0"
