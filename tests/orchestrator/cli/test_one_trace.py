"""Eight real rank processes started by the command line send the engine
graph to an in-test OTLP receiver as one trace (SPEC §4, §5).

Two launches, shared by the tests of this module (each takes seconds: every
rank imports torch for its gloo process group):

- OTLP/gRPC from ``--otlp-endpoint``/``--otlp-protocol``, with an injected
  dlopen failure on rank 3's FLASH_ATTN probe and Jaeger JSON files on the
  side; no launcher ``TRACEPARENT``, so the trace id comes from the run id.
- OTLP/HTTP from the standard ``OTEL_EXPORTER_OTLP_*`` variables, under a
  launcher span named in ``TRACEPARENT``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from events import Event, RunStarted, StepStarted, StepUnavailable, launch_span_id, replay
from exporters import export_events, otlp_exporter
from orchestrator._run_directory import read_run_directory
from orchestrator._runner import derive_trace_id
from orchestrator.engine import ENGINE
from tests.exporters.otlp_receivers import GrpcReceiver, HttpReceiver, ReceivedSpan
from tests.exporters.tracing_harness import cli_environment, expected_span_ids, run_cli, run_events

pytestmark = pytest.mark.slow

RANKS = 8
INJECTED_MESSAGE = "libcuda.so.1: cannot open shared object file"
INJECTED = f"3:attention/FLASH_ATTN=OSError:{INJECTED_MESSAGE}"
LAUNCHER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
LAUNCHER_SPAN_ID = "00f067aa0ba902b7"
STATUS_UNSET = 0


@attrs.frozen(kw_only=True)
class Launch:
    """A finished ``run --nproc 8``: its run directory, the events of every
    rank, and the spans the receiver got."""

    run_dir: Path
    events: list[Event]
    #: every rank's spans
    spans: list[ReceivedSpan]
    #: the launch's own span, which the launcher sent once the ranks ended
    launch_span: ReceivedSpan
    stderr: str

    @property
    def run_id(self) -> str:
        return self.events[0].run_id

    def span(self, rank: int, name: str) -> ReceivedSpan:
        [found] = [s for s in self.spans if s.resource["startup.rank"] == rank and s.name == name]
        return found

    def rank_spans(self, rank: int) -> dict[str, ReceivedSpan]:
        return {s.name: s for s in self.spans if s.resource["startup.rank"] == rank}

    def recorded(self, rank: int, step: str, cls: type[Event]) -> Event:
        [found] = [
            e for e in self.events if isinstance(e, cls) and (e.rank, e.step) == (rank, step)
        ]
        return found


def launch(
    run_dir: Path, receiver: GrpcReceiver | HttpReceiver, *options: str, **env: str
) -> Launch:
    done = run_cli(
        "run", "--simulate", "h200x8", "--nproc", str(RANKS), "--run-dir", str(run_dir), *options,
        env=cli_environment(**env),
        cwd=run_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = run_events(run_dir)
    spans = receiver.wait_for_spans(len(expected_span_ids(events)) + 1, timeout=30.0)
    [own] = [span for span in spans if "startup.rank" not in span.resource]
    ranks = [span for span in spans if span is not own]
    return Launch(run_dir=run_dir, events=events, spans=ranks, launch_span=own, stderr=done.stderr)


@pytest.fixture(scope="module")
def grpc_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    run_dir = tmp_path_factory.mktemp("grpc")
    with GrpcReceiver() as receiver:
        yield launch(
            run_dir,
            receiver,
            "--otlp-endpoint", receiver.endpoint,
            "--otlp-protocol", "grpc",
            "--trace-file", str(run_dir / "trace.json"),
            "--inject", INJECTED,
        )  # fmt: skip


@pytest.fixture(scope="module")
def http_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launch]:
    run_dir = tmp_path_factory.mktemp("http")
    with HttpReceiver() as receiver:
        yield launch(
            run_dir,
            receiver,
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
            OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
            TRACEPARENT=f"00-{LAUNCHER_TRACE_ID}-{LAUNCHER_SPAN_ID}-01",
        )


@pytest.fixture(params=["grpc", "http/protobuf"])
def any_launch(request: pytest.FixtureRequest) -> Launch:
    name = "grpc_launch" if request.param == "grpc" else "http_launch"
    found: Launch = request.getfixturevalue(name)
    return found


def test_every_span_of_every_rank_arrives_once_in_one_trace(any_launch: Launch) -> None:
    received = [span.span_id for span in any_launch.spans]
    assert sorted(received) == sorted(expected_span_ids(any_launch.events))
    assert len({span.trace_id for span in any_launch.spans}) == 1
    # Exports worked, so no rank complained.
    assert "could not export" not in any_launch.stderr


def test_each_rank_is_its_own_resource(any_launch: Launch) -> None:
    resources = {span.resource["startup.rank"]: span.resource for span in any_launch.spans}
    assert sorted(resources) == list(range(RANKS))
    started = {e.rank: e for e in any_launch.events if isinstance(e, RunStarted)}
    for rank, resource in resources.items():
        assert resource["service.name"] == "startup-orchestrator"
        assert resource["service.instance.id"] == f"{any_launch.run_id}/rank-{rank}"
        assert resource["startup.run_id"] == any_launch.run_id
        assert resource["startup.world_size"] == RANKS
        assert resource["startup.local_rank"] == rank
        assert resource["process.pid"] == started[rank].pid
    assert len({span.resource["process.pid"] for span in any_launch.spans}) == RANKS
    assert {span.scope_name for span in any_launch.spans} == {"startup-orchestrator"}


def test_spans_nest_as_the_graph_nests(any_launch: Launch) -> None:
    for rank in range(RANKS):
        spans = any_launch.rank_spans(rank)
        root = spans[f"startup rank {rank}"]

        def parent_of(name: str, spans: dict[str, ReceivedSpan] = spans) -> str | None:
            return spans[name].parent_span_id

        for step in ("platform", "attention", "flashinfer_comm", "allreduce_workspace"):
            assert parent_of(step) == root.span_id, (rank, step)
        for plugin in ("tpu", "cuda", "rocm", "xpu", "cpu"):
            assert parent_of(f"platform/{plugin}") == spans["platform"].span_id
        for backend in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION"):
            assert parent_of(f"attention/{backend}") == spans["attention"].span_id
        workspace = spans["allreduce_workspace"].span_id
        mnnvl, trtllm = spans["allreduce_workspace/mnnvl"], spans["allreduce_workspace/trtllm"]
        assert mnnvl.parent_span_id == workspace
        assert trtllm.parent_span_id == workspace
        # The fallback chain in order: trtllm is tried after mnnvl failed.
        assert trtllm.span.start_time_unix_nano >= mnnvl.span.end_time_unix_nano


def test_a_recovered_fallback_is_a_warning_not_an_error(any_launch: Launch) -> None:
    # A healthy start: no span is ERROR (Jaeger lists no errors, the service
    # is not red); the recovered fallback says what happened by its severity
    # and its exception event, the same way on every rank.
    errors = {(s.resource["startup.rank"], s.name) for s in any_launch.spans if s.status_code}
    assert errors == set()
    for rank in range(RANKS):
        mnnvl = any_launch.span(rank, "allreduce_workspace/mnnvl")
        assert mnnvl.status_code == STATUS_UNSET
        [(name, _, attributes)] = mnnvl.events
        assert name == "exception"
        assert "NVSwitch multicast" in attributes["exception.message"]
        assert mnnvl.attributes["startup.severity"] == "WARNING"
        assert mnnvl.attributes["startup.outcome"] == "unavailable"
        # The fallback recovered: the workspace step and the run are not red.
        assert any_launch.span(rank, "allreduce_workspace").status_code == STATUS_UNSET
        assert any_launch.span(rank, f"startup rank {rank}").status_code == STATUS_UNSET


def test_the_failed_attempt_carries_its_exception(any_launch: Launch) -> None:
    for rank in range(RANKS):
        ended = any_launch.recorded(rank, "allreduce_workspace/mnnvl", StepUnavailable)
        assert isinstance(ended, StepUnavailable)
        assert ended.cause is not None
        [event] = any_launch.span(rank, "allreduce_workspace/mnnvl").events
        name, time_unix_nano, attributes = event
        assert name == "exception"
        assert time_unix_nano == ended.wall_ns
        assert attributes["exception.type"] == ended.cause.type == "RuntimeError"
        assert attributes["exception.message"] == ended.cause.message
        assert "Traceback" in attributes["exception.stacktrace"]


def test_the_injected_exception_is_on_rank_3s_candidate(grpc_launch: Launch) -> None:
    flash = grpc_launch.span(3, "attention/FLASH_ATTN")
    [(name, _, attributes)] = flash.events
    assert name == "exception"
    assert attributes["exception.type"] == "OSError"
    assert attributes["exception.message"] == INJECTED_MESSAGE
    # Unavailable at DEBUG: the next candidate took over, nothing to look at.
    assert flash.attributes["startup.outcome"] == "unavailable"
    assert flash.attributes["startup.severity"] == "DEBUG"
    assert flash.status_code == STATUS_UNSET
    for rank in set(range(RANKS)) - {3}:
        other = grpc_launch.span(rank, "attention/FLASH_ATTN")
        assert other.attributes["startup.outcome"] == "ok"
        assert other.events == []


def test_without_traceparent_the_trace_id_is_derived_from_the_run_id(grpc_launch: Launch) -> None:
    trace_id = derive_trace_id(grpc_launch.run_id)
    assert {span.trace_id for span in grpc_launch.spans} == {trace_id}
    # One launch, one root: the launch's own span, which every rank's root
    # hangs from.
    own = grpc_launch.launch_span
    assert (own.trace_id, own.span_id) == (trace_id, launch_span_id(trace_id, grpc_launch.run_id))
    assert own.parent_span_id is None
    assert own.name == f"launch {RANKS} ranks: ready"
    assert list(own.attributes["startup.injected"]) == [INJECTED]
    assert own.attributes["startup.simulated"] == "h200x8"
    roots = [span for span in grpc_launch.spans if span.name.startswith("startup rank ")]
    assert len(roots) == RANKS
    assert {root.parent_span_id for root in roots} == {own.span_id}


def test_the_launchers_traceparent_is_honoured(http_launch: Launch) -> None:
    assert {span.trace_id for span in http_launch.spans} == {LAUNCHER_TRACE_ID}
    # The launch's span is the launcher's child; every rank's root its.
    own = http_launch.launch_span
    assert (own.trace_id, own.parent_span_id) == (LAUNCHER_TRACE_ID, LAUNCHER_SPAN_ID)
    roots = [span for span in http_launch.spans if span.name.startswith("startup rank ")]
    assert len(roots) == RANKS
    assert {root.parent_span_id for root in roots} == {own.span_id}
    ids = {span.span_id for span in http_launch.spans}
    for span in http_launch.spans:
        if not span.name.startswith("startup rank "):
            assert span.parent_span_id in ids, span.name


def test_replay_export_sends_what_the_ranks_and_the_launcher_sent(grpc_launch: Launch) -> None:
    events = grpc_launch.events
    by_rank = [[event for event in events if event.rank == rank] for rank in range(RANKS)]
    launch_record = read_run_directory(grpc_launch.run_dir).launch_record()
    run = replay(by_rank, launch=launch_record, slices=[ENGINE])
    with GrpcReceiver() as receiver:
        exporter = otlp_exporter("grpc", endpoint=receiver.endpoint)
        try:
            count = export_events(events, exporter, replayed=run)
        finally:
            exporter.shutdown()
        replayed = {span.span_id: span for span in receiver.wait_for_spans(count)}
    live = {span.span_id: span for span in [*grpc_launch.spans, grpc_launch.launch_span]}
    assert sorted(replayed) == sorted(live)
    for span_id, span in live.items():
        again = replayed[span_id]
        assert again.span == span.span, span.name  # the OTLP message, byte for byte
        assert again.resource == span.resource
        assert (again.scope_name, again.scope_version) == (span.scope_name, span.scope_version)


def test_the_jaeger_file_holds_the_same_trace(grpc_launch: Launch) -> None:
    files = sorted(grpc_launch.run_dir.glob("trace*.json"))
    assert [file.name for file in files] == ["trace.json"]  # one file for the launch
    spans = [
        span
        for file in files
        for trace in json.loads(file.read_text())["data"]
        for span in trace["spans"]
    ]
    assert sorted(span["spanID"] for span in spans) == sorted(
        s.span_id for s in [*grpc_launch.spans, grpc_launch.launch_span]
    )
    red = {
        span["operationName"]
        for span in spans
        if {"key": "error", "type": "bool", "value": True} in span["tags"]
    }
    assert red == set()  # the recovered mnnvl fallback is a WARNING, not red
    started = [e for e in grpc_launch.events if isinstance(e, StepStarted)]
    assert len(spans) == len(started) + RANKS + 1  # and the launch's span
