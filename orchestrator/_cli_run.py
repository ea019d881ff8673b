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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

from events import JsonlLog, RankIdentity, Severity

from ._cli import DEFAULT_RUNS, PROG, InputError, UsageError, emit, read_logs, to_json_text
from ._errors import FaultSpecError, RankEnvironmentError
from ._faults import FaultPlan
from ._identity import identity_from_environment, new_run_id, run_id_from_environment
from ._launcher import CHILD_VARIABLE, DEFAULT_GRACE_S, GRACE_VARIABLE, launch_local

__all__ = ["command_run"]


def _faults(args: argparse.Namespace) -> FaultPlan:
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
    # Every rank would refuse it; checked here so that the report is never
    # that of the run already stored there.
    for path in sorted(run_dir.glob("rank-*.jsonl")):
        if path.stat().st_size > 0:
            raise UsageError(f"{path} already holds a run; use a new --run-id or --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot write the run directory: {exc.strerror}") from None
    rank_arguments = _rank_arguments(args.argv)
    grace_s = _grace(args)
    print(f"{PROG}: run {run_id}: starting {args.nproc} ranks in {run_dir}", file=sys.stderr)
    exits = launch_local(
        args.nproc,
        rank_arguments,
        run_id=run_id,
        run_dir=run_dir,
        grace_s=grace_s,
        notify=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True),
    )
    for exit in exits:
        if exit.returncode not in (0, 1):
            print(f"{PROG}: {exit.describe()}", file=sys.stderr)
    return _report(args, [run_dir])


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


def _report(args: argparse.Namespace, paths: list[Path]) -> int:
    from events import merge, replay
    from exporters import report_json, report_text

    from ._cli_views import (
        decision_divergences,
        decision_divergences_text,
        with_decision_divergences,
    )

    contents = read_logs(paths)
    result = replay(contents)
    decisions = decision_divergences(merge(contents))
    document = with_decision_divergences(report_json(result), decisions)
    if args.json:
        emit(to_json_text(document))
    else:
        emit(report_text(result, min_severity=args.level))
        if decisions:
            emit(decision_divergences_text(decisions))
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
    group = _process_group(identity)
    run_id = _agree_run_id(args, group)
    run_dir = args.run_dir or DEFAULT_RUNS / run_id
    path = run_dir / f"rank-{identity.rank}.jsonl"
    # Checked before the log is opened: opening an existing log resumes it
    # (and would cut a torn tail off), and a stored run is never changed.
    with contextlib.suppress(OSError):
        if path.stat().st_size > 0:
            raise UsageError(f"{path} already holds a run; use a new --run-id or --run-dir")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        log = JsonlLog(path, run_id=run_id, rank=identity.rank, durability=args.durability)
    except OSError as exc:
        raise InputError(f"{run_dir}: cannot write the run directory: {exc.strerror}") from None
    bridge = _logging_bridge(args.level)
    try:
        tracing = _Tracing(args, identity, bridge.severity_of)
        tracing.install_tracer_provider(run_id, identity)
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
        # once every rank has closed its log. The exchange is tagged: a rank
        # that left early may meet its peers still inside the startup's own
        # exchanges, and both sides must see that rather than misread it.
        try:
            gathered = group.all_gather({"exchange": _END_OF_RUN, "outcome": outcome})
            everyone_finished = all(
                isinstance(entry, dict) and entry.get("exchange") == _END_OF_RUN
                for entry in gathered
            )
        except Exception:
            everyone_finished = False
        finally:
            with contextlib.suppress(Exception):
                group.close()
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


#: Tags the ranks' last exchange (see _run_rank).
_END_OF_RUN = "run.finished"


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
