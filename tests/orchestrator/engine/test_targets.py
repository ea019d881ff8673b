"""The engine's fault targets: every step path and module a run reaches is in
the table, and everything in the table is reached by some run."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import attrs
import pytest

from events import StepStarted
from orchestrator import FaultPlan, FaultSpecError, Importer
from orchestrator._group import PROCESS_GROUP_STEP
from orchestrator.engine import (
    ATTENTION_BACKENDS,
    BUILTIN_PROFILES,
    PLATFORM_PLUGIN_GROUP,
    AllreduceBackend,
    EngineConfig,
    GpuFacts,
    ModuleRule,
    Profile,
    RealHost,
    RealWorkspaceFactory,
    SimulatedImporter,
    injection_targets,
)

from .harness import run

TARGETS = injection_targets(discover_plugins=False)


class RecordingImporter:
    """Another importer, remembering every module name it was asked for."""

    def __init__(self, base: Importer) -> None:
        self.base = base
        self.names: set[str] = set()
        self._lock = threading.Lock()

    def _seen(self, name: str) -> None:
        with self._lock:
            self.names.add(name)

    def import_module(self, name: str) -> ModuleType:
        self._seen(name)
        return self.base.import_module(name)

    def find_spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        self._seen(name)
        return self.base.find_spec(name)


@attrs.frozen(kw_only=True)
class Scenario:
    """One engine run: a host, a configuration, maybe a few faults."""

    name: str
    profile: Profile
    config: EngineConfig = attrs.field(factory=lambda: EngineConfig(tp=2))
    faults: tuple[str, ...] = ()


def _profile(name: str, **facts: Any) -> Profile:
    return Profile(name=name, modules={"torch": ModuleRule(), "triton": ModuleRule()}, **facts)


_EXTRA_HOSTS = (
    _profile("mi300x", gpus=GpuFacts(vendor="amd", count=8, name="MI300X", capability=(9, 4))),
    _profile("tpu", tpu=True),
    _profile("xpu", xpu=2),
    attrs.evolve(BUILTIN_PROFILES["h200x8"], name="h200x8-two-nodes", nodes=2),
)

SCENARIOS = (
    *(
        Scenario(name=f"{profile}-{label}", profile=BUILTIN_PROFILES[profile], config=config)
        for profile in sorted(BUILTIN_PROFILES)
        for label, config in (
            ("auto", EngineConfig(tp=2)),
            ("mla", EngineConfig(tp=2, use_mla=True)),
            ("mnnvl", EngineConfig(tp=2, allreduce_backend=AllreduceBackend.MNNVL)),
            ("trtllm", EngineConfig(tp=2, allreduce_backend=AllreduceBackend.TRTLLM)),
        )
    ),
    *(Scenario(name=profile.name, profile=profile) for profile in _EXTRA_HOSTS),
    # An explicit selection may probe any backend the engine knows.
    *(
        Scenario(
            name=f"explicit-{backend}",
            profile=BUILTIN_PROFILES["h200x8"],
            config=EngineConfig(tp=2, attention_backend=backend),
        )
        for backend in ATTENTION_BACKENDS
    ),
    Scenario(
        name="injected-faults",
        profile=BUILTIN_PROFILES["zen4"],
        faults=("zentorch=OSError:libzentorch.so: undefined symbol", "platform/cuda=RuntimeError"),
    ),
)


async def observe(scenario: Scenario) -> tuple[set[str], set[str]]:
    """The step paths a run started and the modules it asked for."""
    importer = RecordingImporter(SimulatedImporter(scenario.profile))
    engine = await run(
        scenario.profile,
        config=scenario.config,
        faults=list(scenario.faults) or None,
        importer=importer,
        discover_plugins=False,
    )
    return {event.step for event in engine.of_type(StepStarted)}, importer.names


@pytest.mark.anyio
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
async def test_every_step_and_module_of_a_run_is_a_target(scenario: Scenario) -> None:
    steps, modules = await observe(scenario)

    assert steps, "the run started no step"
    assert steps <= set(TARGETS.steps), sorted(steps - set(TARGETS.steps))
    assert modules <= set(TARGETS.modules), sorted(modules - set(TARGETS.modules))


@pytest.mark.anyio
async def test_every_target_is_reached_by_some_run() -> None:
    steps: set[str] = set()
    modules: set[str] = set()
    for scenario in SCENARIOS:
        more_steps, more_modules = await observe(scenario)
        steps |= more_steps
        modules |= more_modules

    # process_group runs before the engine graph, in the launcher.
    assert set(TARGETS.steps) - steps == {PROCESS_GROUP_STEP}
    assert set(TARGETS.modules) == modules


@pytest.mark.anyio
async def test_the_real_hosts_device_libraries_are_targets(tmp_path: Path) -> None:
    importer = RecordingImporter(SimulatedImporter(Profile(name="bare")))
    steps: set[str] = set()
    # A CUDA build asks NVML; a CPU build goes on to the other steps.
    for target in ("cuda", "cpu"):
        engine = await run(
            None,
            config=EngineConfig(tp=2, target_device=target),
            host=RealHost(tmp_path),
            importer=importer,
        )
        steps.update(event.step for event in engine.of_type(StepStarted))

    assert steps <= set(TARGETS.steps)
    assert {"pynvml", "amdsmi", "libtpu", "torch"} <= importer.names
    assert importer.names <= set(TARGETS.modules)


def test_the_real_workspace_factory_imports_only_targets() -> None:
    asked: list[str] = []
    comm = SimpleNamespace(create_allreduce_fusion_workspace=lambda **_: object())
    fakes: dict[str, Any] = {"flashinfer.comm": comm, "torch": SimpleNamespace(bfloat16="bf16")}

    def import_module(name: str) -> Any:
        asked.append(name)
        return fakes[name]

    RealWorkspaceFactory().create(
        "trtllm", rank=0, world_size=2, gpus_per_node=2, import_module=import_module
    )
    assert asked
    assert set(asked) <= set(TARGETS.modules)


# The table itself ---------------------------------------------------------------------


def test_the_table_lists_modules_then_steps_sorted() -> None:
    assert TARGETS.modules == tuple(sorted(TARGETS.modules))
    assert TARGETS.steps == tuple(sorted(TARGETS.steps))
    assert list(TARGETS) == [*TARGETS.modules, *TARGETS.steps]
    assert len(TARGETS) == len(TARGETS.modules) + len(TARGETS.steps)
    assert "flashinfer" in TARGETS
    assert "flashinfer.comm" in TARGETS
    assert "allreduce_workspace/quant" in TARGETS
    assert "process_group" in TARGETS
    assert "platform/acme" not in TARGETS
    assert 3 not in TARGETS


def test_every_built_in_plugin_backend_and_all_reduce_child_is_a_step() -> None:
    steps = set(TARGETS.steps)
    assert {f"platform/{name}" for name in ("tpu", "cuda", "rocm", "xpu", "cpu")} <= steps
    assert {f"attention/{name}" for name in ATTENTION_BACKENDS} <= steps
    assert {
        "platform",
        "platform/cpu/zentorch",
        "attention",
        "flashinfer_comm",
        "allreduce_workspace",
        "allreduce_workspace/mnnvl",
        "allreduce_workspace/trtllm",
        "allreduce_workspace/agree",
        "allreduce_workspace/quant",
        "process_group",
    } <= steps
    assert "allreduce_workspace/auto" not in steps


def _entry_points(*names: str) -> Callable[..., Any]:
    found = [
        importlib.metadata.EntryPoint(
            name=name, value=f"not_importable_{index}:detect", group=PLATFORM_PLUGIN_GROUP
        )
        for index, name in enumerate(names)
    ]

    def entry_points(**selection: Any) -> list[importlib.metadata.EntryPoint]:
        assert selection == {"group": PLATFORM_PLUGIN_GROUP}
        return found

    return entry_points


def test_third_party_plugins_are_steps_without_being_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The entry points name modules that do not exist: loading one would fail.
    monkeypatch.setattr(importlib.metadata, "entry_points", _entry_points("acme", "cuda", ""))

    targets = injection_targets(plugins=["given"])

    assert "platform/acme" in targets.steps
    assert "platform/given" in targets.steps
    # A name the platform step refuses never becomes a step.
    assert "platform/" not in targets.steps
    assert targets.steps.count("platform/cuda") == 1
    assert "platform/acme" not in injection_targets(discover_plugins=False)


@pytest.mark.anyio
async def test_a_plugin_given_to_the_engine_runs_as_a_listed_step() -> None:
    engine = await run("xeon", plugins={"acme": lambda ctx: None}, discover_plugins=False)
    steps = {event.step for event in engine.of_type(StepStarted)}
    assert "platform/acme" in steps
    assert steps <= set(injection_targets(plugins=["acme"], discover_plugins=False).steps)


# Checking a plan with the table ---------------------------------------------------------


def test_a_plan_is_checked_against_the_table() -> None:
    FaultPlan.parse(
        [
            "1:zentorch=RuntimeError:unknown zentorch failure",
            "flashinfer=PermissionError:/root/.cache/flashinfer",
            "flashinfer.comm=TypeError:x",
            "attention/FLASH_ATTN=hang",
            "allreduce_workspace/quant=RuntimeError:quant workspace creation failed",
            "process_group=RuntimeError:no rendezvous",
        ]
    ).check(world_size=2, targets=TARGETS)

    with pytest.raises(FaultSpecError) as raised:
        FaultPlan.parse(["zentorhc=RuntimeError:typo"]).check(world_size=2, targets=TARGETS)
    assert raised.value.reason.startswith(
        "unknown target 'zentorhc' (did you mean zentorch?); valid targets: aiter, "
    )
    assert "allreduce_workspace/quant" in raised.value.reason
