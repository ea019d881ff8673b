"""``startup-orchestrator run``: one rank, or a local launch of N ranks.

A rank is the embedding API's first user: :class:`~orchestrator.Startup`
claims the run directory, records ``run.started`` before anything slow,
forms the process group as a recorded step, records SIGINT/SIGTERM at any
moment, and flushes everything on every exit path. This module checks the
options (exit 2 before anything is written), maps what ``Startup`` raises to
exit codes, and prints the report.

The launcher (``--nproc N``) claims the run directory, writes its manifest,
starts the ranks (which die with it), waits, prints on stderr the WARNINGs
scope kept off every printing rank, then the report ``replay`` prints. With
``--trace-file`` the ranks write no file: the launcher writes one Jaeger-UI
document for the whole launch from the ranks' logs once they have all ended
(a killed rank's spans included, the root cause marked).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs

from events import EventsError, InvalidValueError, RankIdentity
from events._files import write_file

from .._errors import FaultSpecError, RankEnvironmentError
from .._faults import FaultPlan
from .._identity import (
    checked_run_id,
    identity_from_environment,
    launcher_convention,
    new_run_id,
    run_id_from_environment,
)
from .._json_text import read_input
from .._run_directory import LaunchBook, Manifest, RunDirectoryError
from .._startup import DEFAULT_RUNS_ROOT, Startup, checked_fault_plan, print_messages, trace_parent
from ._errors import InputError, UsageError, raised_as
from ._launcher import (
    CHILD_VARIABLE,
    DEFAULT_GRACE_S,
    GRACE_VARIABLE,
    SIMULATED_VARIABLE,
    LocalLaunch,
)
from ._output import PROG, diagnose, hold_stops
from ._parser import parse_seconds
from ._run_logs import read_run

__all__ = ["command_run"]


def _faults(args: argparse.Namespace, world_size: int) -> FaultPlan:
    """The fault plan, checked against the launch before anything runs: every
    target is one the engine has and every rank is in the world."""
    try:
        plan = FaultPlan.parse(args.inject)
        if args.inject_file is not None:
            try:
                plan = plan + FaultPlan.load(args.inject_file)
            except FaultSpecError as exc:
                where = "" if exc.part == exc.spec else f"{exc.part!r}: "
                raise UsageError(f"--inject-file {exc.spec}: {where}{exc.reason}") from None
        return checked_fault_plan(plan, world_size, engine=args.engine)
    except FaultSpecError as exc:
        option = "--inject" if exc.spec in args.inject else "--inject-file"
        raise UsageError(f"{option} {exc.spec!r}: {exc.part!r}: {exc.reason}") from None


@attrs.frozen
class _Host:
    """What ``--simulate`` names, its file read once: a file given as
    ``<(...)`` can be read only once, and what the launcher checked is what
    its ranks run."""

    #: the engine's profile, ``None`` for the real host
    profile: Any
    #: how reports name it: a built-in profile's name, or a profile file's
    #: path with the start of its content's SHA-256
    label: str | None
    #: a profile file's content, ``None`` otherwise
    content: bytes | None = None


def _host(args: argparse.Namespace, launched: bool) -> _Host:
    """The simulated host; a launched rank names it as its launcher did (it
    reads the launcher's copy, see :func:`_hand_over`)."""
    if args.simulate is None:
        return _Host(profile=None, label=None)
    from ..engine import BUILTIN_PROFILES, ProfileError, load_profile

    name = str(args.simulate)
    content = None
    label = name
    if launched and os.environ.get(SIMULATED_VARIABLE):
        label = os.environ[SIMULATED_VARIABLE]
    elif name not in BUILTIN_PROFILES:
        import hashlib

        try:
            content = read_input(name)
            label = f"{name} (sha256 {hashlib.sha256(content).hexdigest()[:16]})"
        except OSError:
            pass  # load_profile says why
        except ValueError as exc:  # read once: a pipe could not be read again
            raise UsageError(str(ProfileError(name, str(exc)))) from None
    with raised_as(UsageError, ProfileError):
        return _Host(profile=load_profile(name, content=content), label=label, content=content)


def _config(args: argparse.Namespace, world_size: int) -> Any:
    from ..engine import ATTENTION_BACKENDS, EngineConfig, EngineConfigError

    backend = args.attention_backend
    if backend is not None and backend not in ATTENTION_BACKENDS:
        error = InvalidValueError("backend", backend, ATTENTION_BACKENDS, "--attention-backend")
        raise UsageError(str(error))
    with raised_as(UsageError, EngineConfigError):
        return EngineConfig(
            tp=args.tp if args.tp is not None else world_size,
            attention_backend=args.attention_backend,
            allreduce_backend=args.allreduce_backend,
            dtype=args.dtype,
            head_size=args.head_size,
            kv_cache_dtype=args.kv_cache_dtype,
            use_mla=args.mla,
            target_device=args.target_device,
            step_timeout=args.timeout,
        )


def _check_engine(args: argparse.Namespace) -> None:
    if args.engine != "vllm":
        return
    from ..engine import EngineConfigError
    from ..engine._vllm import vllm_version

    if args.simulate is not None:
        raise UsageError(
            "--engine vllm runs vLLM's platform code on this host; --simulate is for the "
            "reference engine"
        )
    try:
        vllm_version()
    except EngineConfigError as exc:
        raise UsageError(f"--engine vllm: {exc.reason}") from None


def command_run(args: argparse.Namespace) -> int:
    """Validate everything up front (exit 2 on bad input), then launch."""
    launched = os.environ.get(CHILD_VARIABLE) == "1"
    run_id = args.run_id
    if run_id is not None:
        try:
            run_id = checked_run_id(run_id)
        except RankEnvironmentError as exc:
            raise UsageError(f"--run-id {run_id!r}: {exc.reason}") from None
    host = _host(args, launched)
    _check_engine(args)
    if args.trace_file is not None:
        # Exit 2 before anything starts when the trace file cannot be
        # written, or would be written over the run's own record.
        from ._views import check_output

        run_dir = args.run_dir or (None if run_id is None else DEFAULT_RUNS_ROOT / run_id)
        check_output(
            f"--trace-file {args.trace_file}",
            args.trace_file,
            UsageError,
            inputs=() if run_dir is None else [run_dir],
        )
    if args.nproc is not None and not launched:
        if launcher_convention() is not None:
            raise UsageError(
                "--nproc starts local ranks itself; under torchrun leave it out "
                "(torchrun --nproc-per-node N -m orchestrator run ...), and under srun or "
                "mpirun too"
            )
        # Fail fast, before any process starts.
        faults = _faults(args, args.nproc)
        _config(args, args.nproc)
        return _launch(args, faults, host, run_id)
    with raised_as(UsageError, RankEnvironmentError):
        identity = identity_from_environment()
    faults = _faults(args, identity.world_size)
    config = _config(args, identity.world_size)
    return _run_rank(args, identity, config, host, faults, launched)


# --- the launcher ---------------------------------------------------------------------


def _launch(args: argparse.Namespace, faults: FaultPlan, host: _Host, run_id: str | None) -> int:
    from ._watch import LaunchView, is_terminal

    with raised_as(UsageError, RankEnvironmentError):  # a rank would refuse it alike
        run_id = run_id or run_id_from_environment() or new_run_id()
    run_dir = args.run_dir or DEFAULT_RUNS_ROOT / run_id
    grace_s = _grace(args)
    # The launch's span is a child of the launcher's own TRACEPARENT.
    with raised_as(UsageError, ValueError):
        parent = trace_parent(os.environ)
    manifest = Manifest.begin(
        run_id=run_id,
        world_size=args.nproc,
        faults=faults,
        simulating=host.label,
        caller_span=parent,
        command=(PROG, *args.argv),
    )
    with raised_as(UsageError, RunDirectoryError):
        book = LaunchBook.claim(run_dir, manifest)
    handed, descriptors = _hand_over(args, faults, host)
    ranks = f"{args.nproc} rank{'s' if args.nproc > 1 else ''}"
    diagnose(f"run {run_id}: starting {ranks} in {run_dir}")
    view = LaunchView(run_dir, sys.stderr) if is_terminal(sys.stderr) else None

    def notify(line: str) -> None:
        if view is None:
            diagnose(line)
        else:
            view.screen.line(f"{PROG}: {line}")  # escaped there, as diagnose escapes

    try:
        with raised_as(InputError, RunDirectoryError):
            exits = LocalLaunch(
                rank_arguments=_rank_arguments(args.argv, handed),
                grace_s=grace_s,
                notify=notify,
                book=book,
                tick=None if view is None else view.tick,
                relay=None if view is None else view.screen.line,
                environ={**os.environ, SIMULATED_VARIABLE: host.label or ""},
                pass_fds=descriptors,
            ).run()
    finally:
        for descriptor in descriptors:
            os.close(descriptor)
        if view is not None:
            view.close()
    _send_launch_trace(args, run_dir)
    for exit in exits:
        if exit.returncode not in (0, 1):
            diagnose(exit.describe())
    refused = [exit for exit in exits if exit.returncode == 2]
    if refused:
        # A rank refused to start (its own one-line error is above): what is
        # in the directory is not a run this launch made whole.
        ranks = ", ".join(str(exit.rank) for exit in refused)
        diagnose(f"error: rank {ranks} refused to start; no report")
        return 2
    return _report(args, run_dir, for_ranks=True)


def _send_launch_trace(args: argparse.Namespace, run_dir: Path) -> None:
    """Once every rank has ended: the launch's own span (the root of the
    ranks') to the ranks' collector, with the spans of ranks that died before
    they could end them; and the ``--trace-file`` document of the whole
    launch (per-rank files of one trace id, loaded together, would hide all
    but one)."""
    from exporters import Tracing, jaeger_document

    from .._launch_trace import launch_trace, send_launch_span
    from ..engine import ENGINE

    tracing = Tracing(otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol)
    path = args.trace_file
    if path is None and not tracing.wanted:
        return
    try:
        spans = launch_trace(run_dir, slices=[ENGINE])
        if path is not None:
            text = json.dumps(jaeger_document(spans), separators=(",", ":"), allow_nan=False)
            write_file(path, (text + "\n").encode())
    except (OSError, ValueError, EventsError, RunDirectoryError) as exc:
        what = "the launch's span" if path is None else f"--trace-file {path}"
        diagnose(f"{what}: not written: {exc}")
        return
    if path is not None:
        diagnose(f"the launch's trace ({len(spans)} spans) is in {path}")
    if not send_launch_span(tracing, spans, ranks_ended=True):
        diagnose("could not export the launch's span to the collector")


def _grace(args: argparse.Namespace) -> float:
    if args.grace is not None:
        return float(args.grace)
    text = os.environ.get(GRACE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_GRACE_S
    try:
        return parse_seconds(text)
    except argparse.ArgumentTypeError as exc:
        raise UsageError(f"{GRACE_VARIABLE}={text!r}: {exc}") from None


#: Options the ranks do not get: those only the launcher uses (the trace file
#: too: the launcher writes it for the whole launch), and the launch's inputs,
#: which the launcher reads once and hands to its ranks (see _hand_over).
_LAUNCHER_OPTIONS = (
    *("--nproc", "--run-dir", "--run-id", "--grace", "--trace-file"),
    *("--simulate", "--inject", "--inject-file"),
)


def _hand_over(
    args: argparse.Namespace, faults: FaultPlan, host: _Host
) -> tuple[list[str], list[int]]:
    """The ``run`` options that give the ranks what the launcher read, and the
    file descriptors they inherit for it. A profile file and the fault plan
    (``--inject`` and ``--inject-file`` together) go as memory files (never
    written to disk: an ``--inject`` message may hold a token), which each
    rank reads as ``/dev/fd/N``: what the launcher checked is what the ranks
    run, even when the launcher's own was a pipe (``--simulate <(...)``), or
    has changed since."""
    handed: list[str] = []
    descriptors: list[int] = []

    def memory_file(name: str, content: bytes) -> str:
        descriptor = os.memfd_create(name)
        descriptors.append(descriptor)
        with open(descriptor, "wb", closefd=False) as file:
            file.write(content)
        return f"/dev/fd/{descriptor}"

    if host.content is not None:
        handed += ["--simulate", memory_file("simulated-profile", host.content)]
    elif args.simulate is not None:
        handed += ["--simulate", str(args.simulate)]
    if faults:
        plan = json.dumps(faults.to_json()).encode()
        handed += ["--inject-file", memory_file("injected-faults", plan)]
    return handed, descriptors


def _rank_arguments(argv: list[str], handed: list[str]) -> list[str]:
    """The launcher's own arguments minus those that only it uses, and its
    inputs as ``handed`` (see :func:`_hand_over`)."""
    with_value = tuple(f"{option}=" for option in _LAUNCHER_OPTIONS)
    out: list[str] = []
    items = iter(argv)
    for item in items:
        if item in _LAUNCHER_OPTIONS:
            next(items, None)  # its value
        elif not ((item == "run" and not out) or item == "--json" or item.startswith(with_value)):
            out.append(item)
    return [*out, *handed]


def _print_for_ranks(args: argparse.Namespace, result: Any) -> None:
    """What the launcher's ranks left it to print, once for them all: the
    WARNINGs scope kept off every printing rank, and the ERRORs of failures
    that follow another rank's, which each rank held back (``[ranks 0-4,6-7]
    ... ; it follows rank 5's failure in attention/FLASH_ATTN``)."""
    from exporters import LoggingBridge, launcher_messages

    from .._group import follows_a_peer

    print_messages(args.level)
    bridge = LoggingBridge()
    cause = result.root_cause
    for message, ranks in launcher_messages(result.message_state, held=follows_a_peer):
        if follows_a_peer(message) and cause is not None and cause.rank not in ranks:
            where = f" in {cause.step}" if cause.step else ""
            text = f"{message.text.rstrip('.')}; it follows rank {cause.rank}'s failure{where}."
            message = attrs.evolve(message, text=text)
        bridge.log(message, ranks=ranks)


def _report(
    args: argparse.Namespace,
    run_dir: Path,
    *,
    own_rank: int | None = None,
    for_ranks: bool = False,
    verdict: bool = False,
) -> int:
    """Print the run's report (or the JSON document); with ``own_rank``, the
    view of one rank that cannot wait for its peers: its own state and
    messages, the exit status its own outcome. With ``for_ranks`` (the
    launcher), first print on stderr, as the live stream would have, what
    its ranks left to it (see :func:`_print_for_ranks`). With ``verdict``,
    last print on stderr the run's outcome and root cause in one line."""
    from ..engine import ENGINE
    from ._views import print_report

    run = read_run([run_dir], slices=[ENGINE])
    result = run.replay()
    if for_ranks:
        _print_for_ranks(args, result)
        _print_where_the_logs_are(run_dir)
    if own_rank is not None:
        diagnose(
            f"rank {own_rank} reports only itself (its peers may still be running); "
            f"replay {run_dir} once every rank has stopped for the whole run"
        )
    # The live messages are on the same screen, just above.
    above = f"replay {run_dir} lists them" if sys.stdout.isatty() and sys.stderr.isatty() else None
    print_report(args, run, result, rank=own_rank, printed_above=above)
    if verdict:
        cause = result.root_cause
        why = "" if cause is None else f": {cause.describe()}"
        diagnose(f"startup {result.outcome.value}{why}; replay {run_dir}")
    outcome = result.outcome if own_rank is None else result.outcome_of(own_rank)
    return 0 if outcome.value == "ready" else 1


# --- one rank -------------------------------------------------------------------------


def _run_rank(
    args: argparse.Namespace,
    identity: RankIdentity,
    config: Any,
    host: _Host,
    faults: FaultPlan,
    launched: bool,
) -> int:
    from exporters import Tracing

    startup = Startup(
        config,
        identity=identity,
        run_id=args.run_id,
        run_dir=args.run_dir,
        durability=args.durability,
        profile=host.profile,
        simulated=host.label,
        faults=faults,
        group_timeout_s=args.group_timeout,
        stall_s=args.stall,
        tracing=Tracing(
            otlp_endpoint=args.otlp_endpoint,
            otlp_protocol=args.otlp_protocol,
            trace_file=args.trace_file,
            console=sys.stderr if args.console_spans else None,
        ),
        configure_logging=True,
        level=args.level,
        # Under our launcher, the launcher reads every log at the end.
        wait_for_peers=not launched,
        engine=args.engine,
    )
    with raised_as(UsageError, RunDirectoryError, RankEnvironmentError, FaultSpecError, ValueError):
        startup.open()
    # Whatever ends the run is in the log and in the result; the report says
    # it, never a traceback.
    with startup, contextlib.suppress(BaseException):
        startup.run()
    log = startup.log
    if log is not None and log.failed_write is not None:
        # The record ends where the disk refused it: the report would read
        # a rank that is still running. The cause is said here, always.
        error = log.failed_write
        diagnose(
            f"error: cannot write {log.path}: {error.strerror or error}; "
            "the run's record ends where the write failed"
        )
        return 1
    result = startup.result
    assert result is not None
    own_code = 0 if result.ready else 1
    if launched:
        return own_code
    # Where the record is and what to do with it (stderr: stdout is the
    # report, or the JSON document).
    if identity.rank == 0:
        _print_where_the_logs_are(result.run_dir)
    if identity.world_size == 1:
        return _report(args, result.run_dir)
    if result.peers_finished is None:
        # No last exchange (no process group, or this rank was interrupted
        # and its peers may be gone): report this rank only.
        return _report(args, result.run_dir, own_rank=identity.rank)
    if identity.rank != 0:
        return own_code
    if not result.peers_finished:
        # Ranks that reached the end have closed their logs; the others
        # show as still running. Replay later gives the final picture.
        diagnose(
            "not every rank reached the end of the startup together; "
            f"replay {result.run_dir} once every rank has stopped for the final report"
        )
    # Rank 0 holds the merged record: its one-line verdict, the last line of
    # the orchestrator's own before the launcher's summary. The run is over,
    # and a launcher that stops every rank once one has exited (torchrun,
    # mpirun) would cut the report short: a stop waits until it is printed.
    hold_stops()
    return _report(args, result.run_dir, verdict=True)


def _print_where_the_logs_are(run_dir: Path) -> None:
    """The one line every run's launcher prints on stderr, a single rank or
    ``--nproc N`` alike."""
    diagnose(
        f"the run's logs are in {run_dir}; replay {run_dir} for the report, "
        f"explain {run_dir} for every step"
    )
