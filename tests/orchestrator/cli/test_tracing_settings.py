"""A value the project does not support in an ``OTEL_*`` variable never
stops a startup: one warning line, tracing falls back or turns off, and the
log is complete."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from events import RunFinished, RunOutcome, validate
from tests.exporters.otlp_receivers import GrpcReceiver, HttpReceiver, OtlpReceiver
from tests.exporters.tracing_harness import (
    cli_environment,
    closed_port,
    expected_span_ids,
    run_cli,
    run_events,
)

pytestmark = pytest.mark.slow

ENGINE_MESSAGE = re.compile(
    r"^(DEBUG|INFO|WARNING|ERROR)\s+\[rank \d+\] |^startup-orchestrator: the run's logs are in "
)


@pytest.mark.parametrize(
    ("receiver_type", "variables", "warning", "exported"),
    [
        (
            HttpReceiver,
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            "OTEL_EXPORTER_OTLP_PROTOCOL='http/json' not supported",
            True,  # sent as http/protobuf, which every OTLP/HTTP receiver takes
        ),
        (
            GrpcReceiver,
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"},
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='thrift' not supported",
            True,  # the default, grpc
        ),
        (
            GrpcReceiver,
            {"OTEL_TRACES_EXPORTER": "zipkin"},
            "OTEL_TRACES_EXPORTER: 'zipkin' not supported",
            False,  # nothing left to export with: tracing is off
        ),
        (
            GrpcReceiver,
            {"OTEL_TRACES_EXPORTER": "otlp,zipkin"},
            "exporting with otlp only",
            True,
        ),
        (
            GrpcReceiver,
            {"OTEL_TRACES_SAMPLER": "sometimes"},
            "OTEL_TRACES_SAMPLER='sometimes' not supported",
            True,  # parentbased_always_on
        ),
        (
            GrpcReceiver,
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"},
            "OTEL_TRACES_SAMPLER_ARG='half' is not a ratio",
            True,  # ratio 1.0
        ),
        (
            GrpcReceiver,
            {"OTEL_EXPORTER_OTLP_TIMEOUT": "soon"},
            "OTEL_EXPORTER_OTLP_TIMEOUT='soon' is not a positive number",
            True,
        ),
        (
            GrpcReceiver,
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://[::1"},
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT='http://[::1' is not a URL",
            False,  # nowhere to send them
        ),
        (
            GrpcReceiver,
            # OpenTelemetry printed each bad entry, token and all, twice.
            {"OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=a,Authorization: Bearer s3cr3t"},
            "OTEL_EXPORTER_OTLP_HEADERS: an entry is not name=value",
            True,  # with the entries that are
        ),
    ],
    ids=[
        "http-json",
        "thrift",
        "zipkin",
        "otlp-and-zipkin",
        "sampler",
        "ratio",
        "timeout",
        "endpoint",
        "headers",
    ],
)
def test_an_unsupported_value_warns_once_and_the_run_goes_on(
    receiver_type: type[OtlpReceiver],
    variables: dict[str, str],
    warning: str,
    exported: bool,
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    with receiver_type() as receiver:
        done = run_cli(
            "run", "--simulate", "h200x8", "--run-dir", str(run_dir),
            env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, **variables),
            cwd=tmp_path,
        )  # fmt: skip
        received = receiver.spans()

    assert done.returncode == 0, done.stderr
    others = [line for line in done.stderr.splitlines() if not ENGINE_MESSAGE.match(line)]
    assert len(others) == 1, done.stderr
    assert others[0].startswith("tracing: ")
    assert warning in others[0]
    [log_path] = run_dir.glob("rank-*.jsonl")
    assert validate(log_path) == []
    events = run_events(run_dir)
    assert isinstance(events[-1], RunFinished)
    assert events[-1].outcome is RunOutcome.READY
    expected = expected_span_ids(events)
    assert {span.span_id for span in received} == (expected if exported else set())


def test_the_ranks_of_a_launch_warn_once_between_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", str(run_dir),
        env=cli_environment(
            OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{closed_port()}",
            OTEL_EXPORTER_OTLP_PROTOCOL="http/json",
            OTEL_TRACES_SAMPLER="sometimes",
        ),
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len([line for line in lines if "'http/json' not supported" in line]) == 1, done.stderr
    assert len([line for line in lines if "'sometimes' not supported" in line]) == 1, done.stderr
    assert len([line for line in lines if line.startswith("could not export")]) == 1, done.stderr
    assert len(list(run_dir.glob("rank-*.jsonl"))) == 2


def test_a_launch_with_an_endpoint_that_is_not_a_url_runs_without_export(tmp_path: Path) -> None:
    # Its ranks failed with "error: Invalid IPv6 URL", and the launcher
    # ended in a traceback.
    run_dir = tmp_path / "run"
    done = run_cli(
        "run", "--simulate", "h200x8", "--nproc", "2", "--run-dir", str(run_dir),
        env=cli_environment(OTEL_EXPORTER_OTLP_ENDPOINT="http://[::1"),
        cwd=tmp_path,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("tracing: ")]
    assert warnings == [
        "tracing: OTEL_EXPORTER_OTLP_ENDPOINT='http://[::1' is not a URL "
        "(Invalid IPv6 URL); not exporting over OTLP"
    ], done.stderr
    assert len(list(run_dir.glob("rank-*.jsonl"))) == 2


def test_an_explicit_endpoint_takes_its_protocol_from_the_variables(tmp_path: Path) -> None:
    # --help says --otlp-protocol defaults to $OTEL_EXPORTER_OTLP_PROTOCOL:
    # the spans went over gRPC to the OTLP/HTTP collector, and were lost.
    run_dir = tmp_path / "run"
    with HttpReceiver() as receiver:
        done = run_cli(
            "run", "--simulate", "h200x8", "--run-dir", str(run_dir),
            "--otlp-endpoint", receiver.endpoint,
            env=cli_environment(OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf"),
            cwd=tmp_path,
        )  # fmt: skip
        received = receiver.spans()

    assert done.returncode == 0, done.stderr
    assert "could not export" not in done.stderr
    expected = expected_span_ids(run_events(run_dir))
    assert {span.span_id for span in received} == expected
