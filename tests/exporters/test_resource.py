"""The OpenTelemetry resource a rank ran with is recorded in ``run.started``,
so replay on another machine, with other variables or none, rebuilds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from events import JsonValue, RunStarted
from orchestrator import Graph, Step, StepContext

from .tracing_harness import run_graph_traced, spans_by_id

pytestmark = pytest.mark.anyio


def probe(context: StepContext) -> JsonValue:
    context.import_module("json")
    return {"json": True}


async def parent(context: StepContext) -> JsonValue:
    child = await context.run_child("probe", probe)
    return child.value


#: A graph of the tests' own: a step, and one with a child step.
GRAPH = Graph(
    "mine",
    [Step(name="cache_dir", body=probe), Step(name="kernels", body=parent)],
)

RUN_ENVIRONMENT = {
    "OTEL_SERVICE_NAME": "my-engine",
    "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=staging,team=inference",
}


@pytest.mark.parametrize(
    "replay_environment",
    [
        pytest.param({}, id="no variables"),
        pytest.param(
            {"OTEL_SERVICE_NAME": "replayer", "OTEL_RESOURCE_ATTRIBUTES": "team=forensics"},
            id="other variables",
        ),
    ],
)
async def test_replay_rebuilds_the_recorded_resource(
    replay_environment: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in RUN_ENVIRONMENT.items():
        monkeypatch.setenv(name, value)
    run = await run_graph_traced(tmp_path, GRAPH, rank=2, world_size=8)
    assert run.error is None
    for name in RUN_ENVIRONMENT:
        monkeypatch.delenv(name)
    for name, value in replay_environment.items():
        monkeypatch.setenv(name, value)

    started = run.events[0]
    assert isinstance(started, RunStarted)
    assert started.resource == {
        "service.name": "my-engine",
        "deployment.environment": "staging",
        "team": "inference",
    }
    live, replayed = spans_by_id(run.live), spans_by_id(run.replayed())
    assert {span_id: fields["resource"] for span_id, fields in replayed.items()} == {
        span_id: fields["resource"] for span_id, fields in live.items()
    }
    attributes, _ = next(iter(replayed.values()))["resource"]
    assert attributes["service.name"] == "my-engine"
    assert attributes["deployment.environment"] == "staging"
    assert attributes["team"] == "inference"
    assert attributes["service.instance.id"] == "tracing-run/rank-2"
    assert attributes["startup.rank"] == 2


async def test_without_a_service_name_the_service_is_startup_orchestrator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    run = await run_graph_traced(tmp_path, GRAPH)
    assert run.error is None

    for spans in (run.live, run.replayed()):
        assert {span.resource.attributes["service.name"] for span in spans} == {
            "startup-orchestrator"
        }
