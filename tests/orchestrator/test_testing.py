"""``orchestrator.testing``: a fake host for your own graphs, and the event
builder of ``events.testing`` held against what the runner writes."""

from __future__ import annotations

import types
from typing import Any

import pytest

from events import (
    JsonValue,
    MemoryLog,
    Outcome,
    RunOutcome,
    RunStarted,
    StepFailed,
    StepKind,
    StepStarted,
    StepUnavailable,
)
from events.testing import EventStream
from orchestrator import Graph, RealImporter, Step, StepContext, optional_module_policy
from orchestrator.engine import SimulatedHost, SimulatedImporter, load_profile
from orchestrator.testing import FakeHost, fake_host, faults, raise_, run_captured

from .harness import assert_log_contract, only

pytestmark = pytest.mark.anyio


# A user's own startup graph: an optional kernels package, a runtime it
# needs, and a step that asks the host about its devices.


def load_kernels(ctx: StepContext) -> JsonValue:
    module = ctx.import_module("my_kernels.fused")
    return {"version": module.VERSION}


def load_runtime(ctx: StepContext) -> JsonValue:
    return {"threads": ctx.import_module("my_runtime").threads()}


def count_devices(ctx: StepContext) -> JsonValue:
    return {"devices": ctx.host.devices if ctx.host is not None else 0}


GRAPH = Graph(
    "my-startup",
    [
        Step(name="kernels", body=load_kernels, policy=optional_module_policy("my_kernels")),
        Step(name="runtime", body=load_runtime),
        Step(name="devices", body=count_devices, depends_on=("runtime",)),
    ],
)


def runtime_module(threads: int = 8) -> types.ModuleType:
    module = types.ModuleType("my_runtime")
    module.threads = lambda: threads  # type: ignore[attr-defined]
    return module


def kernels_module() -> types.ModuleType:
    module = types.ModuleType("my_kernels.fused")
    module.VERSION = "1.2"  # type: ignore[attr-defined]
    return module


class Devices:
    devices = 4


async def test_a_fake_host_answers_the_probes_imports_and_facts() -> None:
    host = fake_host(
        {"my_kernels.fused": kernels_module(), "my_runtime": runtime_module()}, facts=Devices()
    )

    captured = await run_captured(GRAPH, host=host)

    assert captured.error is None
    assert captured.result is not None
    assert captured.result["kernels"].value == {"version": "1.2"}
    assert captured.result["runtime"].value == {"threads": 8}
    assert captured.result["devices"].value == {"devices": 4}
    assert only(captured.events, RunStarted).simulated == "fake"


async def test_a_missing_and_a_broken_module_are_what_a_real_host_would_make_them() -> None:
    missing = await run_captured(GRAPH, host=fake_host({"my_runtime": runtime_module()}))
    assert missing.outcomes()["kernels"] is Outcome.ABSENT

    broken = fake_host(
        {
            "my_kernels": OSError("libkernels.so: cannot open shared object file"),
            "my_kernels.fused": kernels_module(),
            "my_runtime": runtime_module(),
        },
        name="broken-box",
    )
    captured = await run_captured(GRAPH, host=broken)
    assert captured.outcomes()["kernels"] is Outcome.UNAVAILABLE
    unavailable = only(captured.events, StepUnavailable, "kernels")
    assert unavailable.reasons == ("OSError: libkernels.so: cannot open shared object file",)
    assert only(captured.events, RunStarted).simulated == "broken-box"


async def test_a_module_that_is_not_installed_is_a_module_not_found() -> None:
    captured = await run_captured(GRAPH, host=fake_host({"my_runtime": None}))

    assert captured.finished.outcome is RunOutcome.READY
    unavailable = only(captured.events, StepUnavailable, "runtime")
    assert unavailable.outcome is Outcome.UNAVAILABLE
    assert unavailable.cause is not None
    assert (unavailable.cause.type, unavailable.cause.module_name) == (
        "ModuleNotFoundError",
        "my_runtime",
    )
    assert unavailable.reasons == ("ModuleNotFoundError: No module named 'my_runtime'",)


async def test_faults_fire_in_front_of_a_fake_host() -> None:
    host = fake_host({"my_kernels.fused": kernels_module(), "my_runtime": runtime_module()})
    plan = faults(raise_("my_kernels", PermissionError, 13, "Permission denied", "/cache"))

    captured = await run_captured(GRAPH, host=host, faults=plan)

    assert captured.outcomes()["kernels"] is Outcome.UNAVAILABLE
    unavailable = only(captured.events, StepUnavailable, "kernels")
    assert unavailable.reasons == ("PermissionError: [Errno 13] Permission denied: '/cache'",)
    (injected,) = only(captured.events, RunStarted).injected
    assert injected.startswith("my_kernels=PermissionError")


def test_a_fault_raising_an_instance_or_a_class_of_your_own_is_named() -> None:
    with pytest.raises(ValueError, match=r"RuntimeError\('boom'\) is not a builtin exception"):
        raise_("my_kernels", RuntimeError("boom"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="KernelError is not a builtin exception"):
        raise_("my_kernels", type("KernelError", (RuntimeError,), {}))


async def test_a_host_profile_answers_what_the_modules_do_not() -> None:
    zen4 = load_profile("zen4")
    host = fake_host(
        {"my_runtime": runtime_module(2)},
        base=SimulatedImporter(zen4),
        facts=SimulatedHost(zen4),
        name=zen4.name,
    )

    def facts(ctx: StepContext) -> JsonValue:
        cpuinfo = ctx.host.read_cpuinfo()
        return {
            "amd": "AuthenticAMD" in cpuinfo,
            "torch": ctx.find_spec("torch") is not None,
            "flash_attn": ctx.find_spec("flash_attn") is not None,
            "threads": ctx.import_module("my_runtime").threads(),
        }

    captured = await run_captured(Graph("facts", [Step(name="facts", body=facts)]), host=host)

    assert captured.error is None
    assert captured.result is not None
    assert captured.result["facts"].value == {
        "amd": True,
        "torch": True,
        "flash_attn": False,
        "threads": 2,
    }
    assert only(captured.events, RunStarted).simulated == "zen4"


def test_imports_follow_importlib() -> None:
    host = fake_host(
        {
            "pkg.sub": types.ModuleType("pkg.sub"),
            "broken": ImportError("broken is broken"),
            "gone": None,
        }
    )
    importer = host.importer
    assert importer.import_module("pkg.sub").__name__ == "pkg.sub"
    assert importer.import_module("pkg").__name__ == "pkg"
    assert importer.find_spec("pkg") is not None
    assert importer.find_spec("pkg.sub") is not None
    assert importer.find_spec("pkg.other") is None
    assert importer.find_spec("broken") is not None
    assert importer.find_spec("gone") is None
    assert importer.find_spec("gone.sub") is None
    assert importer.find_spec("json") is None  # hermetic
    with pytest.raises(ImportError, match="broken is broken") as first:
        importer.import_module("broken.sub")
    with pytest.raises(ImportError, match="broken is broken") as second:
        importer.find_spec("broken.sub")
    assert first.value is not second.value
    with pytest.raises(ModuleNotFoundError) as caught:
        importer.import_module("gone.sub")
    assert caught.value.name == "gone"
    with pytest.raises(ModuleNotFoundError) as caught:
        importer.import_module("json")
    assert caught.value.name == "json"


def test_a_parent_package_that_is_not_installed_leaves_no_spec() -> None:
    # A package listed as missing by name is not installed, as ``None`` is;
    # one whose import fails on another module is broken, and says so.
    host = fake_host(
        {
            "vendor": ModuleNotFoundError("No module named 'vendor'", name="vendor"),
            "plugin": ModuleNotFoundError("No module named 'torch'", name="torch"),
        }
    )
    assert host.importer.find_spec("vendor.sub") is None
    with pytest.raises(ModuleNotFoundError) as caught:
        host.importer.find_spec("plugin.sub")
    assert caught.value.name == "torch"


def test_a_host_on_the_real_importer_imports_the_rest_for_real() -> None:
    import email

    host = fake_host({"json": None, "my_runtime": runtime_module()}, base=RealImporter())
    assert host.importer.import_module("email") is email
    assert host.importer.find_spec("email") is not None
    assert host.importer.find_spec("json") is None
    with pytest.raises(ModuleNotFoundError):
        host.importer.import_module("json")


def test_a_fake_hosts_modules_do_not_cross_into_another_process() -> None:
    spec = getattr(fake_host({"x": None}).importer, "isolation_spec")  # noqa: B009
    with pytest.raises(TypeError, match="process-isolated"):
        spec()
    with pytest.raises(TypeError, match="process-isolated"):
        fake_host().importer.isolation_spec()  # type: ignore[attr-defined]
    profiled = fake_host(base=SimulatedImporter(load_profile("zen4"))).importer
    assert profiled.isolation_spec()["factory"].endswith(":rebuild_simulated_importer")  # type: ignore[attr-defined]
    assert fake_host(base=RealImporter()).importer.isolation_spec() is None  # type: ignore[attr-defined]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="'x': expected a module, an exception or None, not str"):
        fake_host({"x": "import"})  # type: ignore[dict-item]


async def test_a_fake_host_is_the_importer() -> None:
    host = fake_host()
    with pytest.raises(TypeError, match="a FakeHost or an importer, not both"):
        await run_captured(GRAPH, host=host, importer=host.importer)
    assert isinstance(host, FakeHost)


# --- the event builder against the runner -----------------------------------------------


async def probe_platforms(ctx: StepContext) -> JsonValue:
    for name in ("cuda", "cpu"):
        await ctx.run_child(
            name, probe_candidate, kind=StepKind.CANDIDATE, attributes={"candidate": name}
        )
    ctx.record_decision("platform.select", "cpu")
    return "cpu"


def probe_candidate(ctx: StepContext) -> JsonValue:
    if ctx.step.endswith("cuda"):
        ctx.import_module("pynvml")
    return {"candidate": ctx.step}


def fail(ctx: StepContext) -> JsonValue:
    raise RuntimeError("no attention backend")


RUNNER_GRAPH = Graph(
    "shape",
    [
        Step(name="platform", body=probe_platforms),
        Step(name="attention", body=fail, depends_on=("platform",)),
    ],
)


def shape(events: Any) -> list[tuple[Any, ...]]:
    """What the runner decides about each event: type, step, kind, the step
    its span hangs under, and, for a decision, the step whose span it is on."""
    steps = {event.span_id: event.step for event in events if isinstance(event, StepStarted)}
    root = events[0].span_id
    rows = []
    for event in events:
        parent = event.parent_span_id
        rows.append(
            (
                event.TYPE,
                event.step,
                getattr(event, "kind", None),
                "<root>" if parent == root else steps.get(parent, parent),
                "<root>" if event.span_id == root else steps[event.span_id],
            )
        )
    return rows


async def test_the_builder_writes_what_the_runner_writes() -> None:
    captured = await run_captured(
        RUNNER_GRAPH, run_id="run-1", host=fake_host({"pynvml": None}, name="no-gpu")
    )
    error = only(captured.events, StepFailed).cause

    stream = EventStream(run_id="run-1").run_started(simulated="no-gpu")
    stream.started("platform")
    cuda = only(captured.events, StepUnavailable, "platform/cuda")
    for name in ("cuda", "cpu"):
        step = f"platform/{name}"
        stream.started(step, kind=StepKind.CANDIDATE, attributes={"candidate": name})
        if name == "cuda":
            stream.unavailable(step, cuda.outcome, cause=cuda.cause)
        else:
            stream.succeeded(step, {"candidate": step})
    stream.decision("platform.select", "cpu", step="platform")
    stream.succeeded("platform", "cpu")
    stream.started("attention", depends_on=("platform",))
    stream.failed("attention", error)
    built = stream.run_finished(RunOutcome.FAILED, cause=error, failed_step="attention")

    assert shape(built) == shape(captured.events)
    assert [event.trace_id for event in built] == [event.trace_id for event in captured.events]
    log = MemoryLog("run-1", 0)
    for event in built:
        log.append(event)
    assert_log_contract(log)


def test_the_module_exports_what_it_defines() -> None:
    import inspect

    import orchestrator.testing

    exported = orchestrator.testing.__all__
    assert exported == sorted(exported)
    for name in exported:
        value = getattr(orchestrator.testing, name)
        assert inspect.isclass(value) or inspect.isfunction(value)
        assert value.__module__ == "orchestrator.testing"
        assert inspect.getdoc(value)
