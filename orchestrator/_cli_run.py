"""``startup-orchestrator run``: one rank, or a local launch of N ranks.

A rank opens its JSON Lines log in the run directory, wires live tracing and
the logging bridge to the log, runs the reference engine graph, and flushes
everything — on success, on failure and on SIGINT/SIGTERM (the run is then
recorded ``interrupted``). The launcher (``--nproc N``) starts the ranks,
waits, then prints the same report ``replay`` prints for the run directory.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio

from events import Durability, JsonlLog, RankIdentity, Severity

from ._cli import DEFAULT_RUNS, PROG, InputError, UsageError, emit, read_logs, to_json_text
from ._errors import FaultSpecError, RankEnvironmentError
from ._faults import FaultPlan
from ._identity import identity_from_environment, new_run_id, run_id_from_environment
from ._launcher import CHILD_VARIABLE, launch_local

__all__ = ["command_run"]


def _faults(args: argparse.Namespace) -> FaultPlan:
    try:
        plan = FaultPlan.parse(args.inject)
        if args.inject_file is not None:
            plan = plan + FaultPlan.load(args.inject_file)
    except FaultSpecError as exc:
        raise UsageError(str(exc)) from None
    return plan


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

    try:
        checked = run_id_from_environment({RUN_ID_VARIABLE: run_id})
    except RankEnvironmentError as exc:
        raise UsageError(f"--run-id {run_id!r}: {exc.reason}") from None
    assert checked is not None
    return checked


def command_run(args: argparse.Namespace) -> int:
    """Validate everything up front (exit 2 on bad input), then launch."""
    faults = _faults(args)
    profile = _profile(args)
    launched = os.environ.get(CHILD_VARIABLE) == "1"
    under_launcher = "WORLD_SIZE" in os.environ or "RANK" in os.environ
    if args.nproc is not None and args.nproc > 1 and not launched:
        if under_launcher:
            raise UsageError(
                "--nproc starts local ranks itself; under torchrun leave it out "
                "(torchrun --nproc-per-node N -m orchestrator run ...)"
            )
        _config(args, args.nproc)  # fail fast, before any process starts
        return _launch(args)
    try:
        identity = identity_from_environment()
    except RankEnvironmentError as exc:
        raise UsageError(str(exc)) from None
    config = _config(args, identity.world_size)
    return _run_rank(args, identity, config, profile, faults, launched)


# --- the launcher ---------------------------------------------------------------------


def _launch(args: argparse.Namespace) -> int:
    run_id = (
        _check_run_id(args.run_id) if args.run_id else (run_id_from_environment() or new_run_id())
    )
    run_dir = args.run_dir or DEFAULT_RUNS / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    rank_arguments = _rank_arguments(args.argv)
    print(f"{PROG}: run {run_id}: starting {args.nproc} ranks in {run_dir}", file=sys.stderr)
    exits = launch_local(args.nproc, rank_arguments, run_id=run_id, run_dir=run_dir)
    for exit in exits:
        if exit.returncode not in (0, 1):
            print(f"{PROG}: {exit.describe()}", file=sys.stderr)
    return _report(args, [run_dir])


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
        if item in ("--nproc", "--run-dir", "--run-id"):
            skip = True
            continue
        if item.startswith(("--nproc=", "--run-dir=", "--run-id=")) or item == "--json":
            continue
        out.append(item)
    return out


def _report(args: argparse.Namespace, paths: list[Path]) -> int:
    from events import replay
    from exporters import report_json, report_text

    result = replay(read_logs(paths))
    if args.json:
        emit(to_json_text(report_json(result)))
    else:
        emit(report_text(result, min_severity=args.level))
    outcome = report_json(result)["outcome"]
    return 0 if outcome == "ready" else 1


# --- one rank -------------------------------------------------------------------------


def _run_rank(
    args: argparse.Namespace,
    identity: RankIdentity,
    config: Any,
    profile: Any,
    faults: FaultPlan,
    launched: bool,
) -> int:
    group = _process_group(identity)
    run_id = _agree_run_id(args, group)
    run_dir = args.run_dir or DEFAULT_RUNS / run_id
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        log = JsonlLog(
            run_dir / f"rank-{identity.rank}.jsonl",
            run_id=run_id,
            rank=identity.rank,
            durability=Durability(args.durability),
        )
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot write the run directory: {exc.strerror}") from None
    if log.next_seq:
        log.close()
        raise UsageError(f"{log.path} already holds a run; use a new --run-id or --run-dir")
    bridge = _logging_bridge(args.level)
    try:
        tracing = _Tracing(args, identity, bridge.severity_of)
    except UsageError:
        log.close()
        raise
    try:
        # The bridge first: span status reads the severities it derives.
        log.subscribe(bridge)
        if tracing.live is not None:
            log.subscribe(tracing.live)
        outcome = _execute(log, identity, config, profile, faults, group, tracing)
    finally:
        log.close()
        tracing.close()
    own_code = 0 if outcome == "ready" else 1
    if launched:
        return own_code
    if identity.world_size > 1:
        if group is None:
            # No process group: ranks cannot wait for each other, so each
            # reports only itself.
            return _report(args, [run_dir / f"rank-{identity.rank}.jsonl"])
        if outcome == "interrupted":
            # Peers may be gone; waiting for them could take the group's
            # whole timeout. The log is complete; report this rank only.
            return _report(args, [run_dir / f"rank-{identity.rank}.jsonl"])
        # Under torchrun every rank ends here; rank 0 reports the whole run
        # once every rank has closed its log.
        try:
            group.all_gather(outcome)
        except Exception:
            return own_code
        finally:
            with contextlib.suppress(Exception):
                group.close()
        if identity.rank != 0:
            return own_code
    return _report(args, [run_dir])


def _agree_run_id(args: argparse.Namespace, group: Any) -> str:
    if args.run_id:
        return _check_run_id(args.run_id)
    try:
        found = run_id_from_environment()
    except RankEnvironmentError as exc:
        raise UsageError(str(exc)) from None
    if found is not None:
        return found
    if group is not None:
        # torchrun without a run id: rank 0's choice, shared through the group.
        proposals = group.all_gather(new_run_id())
        return str(proposals[0])
    if "MASTER_PORT" in os.environ and "WORLD_SIZE" in os.environ:
        raise UsageError(
            "the ranks of this launch share no run id; set TORCHELASTIC_RUN_ID "
            "(torchrun --rdzv-id) or pass --run-id"
        )
    return new_run_id()


def _process_group(identity: RankIdentity) -> Any:
    if identity.world_size < 2 or "MASTER_ADDR" not in os.environ:
        return None
    from ._group import init_torch_distributed_group

    # Startup probes are quick; a peer that has not answered in two minutes
    # is gone, and the rank should say so rather than wait the default 30.
    return init_torch_distributed_group(identity, timeout_s=120.0)


def _logging_bridge(level: Severity) -> Any:
    from exporters import MESSAGE_LOGGER_PREFIX, LoggingBridge

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)-7s %(message)s"))
    logger = logging.getLogger(MESSAGE_LOGGER_PREFIX)
    logger.addHandler(handler)
    logger.setLevel(int(level))
    logger.propagate = False
    return LoggingBridge()


class _Tracing:
    """Live spans for this rank, wired from the options and environment.

    Spans go to every exporter asked for (OTLP from the options or the
    standard variables, a Jaeger JSON file, the console); with none, tracing
    costs nothing. The trace parent comes from the launcher's TRACEPARENT.
    """

    def __init__(self, args: argparse.Namespace, identity: RankIdentity, severity_of: Any) -> None:
        self.live: Any = None
        self.parent: tuple[str, str] | None = None
        traceparent = os.environ.get("TRACEPARENT", "").strip()
        if traceparent:
            from exporters import parse_traceparent

            try:
                parsed = parse_traceparent(traceparent)
            except ValueError as exc:
                raise UsageError(f"TRACEPARENT={traceparent!r}: {exc}") from None
            self.parent = (parsed.trace_id, parsed.span_id)
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
                wanted.append(
                    otlp_exporter(args.otlp_protocol or "grpc", endpoint=args.otlp_endpoint)
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
        from opentelemetry import context as otel_context

        from exporters import context_with_span

        @contextlib.contextmanager
        def activate(trace_id: str, span_id: str) -> Iterator[None]:
            token = otel_context.attach(context_with_span(trace_id, span_id))
            try:
                yield
            finally:
                otel_context.detach(token)

        return activate

    def close(self) -> None:
        if self.live is not None:
            self.live.shutdown(timeout_s=5.0)


def _execute(
    log: JsonlLog,
    identity: RankIdentity,
    config: Any,
    profile: Any,
    faults: FaultPlan,
    group: Any,
    tracing: _Tracing,
) -> str:
    from .engine import run_engine

    options: Mapping[str, Any] = {
        "identity": identity,
        "profile": profile,
        "faults": faults,
        "group": group,
        "span_activator": tracing.activator(),
    }
    if tracing.parent is not None:
        options = {**options, "trace_id": tracing.parent[0], "parent_span_id": tracing.parent[1]}

    async def main() -> str:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group_:

                async def watch_signals() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            scope.cancel()
                            return

                group_.start_soon(watch_signals)
                try:
                    await run_engine(config, log, **options)
                    return "ready"
                except Exception:
                    return "failed"
                finally:
                    group_.cancel_scope.cancel()
        return "interrupted"

    try:
        outcome = anyio.run(main)
    except KeyboardInterrupt:
        outcome = "interrupted"
    return outcome
