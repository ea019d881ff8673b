"""SPEC §3.2: platform detection and the zentorch branch, through the real
engine graph."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from events import (
    Outcome,
    RunOutcome,
    Severity,
    StepFailed,
    StepKind,
    StepSucceeded,
    StepUnavailable,
)
from orchestrator import FaultPlan, StepContext, StepTimeoutError
from orchestrator._decisions import check_decisions
from orchestrator.engine import (
    ATTENTION_STEP,
    BUILTIN_PROFILES,
    ENGINE_DECIDERS,
    PLATFORM_PLUGIN_GROUP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
    EngineConfig,
    PlatformConflictError,
    Profile,
    UnspecifiedPlatformError,
    build_engine_graph,
    decide_platform,
    is_amd_zen,
    replay,
)

from .harness import run

pytestmark = pytest.mark.anyio

PLUGINS = ["tpu", "cuda", "rocm", "xpu", "cpu"]


def variant(name: str, **changes: Any) -> Profile:
    """A built-in profile with some JSON fields replaced."""
    data = BUILTIN_PROFILES[name].to_json()
    data.update(changes)
    data["name"] = f"{name}-variant"
    return Profile.from_json(data, source="test")


def platform(engine: Any) -> tuple[str, str]:
    value = engine.value(PLATFORM_STEP)
    return value["plugin"], value["platform_class"]


# --- zentorch on an AMD Zen host --------------------------------------------------------


async def test_zentorch_that_loads_gives_the_zen_cpu_platform() -> None:
    engine = await run("zen4")

    assert engine.value(PLATFORM_STEP) == {
        "plugin": "cpu",
        "platform_class": "ZenCpuPlatform",
        "device": "cpu",
        "builtin": True,
    }
    loaded = engine.terminal(ZENTORCH_STEP)
    assert isinstance(loaded, StepSucceeded)
    assert loaded.result == {"loaded": True}
    assert engine.started(ZENTORCH_STEP).kind is StepKind.STEP
    assert engine.decision("platform.select").value == {
        "plugin": "cpu",
        "platform_class": "ZenCpuPlatform",
    }
    assert check_decisions(engine.events, ENGINE_DECIDERS) == []


async def test_zentorch_abi_mismatch_falls_back_to_the_cpu_platform() -> None:
    engine = await run("zen4", faults=["zentorch=OSError:incompatible shared library"])

    assert platform(engine) == ("cpu", "CpuPlatform")
    broken = engine.terminal(ZENTORCH_STEP)
    assert isinstance(broken, StepUnavailable)
    assert broken.outcome is Outcome.UNAVAILABLE
    assert broken.reasons == ("OSError: incompatible shared library",)
    assert broken.cause is not None
    assert broken.cause.frames
    assert engine.outcome("platform/cpu") is Outcome.OK
    assert engine.value(ATTENTION_STEP)["backend"] == "CPU_ATTN"


@pytest.mark.parametrize(
    "faults",
    [
        ["zentorch=ModuleNotFoundError"],
        FaultPlan.from_json(
            [{"target": "zentorch", "exception": "ModuleNotFoundError", "args": ["nope"]}]
        ),
    ],
    ids=["default-message", "own-message"],
)
async def test_zentorch_not_installed_is_absent(faults: Any) -> None:
    engine = await run("zen4", faults=faults)

    assert platform(engine) == ("cpu", "CpuPlatform")
    absent = engine.terminal(ZENTORCH_STEP)
    assert isinstance(absent, StepUnavailable)
    assert absent.outcome is Outcome.ABSENT


async def test_zentorch_absent_from_the_profile_is_absent() -> None:
    engine = await run(variant("zen4", modules={"torch": "import", "zentorch": "absent"}))

    assert platform(engine) == ("cpu", "CpuPlatform")
    absent = engine.terminal(ZENTORCH_STEP)
    assert isinstance(absent, StepUnavailable)
    assert absent.outcome is Outcome.ABSENT
    assert absent.reasons == ("ModuleNotFoundError: No module named 'zentorch'",)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        (
            {
                "exception": "ImportError",
                "args": ["Incompatible PyTorch version 2.13.0+cpu detected"],
            },
            "ImportError: Incompatible PyTorch version 2.13.0+cpu detected",
        ),
        (
            # Installed but a dependency is missing: not "zentorch is absent".
            {
                "exception": "ModuleNotFoundError",
                "args": ["No module named 'numactl'"],
                "kwargs": {"name": "numactl"},
            },
            "ModuleNotFoundError: No module named 'numactl'",
        ),
    ],
    ids=["incompatible-torch", "missing-dependency"],
)
async def test_zentorch_installed_but_broken_is_unavailable(
    fault: dict[str, Any], reason: str
) -> None:
    engine = await run("zen4", faults=FaultPlan.from_json([{"target": "zentorch", **fault}]))

    assert platform(engine) == ("cpu", "CpuPlatform")
    broken = engine.terminal(ZENTORCH_STEP)
    assert isinstance(broken, StepUnavailable)
    assert broken.outcome is Outcome.UNAVAILABLE
    assert broken.reasons == (reason,)


async def test_other_zentorch_errors_leave_no_platform_and_name_the_cause() -> None:
    engine = await run("zen4", faults=["zentorch=RuntimeError:unknown zentorch failure"])

    error = engine.error
    assert isinstance(error, UnspecifiedPlatformError)
    assert "cpu: RuntimeError: unknown zentorch failure" in str(error)
    assert error.failures == {"cpu": "RuntimeError: unknown zentorch failure"}
    assert type(error.__cause__) is RuntimeError
    assert str(error.__cause__) == "unknown zentorch failure"
    # The recorded chain says the same.
    zentorch = engine.terminal(ZENTORCH_STEP)
    assert isinstance(zentorch, StepFailed)
    cpu = engine.terminal("platform/cpu")
    assert isinstance(cpu, StepUnavailable)
    assert cpu.reasons == ("RuntimeError: unknown zentorch failure",)
    failed = engine.terminal(PLATFORM_STEP)
    assert isinstance(failed, StepFailed)
    chain = [(link.name, link.message) for link in failed.cause.chain()]
    assert chain[0][0] == "UnspecifiedPlatformError"
    assert ("RuntimeError", "unknown zentorch failure") in chain
    finished = engine.finished
    assert finished.outcome is RunOutcome.FAILED
    assert finished.failed_step == PLATFORM_STEP
    assert finished.cause is not None
    assert finished.cause.root().type == "RuntimeError"
    assert engine.decision("platform.select").value is None
    assert check_decisions(engine.events, ENGINE_DECIDERS) == []


async def test_an_intel_host_never_tries_zentorch() -> None:
    engine = await run("xeon")

    assert platform(engine) == ("cpu", "CpuPlatform")
    assert ZENTORCH_STEP not in engine.steps()


async def test_no_cpuinfo_means_not_zen() -> None:
    engine = await run(variant("zen4", cpu=None))

    assert platform(engine) == ("cpu", "CpuPlatform")
    assert ZENTORCH_STEP not in engine.steps()


ZEN_FLAGS = "fpu sse avx2 avx512f avx512bw"


@pytest.mark.parametrize(
    ("cpuinfo", "zen"),
    [
        (f"vendor_id\t: AuthenticAMD\nflags\t\t: {ZEN_FLAGS}\n", True),
        ("vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 avx512_bf16\n", True),
        ("vendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx2 sha_ni\n", False),
        (f"vendor_id\t: GenuineIntel\nflags\t\t: {ZEN_FLAGS}\n", False),
        ("vendor_id\t: AuthenticAMD\n", False),
        ("", False),
        (None, False),
    ],
    ids=["zen4", "bf16-only", "zen3", "intel", "no-flags", "empty", "no-file"],
)
def test_is_amd_zen(cpuinfo: str | None, zen: bool) -> None:
    assert is_amd_zen(cpuinfo) is zen


# --- plugins and resolution ---------------------------------------------------------------


async def test_every_builtin_plugin_is_a_candidate_child_with_its_facts() -> None:
    engine = await run("h200x8")

    for priority, plugin in enumerate(PLUGINS):
        started = engine.started(f"platform/{plugin}")
        assert started.kind is StepKind.CANDIDATE
        assert started.attributes == {"plugin": plugin, "builtin": True, "priority": priority}
    results = {p: engine.terminal(f"platform/{p}") for p in PLUGINS}
    assert all(isinstance(r, StepSucceeded) for r in results.values())
    assert results["cuda"].result == {  # type: ignore[attr-defined]
        "activated": True,
        "platform_class": "CudaPlatform",
        "device": "cuda",
    }
    for plugin in ("tpu", "rocm", "xpu", "cpu"):
        assert results[plugin].result == {  # type: ignore[attr-defined]
            "activated": False,
            "platform_class": None,
            "device": None,
        }
    assert platform(engine) == ("cuda", "CudaPlatform")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tpu": True, "modules": {"torch_xla": "import"}}, ("tpu", "TpuPlatform")),
        ({"xpu": 2}, ("xpu", "XpuPlatform")),
        (
            {
                "gpus": {
                    "vendor": "amd",
                    "count": 8,
                    "name": "AMD Instinct MI300X",
                    "capability": [9, 4],
                },
                "modules": {"torch": "import", "triton": "import", "aiter": "import"},
            },
            ("rocm", "RocmPlatform"),
        ),
    ],
    ids=["tpu", "xpu", "rocm"],
)
async def test_each_accelerator_is_detected(
    changes: dict[str, Any], expected: tuple[str, str]
) -> None:
    engine = await run(variant("xeon", **changes))

    assert platform(engine) == expected
    assert engine.terminal("platform/cpu").result["activated"] is False  # type: ignore[attr-defined]


async def test_rocm_selects_its_own_attention_backend() -> None:
    profile = variant(
        "xeon",
        gpus={"vendor": "amd", "count": 8, "name": "AMD Instinct MI300X", "capability": [9, 4]},
        modules={"torch": "import", "triton": "import", "aiter": "import"},
    )
    engine = await run(profile)

    assert engine.value(ATTENTION_STEP)["backend"] == "ROCM_AITER_FA"


async def test_two_builtin_plugins_activated_is_a_conflict() -> None:
    engine = await run(variant("h200x8", tpu=True))

    error = engine.error
    assert isinstance(error, PlatformConflictError)
    assert error.plugins == ["tpu", "cuda"]
    assert str(error).startswith(
        "Only one platform plugin can be activated, but got: ['tpu', 'cuda']"
    )
    assert engine.finished.outcome is RunOutcome.FAILED
    assert engine.decision("platform.select").value is None
    assert ATTENTION_STEP not in engine.steps()


async def test_one_third_party_plugin_wins_over_the_builtins() -> None:
    seen: list[str] = []

    def acme(ctx: StepContext) -> str | None:
        seen.append(ctx.step)
        return "acme_platform.AcmePlatform"

    engine = await run("h200x8", plugins={"acme": acme})

    assert seen == ["platform/acme"]
    assert engine.value(PLATFORM_STEP) == {
        "plugin": "acme",
        "platform_class": "acme_platform.AcmePlatform",
        "device": None,
        "builtin": False,
    }
    assert engine.started("platform/acme").attributes == {
        "plugin": "acme",
        "builtin": False,
        "priority": len(PLUGINS),
    }
    # The engine knows no attention backends for a platform it does not know.
    assert engine.outcome(ATTENTION_STEP) is Outcome.ABSENT
    assert check_decisions(engine.events, ENGINE_DECIDERS) == []


async def test_async_third_party_plugins_are_awaited() -> None:
    async def acme(ctx: StepContext) -> str | None:
        return "acme_platform.AcmePlatform"

    engine = await run("xeon", plugins={"acme": acme})

    assert platform(engine) == ("acme", "acme_platform.AcmePlatform")


async def test_two_third_party_plugins_activated_is_a_conflict() -> None:
    engine = await run(
        "xeon",
        plugins={"zeta": lambda ctx: "zeta.ZetaPlatform", "acme": lambda ctx: "acme.AcmePlatform"},
    )

    assert isinstance(engine.error, PlatformConflictError)
    assert engine.error.plugins == ["acme", "zeta"]


@pytest.mark.parametrize(
    ("plugin", "reason"),
    [
        (lambda ctx: 1 / 0, "ZeroDivisionError: division by zero"),
        (lambda ctx: 42, "TypeError: platform plugin 'acme' returned int"),
    ],
    ids=["raises", "bad-result"],
)
async def test_a_third_party_plugin_that_fails_is_recorded_and_not_activated(
    plugin: Any, reason: str
) -> None:
    engine = await run("xeon", plugins={"acme": plugin, "nop": lambda ctx: None})

    assert platform(engine) == ("cpu", "CpuPlatform")
    failed = engine.terminal("platform/acme")
    assert isinstance(failed, StepUnavailable)
    assert failed.reasons[0].startswith(reason)
    assert engine.terminal("platform/nop").result == {  # type: ignore[attr-defined]
        "activated": False,
        "platform_class": None,
        "device": None,
    }


@pytest.mark.parametrize("name", ["cuda", "a/b", ""])
def test_third_party_plugin_names_are_checked(name: str) -> None:
    with pytest.raises(ValueError, match="platform plugin"):
        build_engine_graph(EngineConfig(), plugins={name: lambda ctx: None})


async def test_plugins_registered_as_entry_points_are_discovered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "startup_orchestrator_test_plugin"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            def detect(ctx):
                return "acme_platform.AcmePlatform"
            """
        )
    )
    dist_info = tmp_path / "acme_platform-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: acme-platform\nVersion: 1.0\n"
    )
    (dist_info / "entry_points.txt").write_text(
        f"[{PLATFORM_PLUGIN_GROUP}]\nacme = {module}:detect\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, module, raising=False)

    engine = await run("xeon")
    assert platform(engine) == ("acme", "acme_platform.AcmePlatform")

    ignored = await run("xeon", discover_plugins=False)
    assert platform(ignored) == ("cpu", "CpuPlatform")


async def test_a_broken_gpu_driver_library_leaves_the_run_on_the_cpu() -> None:
    engine = await run("h200x8", faults=["pynvml=RuntimeError:NVML is broken"])

    assert platform(engine) == ("cpu", "CpuPlatform")
    cuda = engine.terminal("platform/cuda")
    assert isinstance(cuda, StepUnavailable)
    assert cuda.reasons == ("RuntimeError: NVML is broken",)
    assert engine.value(ATTENTION_STEP)["backend"] == "CPU_ATTN"
    assert engine.finished.outcome is RunOutcome.READY


async def test_a_broken_gpu_plugin_on_healthy_gpus_leaves_no_platform() -> None:
    # The GPUs answer, so the cpu plugin does not claim the host; the failed
    # cuda plugin is named as the reason there is no platform.
    engine = await run("h200x8", faults=["platform/cuda=RuntimeError:plugin bug"])

    assert isinstance(engine.error, UnspecifiedPlatformError)
    assert engine.error.failures == {"cuda": "RuntimeError: plugin bug"}
    assert type(engine.error.__cause__) is RuntimeError


async def test_no_plugin_activated_names_every_failed_plugin() -> None:
    engine = await run(
        "xeon",
        faults=["platform/cpu=OSError:no cpu for you", "platform/tpu=ValueError:bad tpu"],
    )

    error = engine.error
    assert isinstance(error, UnspecifiedPlatformError)
    assert error.failures == {"tpu": "ValueError: bad tpu", "cpu": "OSError: no cpu for you"}
    # The first failure (by plugin priority) is the cause.
    assert type(error.__cause__) is ValueError


async def test_an_exception_chain_is_named_in_full() -> None:
    def chained(ctx: StepContext) -> str | None:
        try:
            raise OSError("libfoo.so: cannot open shared object file")
        except OSError as exc:
            raise RuntimeError("plugin could not load its runtime") from exc

    engine = await run("xeon", plugins={"acme": chained}, faults=["platform/cpu=KeyError:x"])

    assert isinstance(engine.error, UnspecifiedPlatformError)
    assert engine.error.failures["acme"] == (
        "RuntimeError: plugin could not load its runtime, "
        "caused by OSError: libfoo.so: cannot open shared object file"
    )


async def test_a_plugin_interrupted_by_a_base_exception_propagates() -> None:
    engine = await run("xeon", faults=["platform/xpu=KeyboardInterrupt"])

    assert isinstance(engine.error, KeyboardInterrupt)
    assert isinstance(engine.terminal("platform/xpu"), StepFailed)
    assert engine.finished.outcome is RunOutcome.INTERRUPTED


async def test_a_hung_driver_times_the_gpu_plugin_out_and_lands_on_the_cpu() -> None:
    # NVML hangs: the cuda plugin times out at its own bound, before the
    # platform step's. The cpu plugin asks NVML too, but a query that has
    # not answered by the time its own plugin times out counts as "no usable
    # accelerator" (as one that raises does): the run lands on the CPU,
    # with the broken plugin named in a WARNING.
    engine = await run("h200x8", config=EngineConfig(step_timeout=0.2), faults=["pynvml=hang"])

    assert engine.error is None
    assert engine.outcome("platform/cuda") is Outcome.TIMED_OUT
    assert engine.outcome("platform/cpu") is Outcome.OK
    assert engine.outcome(PLATFORM_STEP) is Outcome.OK
    assert engine.finished.outcome is RunOutcome.READY
    messages = replay(engine.events).messages
    fallback = [m for m in messages if m.code == "platform.fallback"]
    assert [m.severity for m in fallback] == [Severity.WARNING]
    assert "cuda failed (timed out after 0.4 s)" in fallback[0].text


async def test_a_platform_step_that_hangs_itself_times_out() -> None:
    engine = await run("h200x8", config=EngineConfig(step_timeout=0.2), faults=["platform=hang"])

    assert isinstance(engine.error, StepTimeoutError)
    assert engine.outcome(PLATFORM_STEP) is Outcome.TIMED_OUT
    assert engine.finished.outcome is RunOutcome.FAILED


async def test_the_platform_decision_is_recomputed_from_the_events() -> None:
    engine = await run("h200x8")
    decision = engine.decision("platform.select")
    before = [e for e in engine.events if e.seq < decision.seq]

    assert decide_platform(before, decision.inputs) == decision.value
    assert decide_platform(before, {}) == decision.value, "the parent defaults to platform"
    # A log where cuda had not activated decides differently.
    edited = [
        e
        if not (isinstance(e, StepSucceeded) and e.step == "platform/cuda")
        else type(e)(
            **{**_fields(e), "result": {"activated": False, "platform_class": None, "device": None}}
        )
        for e in before
    ]
    assert decide_platform(edited, decision.inputs) is None


def _fields(event: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(event, recurse=False)
