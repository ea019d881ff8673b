"""The command line's arguments: every subcommand, its options and their
checks (a bad value is one error line and exit 2, before anything runs)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from events import MAX_WORLD_SIZE, Severity

from .._watchdog import DEFAULT_STALL_S
from ._errors import raised_as
from ._output import PROG

__all__ = ["build_parser"]


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, except that a paragraph of a description or an
    epilog whose lines are indented (examples, lists) keeps its lines."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        paragraphs = []
        for paragraph in text.split("\n\n"):
            if "\n  " in paragraph:
                paragraphs.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:
                paragraphs.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(paragraphs)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    #: Text appended to the epilog when the help is printed, computed only
    #: then: ``run --help`` lists the engine's fault targets, and importing
    #: the engine for every command line would slow every command.
    lazy_epilog: Callable[[], str] | None = None

    def error(self, message: str) -> NoReturn:
        # One line, not usage plus a message: scripts and humans both read it.
        self.exit(2, f"{PROG}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        if self.lazy_epilog is not None:
            self.epilog = f"{self.epilog}\n\n{self.lazy_epilog()}"
            self.lazy_epilog = None
        return super().format_help()


def _integer_at_least(minimum: int, maximum: int = 2**63 - 1) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (0 or 1) and at
    most ``maximum`` (a number no run has is refused, not acted on)."""
    expected = "a positive integer" if minimum else "an integer >= 0"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if not minimum <= value <= maximum:
            raise argparse.ArgumentTypeError(
                f"expected {expected} (at most {maximum:,}), got {text!r}"
            )
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


def _epilog(status: str, *examples: str) -> str:
    return f"{status}\n\nexamples:\n" + "\n".join(f"  {PROG} {line}" for line in examples)


def _inject_targets() -> str:
    """The fault targets of the reference engine: the table ``--inject`` is
    checked against before a run starts."""
    import textwrap

    from ..engine import injection_targets

    targets = injection_targets()
    modules, steps = (
        textwrap.fill(", ".join(names), 78, initial_indent="  ", subsequent_indent="  ")
        for names in (targets.modules, targets.steps)
    )
    return f"--inject targets, modules the probes import:\n{modules}\nand step paths:\n{steps}"


#: Ranks, tensor-parallel sizes: no run has more ranks than a world may.
_rank_count = _integer_at_least(1, MAX_WORLD_SIZE)
_non_negative_int = _integer_at_least(0)

#: The longest wait any option takes: a week.
_MAX_SECONDS = 7 * 24 * 3600


def _path(text: str) -> Path:
    """An argparse type: a path, never the empty one (which would mean the
    current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return Path(text)


#: The arguments several commands take alike (see _add).
_SHARED: dict[str, dict[str, Any]] = {
    "paths": {
        "nargs": "+",
        "type": _path,
        "metavar": "PATH",
        "help": "a run directory (every rank-N.jsonl in it, and its manifest.json), or rank log "
        "files of one run (rank-N.jsonl); several run directories of one run (one per node, "
        "copied from each) are read as one run: a rank log found in several is read once when "
        "the copies are the same log (the longer when one is a prefix of the other)",
    },
    "--json": {"action": "store_true", "help": "print the JSON report (default: the text report)"},
    "--rank": {
        "type": _non_negative_int,
        "metavar": "N",
        "help": "only this rank (default: every rank)",
    },
    # For every command that replays a run.
    "--slice": {
        "action": "append",
        "dest": "slices",
        "metavar": "MODULE:NAME",
        "help": "derive messages and report columns with this events.Slice instead of the "
        "reference engine's, for a run of your own graph; MODULE is an importable module or "
        "a .py file (repeatable)",
    },
}


def _add(command: argparse.ArgumentParser, *names: str) -> None:
    for name in names:
        command.add_argument(name, **_SHARED[name])


def _endpoint(text: str) -> str:
    """An argparse type: an OTLP collector's URL, ``http(s)://HOST[:PORT]``
    (checked here: a malformed one fails before a log exists)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a URL ({exc}): {text!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected http(s)://HOST[:PORT], got {text!r}")
    return text


def _seconds_option(
    command: argparse.ArgumentParser, name: str, *, help: str, default: float | None = None
) -> None:
    command.add_argument(name, type=parse_seconds, default=default, metavar="S", help=help)


def parse_seconds(text: str) -> float:
    """An argparse type: seconds, more than 0 and at most a week."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= _MAX_SECONDS:  # nan and inf are refused too
        raise argparse.ArgumentTypeError(
            f"expected seconds (> 0, at most {_MAX_SECONDS:,}), got {text!r}"
        )
    return value


def _severity(text: str) -> Severity:
    with raised_as(argparse.ArgumentTypeError, ValueError):
        return Severity.parse(text)


def _export_spec(text: str) -> tuple[str, Path | None]:
    """An argparse type: ``KIND[=FILE]``, as ``(kind, None)`` or ``("jaeger-json", FILE)``.

    The destination is part of the one argument, so ``--export`` never takes
    a run directory for its file, whichever side of it the paths are.
    """
    kind, equals, destination = text.partition("=")
    if kind in ("otlp", "console") and not equals:
        return kind, None
    if kind == "jaeger-json" and destination:
        return kind, Path(destination)
    if kind == "jaeger-json":
        raise argparse.ArgumentTypeError(f"{text!r}: name the file, as jaeger-json=FILE")
    raise argparse.ArgumentTypeError(f"{text!r}: expected otlp, console, or jaeger-json=FILE")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = _Parser(
        prog=PROG,
        description="Start an inference engine's probes as an event-sourced task graph; "
        "replay and explain failed starts from their logs.",
        epilog=_epilog(
            "Each command has its own --help: options, exit status, examples.",
            "run --simulate h200x8 --nproc 8",
            "replay startup-runs/<run-id>",
        ),
    )
    parser.add_argument(
        "--version", action=_VersionAction, nargs=0, help="show the version and exit"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    run = commands.add_parser(
        "run",
        # Options are spelled out: the launcher hands its ranks its own
        # options but a few, which it finds by name.
        allow_abbrev=False,
        help="run the reference engine startup on this host (or a simulated one)",
        description="Run the reference engine startup graph with real probes on this host, "
        "or on a simulated host (--simulate). Each rank claims the run directory, writes "
        "run.started before anything slow, and records SIGINT/SIGTERM at any moment as "
        "interrupted; with --nproc the launcher also writes manifest.json (pids, exit "
        "statuses, signals) and its ranks never outlive it.",
        epilog=_epilog(
            _OUTCOMES_EPILOG,
            "run",
            "run --simulate h200x8 --nproc 8 --run-dir startup-runs/h200",
            "run --simulate zen4 --nproc 8 --inject '5:zentorch=RuntimeError:no such op'",
            "run --simulate examples/profile-custom.json --timeout 5 \\\n"
            "      --inject 'attention/FLASH_ATTN=hang'",
        ),
    )
    run.lazy_epilog = _inject_targets
    run.add_argument(
        "--nproc",
        type=_rank_count,
        metavar="N",
        help="start N local rank processes and write the manifest (default: run one rank "
        "in this process, or be one of the torchrun ranks)",
    )
    _seconds_option(
        run,
        "--grace",
        help="with --nproc: seconds the launcher waits, once a rank ended other than ready "
        "or a stop was asked, before sending SIGTERM to the ranks still running, and again "
        "before SIGKILL (default: $STARTUP_ORCHESTRATOR_GRACE_S, else 10)",
    )
    run.add_argument(
        "--run-dir",
        type=_path,
        metavar="DIR",
        help="the run directory (default: ./startup-runs/<run-id>); a worker group torchrun "
        "restarted writes to DIR-restart-K, as its run id is <run-id>-restart-K",
    )
    run.add_argument(
        "--run-id", metavar="ID", help="the run id (default: from the launcher, else a new one)"
    )
    _seconds_option(
        run,
        "--group-timeout",
        default=120.0,
        help="seconds forming the ranks' process group and each exchange over it may wait "
        "for the other ranks; at the end, how long rank 0 waits for the other ranks' logs "
        "(a rank that did not deliver by then is named missing in rank 0's run directory) "
        "(default: 120)",
    )
    _seconds_option(
        run,
        "--stall",
        default=DEFAULT_STALL_S,
        help="seconds a step may run before its rank records where it waits (the stacks of "
        "the threads doing its work, in the log; again at twice, four times... that while "
        f"it stays) (default: {DEFAULT_STALL_S:g})",
    )
    run.add_argument(
        "--simulate",
        metavar="PROFILE",
        # The built-in profiles (engine.BUILTIN_PROFILES) are named here so
        # that --help does not import the engine.
        help="simulate a host: a built-in profile (a100x4, b200x8, h200x8, xeon, zen4) or a "
        "JSON profile file (its fields: docs/profiles.md; a complete one: "
        "examples/profile-custom.json) (default: this host)",
    )
    run.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SPEC",
        help="inject a fault: [RANKS:]TARGET=ACTION[:MESSAGE] (repeatable). TARGET is a "
        "module a probe imports or a step path (listed below); ACTION is a builtin exception "
        "class name (raised with MESSAGE), hang (the probe never returns: a --timeout ends it) "
        "or crash (the rank dies by SIGSEGV); RANKS like 3, 0-3 or 1,5 (default: every rank). "
        "Checked before anything starts",
    )
    run.add_argument(
        "--inject-file",
        type=_path,
        metavar="FILE",
        help="inject the faults of a JSON file, for structured exception arguments: a list of "
        '{"target": ..., "exception": NAME | "hang" | "crash", "args": [...], "kwargs": {...}, '
        '"ranks": "0-3"}',
    )
    run.add_argument(
        "--engine",
        choices=("reference", "vllm"),
        default="reference",
        help="whose platform detection runs: the reference engine's plugins, or vLLM's own "
        "(vllm.platforms: its plugins, their log lines and its resolution, on this host; "
        "the other steps are the reference engine's model of the platform it selects) "
        "(default: reference)",
    )
    run.add_argument(
        "--target-device",
        choices=("cuda", "rocm", "cpu", "tpu", "xpu"),
        help="what the engine build targets, as VLLM_TARGET_DEVICE: the cpu plugin "
        "activates only for a CPU build, and cpu probes it alone (default: "
        "$VLLM_TARGET_DEVICE, else the installed torch build, or the simulated profile's)",
    )
    run.add_argument(
        "--attention-backend",
        metavar="NAME",
        help="use this attention backend only, no fallback (default: the first of the "
        "platform's candidates that works)",
    )
    run.add_argument(
        "--allreduce-backend",
        choices=("auto", "mnnvl", "trtllm"),
        default="auto",
        help="all-reduce fusion workspace backend (default: auto)",
    )
    run.add_argument(
        "--tp",
        type=_rank_count,
        metavar="N",
        help="tensor-parallel size (default: the number of ranks)",
    )
    run.add_argument(
        "--dtype",
        default="auto",
        metavar="DTYPE",
        # The engine's EngineConfig checks --dtype and --kv-cache-dtype.
        help="model dtype: auto, float16, bfloat16, float32 (default: auto, which is bfloat16)",
    )
    run.add_argument(
        "--head-size",
        type=_integer_at_least(1, 65_536),
        default=128,
        metavar="N",
        help="the model's attention head size; backends that do not support it are skipped "
        "(default: 128)",
    )
    run.add_argument(
        "--kv-cache-dtype",
        default="auto",
        metavar="DTYPE",
        help="KV-cache dtype: auto, float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2; backends that do "
        "not support it are skipped (default: auto)",
    )
    run.add_argument(
        "--mla", action="store_true", help="a multi-head latent attention model (default: not)"
    )
    _seconds_option(
        run,
        "--timeout",
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
    _add(run, "--json")
    run.add_argument(
        "--level",
        type=_severity,
        default=Severity.INFO,
        help="lowest severity printed: debug, info, warning, error (default: info)",
    )
    tracing = run.add_argument_group(
        "tracing",
        "Spans go wherever OTEL_EXPORTER_OTLP_* say (OTEL_SDK_DISABLED=true turns them off); "
        "these options add or override.",
    )
    tracing.add_argument(
        "--otlp-endpoint",
        type=_endpoint,
        metavar="URL",
        help="send spans to this OTLP collector (default: $OTEL_EXPORTER_OTLP_ENDPOINT)",
    )
    tracing.add_argument(
        "--otlp-protocol",
        choices=("grpc", "http/protobuf"),
        help="the OTLP protocol (default: $OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)",
    )
    tracing.add_argument(
        "--trace-file",
        type=_path,
        metavar="FILE",
        help="also write the trace as a Jaeger-UI JSON file: with --nproc, one file for the "
        "whole launch (every rank's spans, root cause marked), written from the logs once "
        "every rank has ended; under torchrun and the like, each rank of several writes "
        "FILE with a -rank-N suffix",
    )
    tracing.add_argument(
        "--console-spans", action="store_true", help="print spans to stderr (default: not)"
    )

    replay = commands.add_parser(
        "replay",
        help="re-derive state, messages and root cause from logs",
        description="Merge the ranks of a run directory (or log files), re-derive the state "
        "and messages, and print a report whose first lines name the outcome, whether the "
        "host was simulated or faults injected, and the root cause. The run is judged "
        "against every rank of its world (from manifest.json when the directory has one).",
        epilog=_epilog(
            _OUTCOMES_EPILOG,
            "replay startup-runs/<run-id>",
            "replay startup-runs/<run-id> --rank 5 --level debug",
            "replay --export jaeger-json=trace.json startup-runs/<run-id>",
            "replay --json startup-runs/<run-id>/rank-0.jsonl startup-runs/<run-id>/rank-1.jsonl",
        ),
    )
    _add(replay, "paths", "--json", "--rank")
    replay.add_argument(
        "--until",
        type=_non_negative_int,
        metavar="SEQ",
        help="the state as it was after event SEQ of each rank (ranks not finished by then "
        "are 'running', not crashed) (default: the end of the logs)",
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
        metavar="KIND[=FILE]",
        help="also export the trace: otlp (to the collector OTEL_EXPORTER_OTLP_* name), "
        "console (spans to stderr), or jaeger-json=FILE (a Jaeger-UI JSON file)",
    )
    replay.add_argument(
        "--html",
        type=_path,
        metavar="FILE",
        help="also write a self-contained HTML report (to attach to a bug report)",
    )
    _add(replay, "--slice")

    for name, text in (
        ("explain", "the fallback tree of every step, with outcomes and causes"),
        ("blame", "steps by time spent"),
        ("critical-path", "the chain of steps that decided the startup's wall time"),
    ):
        view = commands.add_parser(
            name,
            help=text,
            description=f"{text[0].upper()}{text[1:]}, from the logs of a stored run.",
            epilog=_epilog(
                "exit status: 0 printed; 1 a log could not be read (corrupt, or not a log); "
                "2 bad usage (an option, a path that does not exist, a rank outside the run).",
                f"{name} startup-runs/<run-id>",
                f"{name} startup-runs/<run-id> --rank 3",
            ),
        )
        _add(view, "paths", "--rank", "--slice")

    diff = commands.add_parser(
        "diff",
        help="what changed between two runs",
        description="Compare two runs (e.g. a healthy and a failed start): outcomes, "
        "decisions, per-rank state and messages, one line per group of ranks with the "
        "same difference.",
        epilog=_epilog(
            "exit status, as diff(1): 0 the runs do not differ; 1 they differ, or a log could "
            "not be read; 2 bad usage.",
            "diff startup-runs/healthy startup-runs/failed",
            "diff healthy/node0 healthy/node1 failed/node0 failed/node1",
        ),
    )
    diff.add_argument(
        "run_a", type=_path, metavar="RUN_A", help="the first run: a run directory (the baseline)"
    )
    diff.add_argument(
        "run_b",
        type=_path,
        metavar="RUN_B",
        help="the second run: a run directory (compared to it)",
    )
    diff.add_argument(
        "more",
        nargs="*",
        type=_path,
        metavar="PATH",
        help="with more than two paths, the run directories of two multi-node runs (one per "
        "node): grouped into the two runs by run id, the run of the first path the baseline",
    )
    _add(diff, "--slice")

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
        "has finished or died: its launcher saw its process end or, where no launcher's "
        "manifest lists it, the process its run.started names is gone from this host.",
        epilog=_epilog(
            "exit status: as replay's once every rank finished: 0 ready, 1 otherwise; 1 at "
            "--timeout, with a line naming the ranks still running and where; 2 bad usage.",
            "watch startup-runs/<run-id>",
            "watch startup-runs/<run-id> --stall 30 --timeout 600",
        ),
    )
    watch.add_argument(
        "run_dir",
        type=_path,
        metavar="RUN_DIR",
        help="the run directory the launch writes (it may not exist yet)",
    )
    _seconds_option(
        watch,
        "--stall",
        default=10.0,
        help="a rank that appended nothing for longer than this is stalled (default: 10)",
    )
    _seconds_option(
        watch, "--interval", default=0.5, help="seconds between looks at the logs (default: 0.5)"
    )
    _seconds_option(
        watch,
        "--timeout",
        help="give up after this many seconds, exit 1 (default: wait until the run ends)",
    )
    _add(watch, "--slice")

    validate = commands.add_parser(
        "validate",
        help="check logs for every integrity problem (exit 1 if any)",
        description="Check the logs of runs for every integrity problem. Check every path: "
        "a run directory as a whole (one run id in its logs, "
        ".run-id and manifest.json; no duplicate or foreign ranks; one world size; every rank "
        "with a log that has events) and each log line by line (bad records, sequence gaps, "
        "torn tails, a missing run.started or run.finished) and as a tree of steps (no two "
        "sharing a span, none ending before it starts, no cycle of parents or of "
        "dependencies). Files that are not regular files "
        "are reported, never read. A directory of run directories (startup-runs) is checked "
        "run by run. Goes on over every path and ends with a summary line.",
        epilog=_epilog(
            "exit status: 0 nothing is wrong; 1 anything is; 2 bad usage (a path that does "
            "not exist).",
            "validate startup-runs/<run-id>",
            "validate startup-runs",
            "validate startup-runs/<run-id>/rank-3.jsonl",
        ),
    )
    _add(validate, "paths")
    return parser


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
        from importlib.metadata import PackageNotFoundError, version

        try:
            installed = version("startup-orchestrator")
        except PackageNotFoundError:  # pragma: no cover - running from a checkout
            installed = "0"
        # stdout, as argparse's own version action prints.
        sys.stdout.write(f"{parser.prog} {installed}\n")
        parser.exit(0)
