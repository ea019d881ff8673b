"""SPEC §3.3: the optional ``flashinfer.comm`` module, through the real engine
graph."""

from __future__ import annotations

import importlib.machinery
from types import ModuleType

import pytest

from events import Outcome, RunOutcome, StepFailed, StepUnavailable
from orchestrator.engine import FLASHINFER_COMM_STEP, Profile, SimulatedImporter, load_profile

from .harness import run

pytestmark = pytest.mark.anyio


async def test_flashinfer_comm_that_imports_with_both_symbols_is_available() -> None:
    engine = await run("h200x8")

    assert engine.value(FLASHINFER_COMM_STEP) == {"available": True}


async def test_any_exception_on_import_disables_the_fusion_and_startup_goes_on() -> None:
    engine = await run(
        "h200x8", faults=["flashinfer.comm=TypeError:type 'array.array' is not subscriptable"]
    )

    assert engine.error is None
    unavailable = engine.terminal(FLASHINFER_COMM_STEP)
    assert isinstance(unavailable, StepUnavailable)
    assert unavailable.outcome is Outcome.UNAVAILABLE
    assert unavailable.reasons == ("TypeError: type 'array.array' is not subscriptable",)
    assert unavailable.cause is not None
    assert unavailable.cause.type == "TypeError"
    assert unavailable.cause.message == "type 'array.array' is not subscriptable"
    assert engine.finished.outcome is RunOutcome.READY
    assert engine.value("attention")["backend"] == "FLASH_ATTN"


@pytest.mark.parametrize(
    "spec",
    [
        "flashinfer.comm=AttributeError:module 'torch' has no attribute 'uint64'",
        "flashinfer.comm=ImportError:cannot import name 'trtllm' from partially initialized module",
        "flashinfer.comm=OSError:libmpi.so.40: cannot open shared object file",
        "flashinfer.comm=RuntimeError:CUDA driver version is insufficient",
    ],
    ids=["AttributeError", "ImportError", "OSError", "RuntimeError"],
)
async def test_every_exception_class_is_recorded(spec: str) -> None:
    engine = await run("h200x8", faults=[spec])

    assert engine.error is None
    assert engine.outcome(FLASHINFER_COMM_STEP) is Outcome.UNAVAILABLE


async def test_flashinfer_not_installed_is_absent_and_nothing_is_imported() -> None:
    profile = load_profile("h200x8")
    data = profile.to_json()
    data["modules"] = {**data["modules"], "flashinfer": "absent"}
    data["name"] = "h200x8-without-flashinfer"

    without = Profile.from_json(data, source="test")
    imported: list[str] = []

    class Recording(SimulatedImporter):
        def import_module(self, name: str) -> ModuleType:
            imported.append(name)
            return super().import_module(name)

    engine = await run(without, importer=Recording(without))

    absent = engine.terminal(FLASHINFER_COMM_STEP)
    assert isinstance(absent, StepUnavailable)
    assert absent.outcome is Outcome.ABSENT
    assert absent.reasons == ("flashinfer is not installed",)
    assert "flashinfer.comm" not in imported
    assert engine.outcome("attention/FLASHINFER") is Outcome.UNAVAILABLE


@pytest.mark.parametrize("present", [False, True], ids=["missing", "not-callable"])
async def test_a_missing_fusion_entry_point_is_unavailable_naming_it(present: bool) -> None:
    profile = load_profile("h200x8")

    class WithoutWorkspace(SimulatedImporter):
        def import_module(self, name: str) -> ModuleType:
            module = super().import_module(name)
            if name != "flashinfer.comm":
                return module
            stripped = ModuleType(name)
            stripped.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
            stripped.allreduce_fusion = module.allreduce_fusion  # type: ignore[attr-defined]
            if present:
                # A name that is there but no function is no entry point.
                stripped.create_allreduce_fusion_workspace = None  # type: ignore[attr-defined]
            return stripped

    engine = await run(profile, importer=WithoutWorkspace(profile))

    missing = engine.terminal(FLASHINFER_COMM_STEP)
    assert isinstance(missing, StepUnavailable)
    assert missing.outcome is Outcome.UNAVAILABLE
    assert missing.reasons == ("flashinfer.comm has no create_allreduce_fusion_workspace",)
    assert engine.finished.outcome is RunOutcome.READY


@pytest.mark.parametrize("exception", ["KeyboardInterrupt", "SystemExit"])
async def test_base_exceptions_still_propagate(exception: str) -> None:
    engine = await run("h200x8", faults=[f"flashinfer.comm={exception}"])

    assert type(engine.error).__name__ == exception
    failed = engine.terminal(FLASHINFER_COMM_STEP)
    assert isinstance(failed, StepFailed)
    assert failed.cause.type == exception
    # A KeyboardInterrupt is a stop; a SystemExit from a probe fails the start.
    expected = RunOutcome.INTERRUPTED if exception == "KeyboardInterrupt" else RunOutcome.FAILED
    assert engine.finished.outcome is expected


async def test_platforms_flashinfer_does_not_run_on_are_absent() -> None:
    engine = await run("zen4")

    absent = engine.terminal(FLASHINFER_COMM_STEP)
    assert isinstance(absent, StepUnavailable)
    assert absent.outcome is Outcome.ABSENT
    assert absent.reasons == ("flashinfer does not run on ZenCpuPlatform",)
