"""SPEC §3.2: platform detection and the zentorch branch, through the real
engine graph."""

from __future__ import annotations

import re
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
    replay,
)
from events.testing import EventStream
from orchestrator import FaultPlan, RealImporter, StepContext, StepTimeoutError
from orchestrator._decisions import check_decisions
from orchestrator.engine import (
    ATTENTION_STEP,
    BUILTIN_PROFILES,
    ENGINE,
    ENGINE_DECIDERS,
    PLATFORM_BUILD_STEP,
    PLATFORM_PLUGIN_GROUP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
    EngineConfig,
    PlatformConflictError,
    Profile,
    RealHost,
    SimulatedImporter,
    UnspecifiedPlatformError,
    build_engine_graph,
    decide_platform,
    decline,
    is_amd_zen,
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
    assert "; cpu failed: RuntimeError: unknown zentorch failure" in str(error)
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
    cuda = engine.terminal("platform/cuda")
    assert isinstance(cuda, StepSucceeded)
    assert cuda.result == {"activated": True, "platform_class": "CudaPlatform", "device": "cuda"}
    declined = {p: engine.terminal(f"platform/{p}") for p in ("tpu", "rocm", "xpu", "cpu")}
    assert {p: (e.outcome, e.reasons) for p, e in declined.items()} == {  # type: ignore[attr-defined]
        "tpu": (Outcome.ABSENT, ("libtpu is not installed",)),
        "rocm": (Outcome.ABSENT, ("amdsmi is not installed",)),
        "xpu": (Outcome.ABSENT, ("torch.xpu reports no XPU devices",)),
        "cpu": (
            Outcome.ABSENT,
            (
                "this build targets cuda (profile h200x8; set VLLM_TARGET_DEVICE=cpu to start on "
                "the CPU)",
            ),
        ),
    }
    assert engine.started(PLATFORM_BUILD_STEP).kind is StepKind.STEP
    assert engine.terminal(PLATFORM_BUILD_STEP).result == {  # type: ignore[attr-defined]
        "device": "cuda",
        "source": "profile h200x8",
        "explicit": False,
    }
    assert platform(engine) == ("cuda", "CudaPlatform")


async def test_a_decline_is_a_debug_message_with_its_reason_and_a_span_attribute() -> None:
    engine = await run("xeon")

    messages = {
        m.code: m
        for m in replay(engine.events, slices=[ENGINE]).messages
        if m.step == "platform/tpu"
    }
    declined = messages["platform.plugin_declined"]
    assert declined.severity is Severity.DEBUG
    assert declined.text == "Platform plugin tpu declined: libtpu is not installed"
    from exporters import spans_from_events

    (tpu,) = [
        span
        for span in spans_from_events(engine.events)
        if span.attributes is not None and span.attributes.get("startup.step") == "platform/tpu"
    ]
    assert tpu.attributes is not None
    assert tpu.attributes["startup.outcome"] == "absent"
    assert list(tpu.attributes["startup.reasons"]) == ["libtpu is not installed"]


async def test_nothing_activated_names_every_reason_and_what_would_change_it() -> None:
    # A CUDA build on a host without GPUs fails as vLLM does, saying why.
    engine = await run("xeon", config=EngineConfig(target_device="cuda"))

    error = engine.error
    assert isinstance(error, UnspecifiedPlatformError)
    assert str(error) == (
        "Failed to infer device type: no platform plugin activated. "
        "tpu: libtpu is not installed; cuda: pynvml is not installed; "
        "rocm: amdsmi is not installed; xpu: torch.xpu reports no XPU devices; "
        "cpu: this build targets cuda (named by --target-device; set VLLM_TARGET_DEVICE=cpu "
        "to start on the CPU)"
    )
    assert error.failures == {}
    assert error.declined["cpu"].startswith("this build targets cuda")
    assert error.__cause__ is None
    (unspecified,) = [
        m
        for m in replay(engine.events, slices=[ENGINE]).messages
        if m.code == "platform.unspecified"
    ]
    assert unspecified.severity is Severity.ERROR
    assert unspecified.text == str(error)


async def test_an_explicit_cpu_target_probes_the_cpu_plugin_alone() -> None:
    # vLLM's fast path: VLLM_TARGET_DEVICE=cpu is authoritative, on a GPU
    # host too, and out-of-tree plugins are not even asked.
    asked: list[str] = []

    def acme(ctx: StepContext) -> str:
        asked.append(ctx.step)
        return "acme.AcmePlatform"

    engine = await run("h200x8", config=EngineConfig(target_device="cpu"), plugins={"acme": acme})

    assert platform(engine) == ("cpu", "CpuPlatform")
    assert engine.steps("platform/") == [PLATFORM_BUILD_STEP, "platform/cpu"]
    assert asked == []


async def test_a_cpu_build_on_an_amd_gpu_host_is_vllms_conflict() -> None:
    # vLLM #11739: the cpu plugin activates for a CPU build whatever the
    # host has, and the rocm plugin does not look at the build.
    profile = variant(
        "xeon",
        build="cpu",
        gpus={"vendor": "amd", "count": 8, "name": "AMD Instinct MI300X", "capability": [9, 4]},
    )
    engine = await run(profile)

    assert isinstance(engine.error, PlatformConflictError)
    assert engine.error.plugins == ["rocm", "cpu"]
    assert "set VLLM_TARGET_DEVICE=cpu to start on the CPU" in str(engine.error)
    # ... and the cuda plugin declines on a CPU build, as vLLM's does.
    on_nvidia = await run(variant("h200x8", build="cpu"))
    assert platform(on_nvidia) == ("cpu", "CpuPlatform")
    assert on_nvidia.terminal("platform/cuda").reasons == (  # type: ignore[attr-defined]
        "this build targets cpu (profile h200x8-variant)",
    )


async def test_gpus_there_without_a_usable_nvml_warn_that_the_runtime_is_missing(
    tmp_path: Path,
) -> None:
    # A GPU container started without the NVIDIA runtime: device nodes, and
    # the real nvidia-ml-py finding no NVML library. vLLM says "NVML Shared
    # Library Not Found" at DEBUG; this says what happened, at WARNING, and
    # the start still fails as vLLM's does.
    pytest.importorskip("pynvml", reason="install the test extra: pip install -e '.[test]'")
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / "dev" / name).write_text("")
    engine = await run(
        None,
        host=RealHost(tmp_path, environ={}),
        importer=RealImporter(),
        config=EngineConfig(target_device="cuda"),
    )

    cuda = engine.terminal("platform/cuda")
    assert isinstance(cuda, StepUnavailable)
    assert cuda.outcome is Outcome.UNAVAILABLE
    assert cuda.cause is None
    assert cuda.reasons == (
        "NVIDIA GPUs are present (/dev/nvidia0, /dev/nvidia1) but NVML Shared Library Not "
        "Found: the container was probably started without the NVIDIA runtime (docker run "
        "--gpus all, or the NVIDIA Container Toolkit)",
    )
    (warning,) = [
        m
        for m in replay(engine.events, slices=[ENGINE]).messages
        if m.code == "platform.device_unusable"
    ]
    assert warning.severity is Severity.WARNING
    assert "started without the NVIDIA runtime" in warning.text
    assert isinstance(engine.error, UnspecifiedPlatformError)
    # Unusable hardware is a decline with its reason, not a failed plugin.
    assert "; cuda: NVIDIA GPUs are present (/dev/nvidia0" in str(engine.error)
    assert "cuda" not in engine.error.failures


async def test_a_build_target_that_cannot_be_read_is_named_by_the_cpu_plugin(
    tmp_path: Path,
) -> None:
    # torch itself is broken: the build is unknown, so the cpu plugin
    # declines saying why; the xpu plugin, which imports torch too, fails.
    engine = await run(
        None,
        host=RealHost(tmp_path, environ={}),
        importer=SimulatedImporter(BUILTIN_PROFILES["xeon"]),
        faults=["torch=ImportError:libtorch_cpu.so: cannot open shared object file"],
    )

    build = engine.terminal(PLATFORM_BUILD_STEP)
    assert isinstance(build, StepUnavailable)
    assert build.cause is not None
    assert isinstance(engine.error, UnspecifiedPlatformError)
    assert engine.error.declined["cpu"] == (
        "the build target is unknown (ImportError: libtorch_cpu.so: cannot open shared object file)"
    )
    assert set(engine.error.failures) == {"xpu"}
    # The build target is not a plugin: no plugin message names it.
    plugins = [
        m.args[0]
        for m in replay(engine.events, slices=[ENGINE]).messages
        if m.code.startswith("platform.p")
    ]
    assert "build" not in plugins
    assert sorted(plugins) == ["cpu", "cuda", "rocm", "tpu", "xpu"]


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
    assert engine.outcome("platform/cpu") is Outcome.ABSENT


@pytest.mark.parametrize(
    ("gpu", "capability", "backend"),
    [
        ("AMD Instinct MI300X", [9, 4], "ROCM_AITER_FA"),
        ("AMD Instinct MI250X", [9, 0], "ROCM_ATTN"),
    ],
    ids=["gfx942", "gfx90a"],
)
async def test_rocm_selects_its_own_attention_backend(
    gpu: str, capability: list[int], backend: str
) -> None:
    profile = variant(
        "xeon",
        gpus={"vendor": "amd", "count": 8, "name": gpu, "capability": capability},
        modules={"torch": "import", "triton": "import", "aiter": "import"},
    )
    engine = await run(profile)

    assert engine.value(ATTENTION_STEP)["backend"] == backend
    # The AMD GPUs' compute capability reaches the candidates' checks.
    aiter = engine.terminal("attention/ROCM_AITER_FA")
    if backend == "ROCM_AITER_FA":
        assert isinstance(aiter, StepSucceeded)
    else:
        assert isinstance(aiter, StepUnavailable)
        assert aiter.reasons == ("compute capability 9.0 not supported",)


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
    declined = engine.terminal("platform/nop")
    assert isinstance(declined, StepUnavailable)
    assert (declined.outcome, declined.reasons) == (
        Outcome.ABSENT,
        ("platform plugin 'nop' declined without a reason (returned None)",),
    )


async def test_a_third_party_plugin_declines_with_its_reason() -> None:
    def acme(ctx: StepContext) -> Any:
        return decline("no Acme accelerator: /dev/acme0 is missing")

    engine = await run("xeon", plugins={"acme": acme})

    assert platform(engine) == ("cpu", "CpuPlatform")
    declined = engine.terminal("platform/acme")
    assert isinstance(declined, StepUnavailable)
    assert declined.reasons == ("no Acme accelerator: /dev/acme0 is missing",)
    texts = [m.text for m in replay(engine.events, slices=[ENGINE]).messages]
    assert "Platform plugin acme declined: no Acme accelerator: /dev/acme0 is missing" in texts


SHADOWS = "has the name of a built-in plugin or step (tpu, cuda, rocm, xpu, cpu, build); rename it"


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("cuda", f"third-party platform plugin 'cuda' (given to the engine) {SHADOWS}"),
        # platform/build is the build target's step, not a plugin's.
        ("build", f"third-party platform plugin 'build' (given to the engine) {SHADOWS}"),
        ("a/b", "platform plugin name 'a/b' (given to the engine) must be non-empty without '/'"),
        ("", "platform plugin name '' (given to the engine) must be non-empty without '/'"),
    ],
)
def test_third_party_plugin_names_are_checked(name: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
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


async def test_a_broken_gpu_driver_library_on_a_cuda_build_leaves_no_platform() -> None:
    # As vLLM decides: a CUDA build does not fall back to the CPU.
    engine = await run("h200x8", faults=["pynvml=RuntimeError:NVML is broken"])

    assert isinstance(engine.error, UnspecifiedPlatformError)
    assert engine.error.failures == {"cuda": "RuntimeError: NVML is broken"}
    assert type(engine.error.__cause__) is RuntimeError
    cuda = engine.terminal("platform/cuda")
    assert isinstance(cuda, StepUnavailable)
    assert cuda.reasons == ("RuntimeError: NVML is broken",)


async def test_a_failed_plugin_that_leaves_the_run_on_the_cpu_is_a_warning() -> None:
    engine = await run("xeon", faults=["platform/xpu=RuntimeError:XPU runtime is broken"])

    assert platform(engine) == ("cpu", "CpuPlatform")
    assert engine.value(ATTENTION_STEP)["backend"] == "CPU_ATTN"
    assert engine.finished.outcome is RunOutcome.READY
    (fallback,) = [
        m for m in replay(engine.events, slices=[ENGINE]).messages if m.code == "platform.fallback"
    ]
    assert fallback.severity is Severity.WARNING
    assert "xpu failed (RuntimeError: XPU runtime is broken)" in fallback.text


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


def test_no_platform_without_any_plugin_says_none_ran() -> None:
    error = UnspecifiedPlatformError({})

    assert str(error) == (
        "Failed to infer device type: no platform plugin activated. No platform plugin ran."
    )
    assert (error.declined, error.failures) == ({}, {})


async def test_a_plugin_interrupted_by_a_base_exception_propagates() -> None:
    engine = await run("xeon", faults=["platform/xpu=KeyboardInterrupt"])

    assert isinstance(engine.error, KeyboardInterrupt)
    assert isinstance(engine.terminal("platform/xpu"), StepFailed)
    assert engine.finished.outcome is RunOutcome.INTERRUPTED


async def test_a_hung_driver_times_the_gpu_plugin_out_and_names_it() -> None:
    # NVML hangs: the cuda plugin times out at its own bound, before the
    # platform step's, and the run fails naming it (a CUDA build does not
    # land on the CPU).
    engine = await run("h200x8", config=EngineConfig(step_timeout=0.2), faults=["pynvml=hang"])

    assert isinstance(engine.error, UnspecifiedPlatformError)
    assert engine.outcome("platform/cuda") is Outcome.TIMED_OUT
    assert engine.outcome("platform/cpu") is Outcome.ABSENT
    assert engine.error.failures == {"cuda": "timed out after 0.4 s"}
    assert engine.finished.outcome is RunOutcome.FAILED


async def test_a_platform_step_that_hangs_itself_times_out() -> None:
    engine = await run("h200x8", config=EngineConfig(step_timeout=0.2), faults=["platform=hang"])

    assert isinstance(engine.error, StepTimeoutError)
    assert engine.outcome(PLATFORM_STEP) is Outcome.TIMED_OUT
    assert engine.finished.outcome is RunOutcome.FAILED


@pytest.mark.parametrize(
    "declined",
    [
        {"activated": False, "platform_class": None, "device": None},
        # Naming a class is not activating: only "activated": true is.
        {"activated": False, "platform_class": "CudaPlatform", "device": "cuda"},
    ],
    ids=["no-class", "class-named"],
)
async def test_the_platform_decision_is_recomputed_from_the_events(
    declined: dict[str, Any],
) -> None:
    engine = await run("h200x8")
    decision = engine.decision("platform.select")
    before = [e for e in engine.events if e.seq < decision.seq]

    assert decide_platform(before, decision.inputs) == decision.value
    assert decide_platform(before, {}) == decision.value, "the parent defaults to platform"
    # A log where cuda had not activated (an earlier release's ok decline)
    # decides differently.
    edited = [
        e
        if not (isinstance(e, StepSucceeded) and e.step == "platform/cuda")
        else type(e)(**{**_fields(e), "result": declined})
        for e in before
    ]
    assert decide_platform(edited, decision.inputs) is None


def _fields(event: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(event, recurse=False)


@pytest.mark.parametrize(("supported", "warned"), [(True, False), (False, True), (None, False)])
def test_a_vllm_release_outside_the_tested_ones_is_a_warning(
    supported: bool | None, warned: bool
) -> None:
    # None: a log that does not say whether the release was tested (no warning).
    # What the platform step of `--engine vllm` records at its start.
    stream = EventStream().run_started()
    stream.started(
        PLATFORM_STEP,
        attributes={
            "engine": "vllm",
            "vllm_version": "0.33.0" if supported else "0.40.1",
            "vllm_tested": "0.33",
            **({} if supported is None else {"vllm_supported": supported}),
        },
    )
    events = stream.succeeded(
        PLATFORM_STEP, {"plugin": "cpu", "platform_class": "CpuPlatform", "device": "cpu"}
    ).run_finished()

    messages = {m.code: m for m in replay(events, slices=[ENGINE]).messages}
    assert messages["platform.vllm_code"].severity is Severity.INFO
    assert ("platform.vllm_untested" in messages) is warned
    if warned:
        untested = messages["platform.vllm_untested"]
        assert untested.severity is Severity.WARNING
        assert untested.text.startswith(
            "vLLM 0.40.1 is outside the releases this startup-orchestrator was tested with (0.33)"
        )
