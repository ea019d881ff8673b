"""``startup-orchestrator run``: one rank, or a local launch of N ranks.

A rank claims the run directory, creates its own JSON Lines log in it and
records ``run.started`` (who it is, what it was asked, the simulated host and
the injected faults) before anything slow: tracing set-up, ``import torch``
and forming the process group all come after, the last two as a recorded
step (``process_group``). From the moment the log is open, SIGINT and
SIGTERM are caught and end the run ``interrupted``, naming the signal and
the steps in flight, flushed to disk. Then it wires live tracing and the
logging bridge to the log, runs the reference engine graph, and flushes
everything on every exit path.

The launcher (``--nproc N``) claims the run directory, writes its manifest,
starts the ranks (which die with it), waits, then prints the same report
``replay`` prints for the run directory.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

from events import Event, JsonlLog, JsonValue, RankIdentity, RunFinished, Severity

from ._cli import DEFAULT_RUNS, PROG, InputError, UsageError, emit, read_run, to_json_text
from ._errors import FaultSpecError, RankEnvironmentError
from ._faults import FaultPlan
from ._group import DeferredGroup, process_group_step
from ._identity import identity_from_environment, new_run_id, run_id_from_environment
from ._launcher import CHILD_VARIABLE, DEFAULT_GRACE_S, GRACE_VARIABLE, launch_local
from ._run_directory import (
    Manifest,
    RunDirectoryError,
    claim_run_directory,
    rank_log_path,
)
from ._signals import LAUNCHER_PID_VARIABLE, StopRequests, follow_launcher

__all__ = ["command_run"]


def _faults(args: argparse.Namespace, world_size: int) -> FaultPlan:
    """The fault plan, checked against the launch before anything runs: every
    target is one the engine has and every rank is in the world."""
    # Errors name the option, the bad part and what would be valid.
    try:
        plan = FaultPlan.parse(args.inject)
    except FaultSpecError as exc:
        raise UsageError(f"--inject {exc.spec!r}: {exc.part!r}: {exc.reason}") from None
    if args.inject_file is not None:
        try:
            plan = plan + FaultPlan.load(args.inject_file)
        except FaultSpecError as exc:
            where = "" if exc.part == exc.spec else f"{exc.part!r}: "
            raise UsageError(f"--inject-file {exc.spec}: {where}{exc.reason}") from None
    if plan:
        from .engine import injection_targets

        targets = injection_targets()
        try:
            plan.check(world_size=world_size, targets=(*targets.modules, *targets.steps))
        except FaultSpecError as exc:
            option = "--inject-file" if args.inject_file is not None else "--inject"
            raise UsageError(f"{option} {exc.spec!r}: {exc.part!r}: {exc.reason}") from None
    return plan


def _simulated(args: argparse.Namespace) -> str | None:
    """How reports name the simulated host: a built-in profile's name, or a
    profile file's path with the start of its content's SHA-256."""
    if args.simulate is None:
        return None
    from .engine import BUILTIN_PROFILES

    if args.simulate in BUILTIN_PROFILES:
        return str(args.simulate)
    import hashlib

    try:
        digest = hashlib.sha256(Path(args.simulate).read_bytes()).hexdigest()
    except OSError:
        return str(args.simulate)
    return f"{args.simulate} (sha256 {digest[:16]})"


def _profile(args: argparse.Namespace) -> Any:
    if args.simulate is None:
        return None
    from .engine import ProfileError, load_profile

    try:
        return load_profile(args.simulate)
    except ProfileError as exc:
        raise UsageError(str(exc)) from None


def _config(args: argparse.Namespace, world_size: int) -> Any:
    from .engine import ATTENTION_BACKENDS, EngineConfig, EngineConfigError

    if args.attention_backend is not None and args.attention_backend not in ATTENTION_BACKENDS:
        raise UsageError(
            f"--attention-backend {args.attention_backend!r}: unknown backend; valid: "
            f"{', '.join(ATTENTION_BACKENDS)}"
        )

    try:
        return EngineConfig(
            tp=args.tp if args.tp is not None else world_size,
            attention_backend=args.attention_backend,
            allreduce_backend=args.allreduce_backend,
            dtype=args.dtype,
            head_size=args.head_size,
            kv_cache_dtype=args.kv_cache_dtype,
            use_mla=args.mla,
            step_timeout=args.timeout,
        )
    except EngineConfigError as exc:
        raise UsageError(str(exc)) from None


def _check_run_id(run_id: str) -> str:
    from ._identity import RUN_ID_VARIABLE

    if not run_id.strip():
        raise UsageError(f"--run-id {run_id!r}: a run id is 1-128 letters, digits, '.', '_' or '-'")
    try:
        checked = run_id_from_environment({RUN_ID_VARIABLE: run_id})
    except RankEnvironmentError as exc:
        raise UsageError(f"--run-id {run_id!r}: {exc.reason}") from None
    assert checked is not None
    return checked


def command_run(args: argparse.Namespace) -> int:
    """Validate everything up front (exit 2 on bad input), then launch."""
    launched = os.environ.get(CHILD_VARIABLE) == "1"
    under_launcher = "WORLD_SIZE" in os.environ or "RANK" in os.environ
    if args.run_id is not None:
        _check_run_id(args.run_id)
    profile = _profile(args)
    if args.nproc is not None and args.nproc > 1 and not launched:
        if under_launcher:
            raise UsageError(
                "--nproc starts local ranks itself; under torchrun leave it out "
                "(torchrun --nproc-per-node N -m orchestrator run ...)"
            )
        # Fail fast, before any process starts.
        faults = _faults(args, args.nproc)
        _config(args, args.nproc)
        return _launch(args, faults)
    try:
        identity = identity_from_environment()
    except RankEnvironmentError as exc:
        raise UsageError(str(exc)) from None
    faults = _faults(args, identity.world_size)
    config = _config(args, identity.world_size)
    return _run_rank(args, identity, config, profile, faults, launched)


# --- the launcher ---------------------------------------------------------------------


def _launch(args: argparse.Namespace, faults: FaultPlan) -> int:
    run_id = (
        _check_run_id(args.run_id)
        if args.run_id is not None
        else (run_id_from_environment() or new_run_id())
    )
    run_dir = args.run_dir or DEFAULT_RUNS / run_id
    grace_s = _grace(args)
    manifest = Manifest(
        run_id=run_id,
        command=(PROG, *args.argv),
        world_size=args.nproc,
        simulated=_simulated(args),
        injected=tuple(fault.describe() for fault in faults.faults),
    )
    # Claimed, and the manifest created exclusively, before any rank starts:
    # a second launch into the same directory stops here, having written
    # nothing, and can never report this run as its own.
    try:
        claim_run_directory(run_dir, run_id)
        manifest.write(run_dir, exclusive=True)
    except RunDirectoryError as exc:
        raise UsageError(str(exc)) from None
    rank_arguments = _rank_arguments(args.argv)
    print(f"{PROG}: run {run_id}: starting {args.nproc} ranks in {run_dir}", file=sys.stderr)
    try:
        exits = launch_local(
            args.nproc,
            rank_arguments,
            run_id=run_id,
            run_dir=run_dir,
            grace_s=grace_s,
            notify=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
            manifest=manifest,
        )
    except RunDirectoryError as exc:
        raise InputError(str(exc)) from None
    for exit in exits:
        if exit.returncode not in (0, 1):
            print(f"{PROG}: {exit.describe()}", file=sys.stderr)
    refused = [exit for exit in exits if exit.returncode == 2]
    if refused:
        # A rank refused to start (its own one-line error is above): what is
        # in the directory is not a run this launch made whole.
        ranks = ", ".join(str(exit.rank) for exit in refused)
        print(f"{PROG}: error: rank {ranks} refused to start; no report", file=sys.stderr)
        return 2
    return _report(args, [run_dir], hidden_warnings=True)


def _grace(args: argparse.Namespace) -> float:
    """``--grace``, else ``STARTUP_ORCHESTRATOR_GRACE_S``, else 10 s."""
    if args.grace is not None:
        return float(args.grace)
    text = os.environ.get(GRACE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_GRACE_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise UsageError(f"{GRACE_VARIABLE}={text!r}: expected seconds (> 0)")
    return value


def _rank_arguments(argv: list[str]) -> list[str]:
    """The launcher's own arguments minus those that only it uses."""
    out: list[str] = []
    skip = False
    for item in argv:
        if skip:
            skip = False
            continue
        if item in ("run",) and not out:
            continue
        if item in ("--nproc", "--run-dir", "--run-id", "--grace"):
            skip = True
            continue
        if item.startswith(("--nproc=", "--run-dir=", "--run-id=", "--grace=")) or item == "--json":
            continue
        out.append(item)
    return out


def _report(
    args: argparse.Namespace,
    paths: list[Path],
    *,
    own_rank: int | None = None,
    hidden_warnings: bool = False,
) -> int:
    """Print the run's report (or the JSON document); with ``own_rank``, the
    view of one rank that cannot wait for its peers: its own state and
    messages, the exit status its own outcome. With ``hidden_warnings`` (the
    launcher), first print on stderr, as the live stream would have, the
    WARNINGs scope kept off the terminal that no printing rank saw."""
    from events import merge, replay
    from exporters import report_json, report_text

    from ._cli_views import (
        decision_divergences,
        decision_divergences_text,
        with_decision_divergences,
    )

    run = read_run(paths)
    result = replay(run.contents, launch=run.launch)
    if hidden_warnings:
        from exporters import scope_hidden_warnings

        bridge = _logging_bridge(args.level)
        for message in scope_hidden_warnings(result.message_state):
            bridge.log(message)
    decisions = decision_divergences(merge(run.contents))
    document = with_decision_divergences(report_json(result), decisions)
    if own_rank is not None:
        print(
            f"{PROG}: rank {own_rank} reports only itself (its peers may still be running); "
            f"replay {paths[0]} once every rank has stopped for the whole run",
            file=sys.stderr,
        )
        document = {**document, "ranks": [r for r in document["ranks"] if r["rank"] == own_rank]}
    if args.json:
        emit(to_json_text(document))
    else:
        emit(report_text(result, min_severity=args.level, rank=own_rank))
        if decisions:
            emit(decision_divergences_text(decisions))
    if own_rank is not None:
        return 0 if result.outcome_of(own_rank).value == "ready" else 1
    return 0 if document["outcome"] == "ready" else 1


# --- one rank -------------------------------------------------------------------------


def _run_rank(
    args: argparse.Namespace,
    identity: RankIdentity,
    config: Any,
    profile: Any,
    faults: FaultPlan,
    launched: bool,
) -> int:
    launcher_pid = _launcher_pid() if launched else None
    stops = StopRequests(launcher_pid=launcher_pid)
    trace_parent = _trace_parent()
    run_id, early_group = _agree_run_id(args, identity)
    run_dir = args.run_dir or DEFAULT_RUNS / run_id
    try:
        claim_run_directory(run_dir, run_id)
    except RunDirectoryError as exc:
        raise UsageError(str(exc)) from None
    path = rank_log_path(run_dir, identity.rank)
    try:
        # Created exclusively: a stored log is never resumed or changed, and
        # of two runs started into one directory only one writes.
        log = JsonlLog(
            path,
            run_id=run_id,
            rank=identity.rank,
            durability=args.durability,
            exclusive=True,
        )
    except FileExistsError:
        raise UsageError(
            f"{path} already exists: run {run_id} already has a rank {identity.rank}; "
            "use a new --run-id or --run-dir"
        ) from None
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot write the run directory: {exc.strerror}") from None
    stops.install()
    if launcher_pid is not None:
        # A rank never outlives its launcher. Asked once the log is open and
        # stops are caught, so a launcher that is already gone is recorded.
        follow_launcher(launcher_pid)
    try:
        return _run_with_log(
            args,
            identity,
            config,
            profile,
            faults,
            launched,
            stops,
            log,
            run_dir,
            trace_parent,
            early_group,
        )
    finally:
        stops.restore()


def _run_with_log(
    args: argparse.Namespace,
    identity: RankIdentity,
    config: Any,
    profile: Any,
    faults: FaultPlan,
    launched: bool,
    stops: StopRequests,
    log: JsonlLog,
    run_dir: Path,
    trace_parent: tuple[str, str] | None,
    early_group: Any,
) -> int:
    from .engine import prepare_engine

    group = DeferredGroup()
    if early_group is not None:
        group.set(early_group)
    forms_group = early_group is None and identity.world_size > 1 and "MASTER_ADDR" in os.environ
    options: dict[str, Any] = {}
    if trace_parent is not None:
        options = {"trace_id": trace_parent[0], "parent_span_id": trace_parent[1]}
    finish = _FinishWatch()
    log.subscribe(finish)
    try:
        runner, graph = prepare_engine(
            config,
            log,
            identity=identity,
            profile=profile,
            faults=faults,
            group=group,
            simulated=_simulated(args),
            **options,
        )
        if forms_group:
            # Startup probes are quick; a peer that has not answered in two
            # minutes is gone, and the rank should say so rather than wait
            # the default 30.
            graph = graph.after(process_group_step(identity, group, timeout_s=120.0))
        # Recorded before any slow set-up: a rank killed from here on leaves
        # a log that says who it was and what it was doing.
        runner.begin(graph)
        tracing: _Tracing | None = None
        bridge = _logging_bridge(args.level)
        try:
            # The bridge first: span status reads the severities it derives.
            log.subscribe(bridge, from_seq=0)
            tracing = _Tracing(args, identity, bridge.severity_of, trace_parent)
            tracing.install_tracer_provider(log.run_id, identity)
            if tracing.live is not None:
                log.subscribe(tracing.live, from_seq=0)
            runner.span_activator = tracing.activator()
        except BaseException as exc:
            if stops.requested:
                runner.stopping(stops.cause())
            runner.abandon(exc)
            if tracing is not None:
                tracing.close()
            raise
        try:
            _execute(runner, graph, stops)
        finally:
            tracing.close()
    finally:
        log.close()
    outcome = finish.outcome or "failed"
    code = _finish_rank(args, identity, run_dir, group, outcome, launched, bridge)
    _print_next_steps(args, run_dir, identity, launched)
    return code


def _finish_rank(
    args: argparse.Namespace,
    identity: RankIdentity,
    run_dir: Path,
    group: DeferredGroup,
    outcome: str,
    launched: bool,
    bridge: Any,
) -> int:
    own_code = 0 if outcome == "ready" else 1
    if launched:
        # The launcher reads every rank's log when they have all stopped and
        # prints the WARNINGs scope kept off the terminal that the printing
        # rank did not see itself.
        return own_code
    if identity.world_size == 1 or group.group is None or outcome == "interrupted":
        # Nothing to agree with: print what this rank held back. (With no
        # process group the ranks cannot wait for each other, so each
        # reports only itself; an interrupted rank's peers may be gone, and
        # waiting for them could take the group's whole timeout.)
        bridge.release()
        if identity.world_size == 1:
            return _report(args, [run_dir])
        return _report(args, [run_dir], own_rank=identity.rank)
    # Under torchrun every rank ends here; rank 0 reports the whole run
    # once every rank has closed its log. The exchange is tagged: a rank
    # that left early may meet its peers still inside the startup's own
    # exchanges, and both sides must see that rather than misread it. It
    # also tells each rank which WARNINGs the rank printing for their
    # scope derived, so a rank prints the ones only it saw.
    derived: list[JsonValue] = [
        [message.code, message.text]
        for message in bridge.state.messages(identity.rank)
        if message.severity is Severity.WARNING
    ]
    try:
        gathered = group.all_gather(
            {
                "exchange": _END_OF_RUN,
                "outcome": outcome,
                "node_rank": identity.node_rank,
                "local_rank": identity.local_rank,
                "warnings": derived,
            }
        )
        everyone_finished = all(
            isinstance(entry, dict) and entry.get("exchange") == _END_OF_RUN for entry in gathered
        )
    except Exception:
        gathered, everyone_finished = [], False
    finally:
        with contextlib.suppress(Exception):
            group.close()
    if everyone_finished:
        printed_by = _printed_warnings(gathered, identity)
        bridge.release(
            lambda message: (message.code, message.text) in printed_by.get(message.scope, set())
        )
    else:
        bridge.release()
    if identity.rank != 0:
        return own_code
    if not everyone_finished:
        # Ranks that reached the end have closed their logs; the others
        # show as still running. Replay later gives the final picture.
        print(
            f"{PROG}: not every rank reached the end of the startup together; "
            f"replay {run_dir} once every rank has stopped for the final report",
            file=sys.stderr,
        )
    return _report(args, [run_dir])


def _printed_warnings(
    gathered: list[Any], identity: RankIdentity
) -> dict[Any, set[tuple[str, str]]]:
    """The WARNINGs a lower rank derived, by scope: of this node (scope
    ``local``: local rank 0 printed them, or a lower rank releases them) or of
    the world (scope ``global``). This rank prints only the others."""
    from events import Scope

    local: set[tuple[str, str]] = set()
    world: set[tuple[str, str]] = set()
    for rank, entry in enumerate(gathered):
        if rank >= identity.rank or not isinstance(entry, dict):
            continue
        keys = {(str(code), str(text)) for code, text in entry.get("warnings", [])}
        world |= keys
        if entry.get("node_rank") == identity.node_rank:
            local |= keys
    return {Scope.LOCAL: local, Scope.GLOBAL: world}


def _print_next_steps(
    args: argparse.Namespace, run_dir: Path, identity: RankIdentity, launched: bool
) -> None:
    """Where the record is and what to do with it (stderr: stdout is the
    report, or the JSON document)."""
    if launched or identity.rank != 0:
        return
    print(
        f"{PROG}: the run's logs are in {run_dir}; replay {run_dir} for the report, "
        f"explain {run_dir} for every step",
        file=sys.stderr,
    )


class _FinishWatch:
    """Remembers the outcome ``run.finished`` recorded."""

    def __init__(self) -> None:
        self.outcome: str | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunFinished):
            self.outcome = event.outcome.value


def _launcher_pid() -> int | None:
    text = os.environ.get(LAUNCHER_PID_VARIABLE, "").strip()
    return int(text) if text.isdigit() else None


def _trace_parent() -> tuple[str, str] | None:
    """The launcher's ``TRACEPARENT``, checked before the log opens."""
    traceparent = os.environ.get("TRACEPARENT", "").strip()
    if not traceparent:
        return None
    from exporters import parse_traceparent

    try:
        parsed = parse_traceparent(traceparent)
    except ValueError as exc:
        raise UsageError(f"TRACEPARENT={traceparent!r}: {exc}") from None
    return parsed.trace_id, parsed.span_id


#: Tags the ranks' last exchange (see _run_rank).
_END_OF_RUN = "run.finished"


def _agree_run_id(args: argparse.Namespace, identity: RankIdentity) -> tuple[str, Any]:
    """The run id, and the process group when forming it was the only way to
    agree on one.

    The id comes from ``--run-id`` or the launcher's environment (our
    launcher's variable, torchrun's ``--rdzv-id``), so the log opens before
    anything slow. Only a torchrun launch without ``--rdzv-id`` (multi-node
    with an explicit rendezvous) has no shared id: its ranks form the
    process group first and take rank 0's choice.
    """
    if args.run_id is not None:
        return _check_run_id(args.run_id), None
    try:
        found = run_id_from_environment()
    except RankEnvironmentError as exc:
        raise UsageError(str(exc)) from None
    if found is not None:
        return found, None
    group = _process_group(identity)
    if group is not None:
        # torchrun without a run id: rank 0's choice, shared through the group.
        proposals = group.all_gather(new_run_id())
        return str(proposals[0]), group
    if "MASTER_PORT" in os.environ and "WORLD_SIZE" in os.environ and identity.world_size > 1:
        raise UsageError(
            "the ranks of this launch share no run id; set TORCHELASTIC_RUN_ID "
            "(torchrun --rdzv-id) or pass --run-id"
        )
    return new_run_id(), None


def _process_group(identity: RankIdentity) -> Any:
    if identity.world_size < 2 or "MASTER_ADDR" not in os.environ:
        return None
    from ._group import init_torch_distributed_group

    return init_torch_distributed_group(identity, timeout_s=120.0)


def _logging_bridge(level: Severity) -> Any:
    from exporters import MESSAGE_LOGGER_PREFIX, LoggingBridge

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)-7s %(message)s"))
    logger = logging.getLogger(MESSAGE_LOGGER_PREFIX)
    logger.addHandler(handler)
    logger.setLevel(int(level))
    logger.propagate = False
    return LoggingBridge(hold_warnings=True)


class _Tracing:
    """Live spans for this rank, wired from the options and environment.

    Spans go to every exporter asked for (OTLP from the options or the
    standard variables, a Jaeger JSON file, the console); with none, tracing
    costs nothing. The trace parent comes from the launcher's TRACEPARENT.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        identity: RankIdentity,
        severity_of: Any,
        parent: tuple[str, str] | None,
    ) -> None:
        self.live: Any = None
        self.parent = parent
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            return
        wanted = self._exporters(args, identity)
        if wanted:
            from exporters import LiveSpans, combine_exporters

            self.live = LiveSpans(combine_exporters(*wanted), severity_of=severity_of)

    @staticmethod
    def _exporters(args: argparse.Namespace, identity: RankIdentity) -> list[Any]:
        needs_exporters = (
            args.otlp_endpoint
            or args.trace_file is not None
            or args.console_spans
            or os.environ.get("OTEL_TRACES_EXPORTER")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )
        if not needs_exporters:
            return []
        from exporters import (
            JaegerJsonExporter,
            console_exporter,
            exporter_from_environment,
            otlp_exporter,
        )

        wanted: list[Any] = []
        try:
            if args.otlp_endpoint:
                protocol = args.otlp_protocol or "grpc"
                wanted.append(
                    otlp_exporter(protocol, endpoint=_otlp_endpoint(args.otlp_endpoint, protocol))
                )
            else:
                from_environment = exporter_from_environment()
                if from_environment is not None:
                    wanted.append(from_environment)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.trace_file is not None:
            path = args.trace_file
            if identity.world_size > 1:
                path = path.with_name(f"{path.stem}-rank-{identity.rank}{path.suffix}")
            wanted.append(JaegerJsonExporter(path))
        if args.console_spans:
            wanted.append(console_exporter(sys.stderr))
        return wanted

    def activator(self) -> Any:
        """Makes a step's span current while it runs (only when tracing)."""
        if self.live is None:
            return None
        from exporters import activate_span

        return activate_span

    def install_tracer_provider(self, run_id: str, identity: RankIdentity) -> None:
        """Route spans that probe code creates with the OpenTelemetry API
        through the same queue as the step spans, under this rank's resource
        (they nest under the step that was current)."""
        if self.live is None:
            return
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider

        resource = Resource.create(
            {
                "service.instance.id": f"{run_id}/rank-{identity.rank}",
                "startup.run_id": run_id,
                "startup.rank": identity.rank,
                "startup.local_rank": identity.local_rank,
                "startup.world_size": identity.world_size,
            }
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(self.live.span_processor)
        trace.set_tracer_provider(provider)

    def close(self) -> None:
        if self.live is not None:
            self.live.shutdown(timeout_s=5.0)


def _otlp_endpoint(url: str, protocol: str) -> str:
    """The URL to give the OTLP exporter for ``--otlp-endpoint``.

    OTLP/HTTP posts to the full traces URL; a collector address without a
    path (``http://collector:4318``) gets ``/v1/traces``, as the generic
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` does. A URL with a path is used as given.
    """
    if protocol != "http/protobuf":
        return url
    from urllib.parse import urlsplit

    if urlsplit(url).path in ("", "/"):
        return f"{url.rstrip('/')}/v1/traces"
    return url


def _execute(runner: Any, graph: Any, stops: StopRequests) -> None:
    """Run ``graph`` in an event loop that turns SIGINT/SIGTERM into a
    recorded interruption. Whatever ends the run (ready, a failure, a
    BaseException from a probe, a stop) is in the log when this returns;
    nothing is raised."""

    async def main() -> None:
        with anyio.CancelScope() as scope:

            def stop(signum: int) -> None:
                runner.stopping(stops.cause())
                scope.cancel()

            async with anyio.create_task_group() as group_:

                async def watch_signals(*, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        task_status.started()
                        async for signum in signals:
                            stops.record(signum)

                await group_.start(watch_signals)
                stops.on_signal = stop
                if stops.requested:
                    # Asked to stop before the loop ran: the run begins
                    # cancelled and records that at once.
                    stop(stops.received[0])
                try:
                    await runner.run(graph)
                except anyio.get_cancelled_exc_class():
                    raise
                except BaseException:
                    # Recorded in the log (run.finished names it); the
                    # report says it, never a traceback.
                    pass
                finally:
                    group_.cancel_scope.cancel()

    # A KeyboardInterrupt here is a second Ctrl-C while the loop was
    # shutting down: the log already holds the run's end.
    with contextlib.suppress(KeyboardInterrupt):
        anyio.run(main)
