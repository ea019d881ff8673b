"""The real host: its facts from a file tree, and the engine graph with real
probes and real imports on this machine."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from events import Outcome, RunOutcome, StepUnavailable
from orchestrator import RealImporter
from orchestrator.engine import (
    PLATFORM_STEP,
    ZENTORCH_STEP,
    BuildTarget,
    Devices,
    GpuDevice,
    HostFacts,
    Profile,
    RealHost,
    SimulatedHost,
    SimulatedImporter,
    is_amd_zen,
    load_profile,
)
from orchestrator.engine._host import amd_devices_from_amdsmi, build_target_of_torch, gfx_capability

from .harness import run

# Importing the real torch without numpy warns; that is not what these
# tests are about.
REAL_TORCH = pytest.mark.filterwarnings("ignore:Failed to initialize NumPy:UserWarning")

#: Nothing importable: the real host's file fallbacks are what answers.
NO_MODULES = SimulatedImporter(Profile(name="bare"))


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


# --- facts from the file system ---------------------------------------------------------


def test_a_host_without_cpuinfo_or_devices(tmp_path: Path) -> None:
    host = RealHost(tmp_path)

    assert isinstance(host, HostFacts)
    assert host.name == "real"
    assert host.read_cpuinfo() is None
    # Each query says why it found nothing, in words a user can act on.
    assert host.nvidia_devices(NO_MODULES) == Devices(reason="pynvml is not installed")
    assert host.amd_devices(NO_MODULES) == Devices(
        reason="amdsmi is not installed and no KFD GPU nodes"
    )
    assert host.tpu_devices(NO_MODULES) == Devices(reason="libtpu is not installed")
    assert host.xpu_devices(NO_MODULES) == Devices(reason="torch is not installed")
    assert host.nvswitch_multicast() is False
    assert host.nodes() is None


def test_nvidia_driver_files_without_nvml_are_gpus_present_but_unusable(tmp_path: Path) -> None:
    # vLLM asks NVML only; the driver's files are evidence the GPUs are
    # there, so the answer says what is missing instead of "no GPU".
    for bus in ("0000:1b:00.0", "0000:0a:00.0"):
        write(
            tmp_path,
            f"/proc/driver/nvidia/gpus/{bus}/information",
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 42\n",
        )
    write(tmp_path, "/proc/driver/nvidia/capabilities/fabric-imex-mgmt", "DeviceFileMinor: 1\n")
    host = RealHost(tmp_path)

    assert host.nvidia_devices(NO_MODULES) == Devices(
        reason="NVIDIA GPUs are present (/proc/driver/nvidia/gpus/0000:0a:00.0, "
        "/proc/driver/nvidia/gpus/0000:1b:00.0) but pynvml is not installed: "
        "install nvidia-ml-py",
        present=True,
    )
    assert host.nvswitch_multicast() is True


def test_more_than_three_pieces_of_nvidia_evidence_are_counted(tmp_path: Path) -> None:
    for index in range(8):
        write(tmp_path, f"/dev/nvidia{index}", "")
    host = RealHost(tmp_path)

    assert host.nvidia_devices(NO_MODULES) == Devices(
        reason="NVIDIA GPUs are present (/dev/nvidia0, /dev/nvidia1, /dev/nvidia2 and 5 more) "
        "but pynvml is not installed: install nvidia-ml-py",
        present=True,
    )


def test_the_build_target_is_named_or_read_off_torch(tmp_path: Path) -> None:
    named = RealHost(tmp_path, environ={"VLLM_TARGET_DEVICE": " CPU "})
    assert named.build_target(NO_MODULES) == BuildTarget(
        device="cpu", source="named by VLLM_TARGET_DEVICE", explicit=True
    )
    unnamed = RealHost(tmp_path, environ={})
    assert unnamed.build_target(NO_MODULES) == BuildTarget(
        device="cpu", source="no torch installed"
    )


@pytest.mark.parametrize(
    ("version", "build"),
    [
        ({"cuda": "12.8", "hip": None}, "cuda"),
        ({"cuda": None, "hip": "6.4.4"}, "rocm"),
        ({"cuda": None, "hip": None, "xpu": "20250101"}, "xpu"),
        ({"cuda": None, "hip": None}, "cpu"),
    ],
    ids=["cuda", "rocm", "xpu", "cpu"],
)
def test_the_torch_build_decides_the_target(version: dict[str, Any], build: str) -> None:
    class TorchOf:
        def find_spec(self, name: str) -> Any:
            return object() if name == "torch" else None

        def import_module(self, name: str) -> ModuleType:
            torch = ModuleType("torch")
            torch.__version__ = "2.13.0"  # type: ignore[attr-defined]
            torch.version = ModuleType("torch.version")  # type: ignore[attr-defined]
            vars(torch.version).update(version)  # type: ignore[attr-defined]
            return torch

    target = build_target_of_torch(TorchOf())  # type: ignore[arg-type]

    assert target.device == build
    assert target.source.startswith("torch 2.13.0, a ")
    assert target.explicit is False


def test_amd_kfd_topology_without_amdsmi(tmp_path: Path) -> None:
    nodes = "/sys/class/kfd/kfd/topology/nodes"
    write(tmp_path, f"{nodes}/0/properties", "cpu_cores_count 96\nsimd_count 0\n")
    write(tmp_path, f"{nodes}/1/properties", "simd_count 1216\ngfx_target_version 90402\n")
    write(tmp_path, f"{nodes}/1/name", "gfx942\n")

    assert RealHost(tmp_path).amd_devices(NO_MODULES).found == (
        GpuDevice(vendor="amd", name="gfx942", capability=(9, 4), index=0),
    )


def test_dev_kfd_alone_is_one_amd_device(tmp_path: Path) -> None:
    write(tmp_path, "/dev/kfd", "")

    devices = RealHost(tmp_path).amd_devices(NO_MODULES)

    assert [(d.vendor, d.capability) for d in devices.found] == [("amd", None)]


def test_nvml_is_asked_through_the_importer(tmp_path: Path) -> None:
    host = RealHost(tmp_path)

    devices = host.nvidia_devices(SimulatedImporter(load_profile("h200x8"))).found

    assert len(devices) == 8
    assert devices[0] == GpuDevice(vendor="nvidia", name="NVIDIA H200", capability=(9, 0), index=0)


class FakeLibrary:
    """An importer whose ``library`` fails to initialise (``init``) with
    ``error``."""

    def __init__(self, error: Exception, library: str = "pynvml", init: str = "nvmlInit") -> None:
        self.error, self.library, self.init = error, library, init

    def find_spec(self, name: str) -> Any:
        return object() if name == self.library else None

    def import_module(self, name: str) -> ModuleType:
        module = ModuleType(name)

        def init() -> None:
            raise self.error

        setattr(module, self.init, init)
        return module


def test_nvml_saying_there_is_no_driver_means_no_devices(tmp_path: Path) -> None:
    class NVMLError_DriverNotLoaded(Exception):
        __module__ = "pynvml"

        def __str__(self) -> str:
            return "Driver Not Loaded"

    assert RealHost(tmp_path).nvidia_devices(
        FakeLibrary(NVMLError_DriverNotLoaded())  # type: ignore[arg-type]
    ) == Devices(reason="Driver Not Loaded")


def test_amd_smi_saying_there_is_no_driver_names_its_error(tmp_path: Path) -> None:
    # An error without a message is named by its class, never an empty reason.
    class AmdSmiLibraryException(Exception):
        __module__ = "amdsmi"

    importer = FakeLibrary(AmdSmiLibraryException(), "amdsmi", "amdsmi_init")
    assert amd_devices_from_amdsmi(importer) == Devices(  # type: ignore[arg-type]
        reason="AMD SMI: AmdSmiLibraryException"
    )


def test_any_other_nvml_failure_is_raised(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="broken"):
        RealHost(tmp_path).nvidia_devices(FakeLibrary(RuntimeError("broken")))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("target", "capability"),
    [("gfx942", (9, 4)), ("gfx90a", (9, 0)), ("gfx1100", (11, 0)), ("gfx950", (9, 5)), ("", None)],
)
def test_gfx_versions(target: str, capability: tuple[int, int] | None) -> None:
    assert gfx_capability(target) == capability


def test_the_real_host_rebuilds_from_its_isolation_spec(tmp_path: Path) -> None:
    spec = RealHost(tmp_path).isolation_spec()

    assert spec["factory"] == "orchestrator.engine._host:RealHost"
    assert repr(RealHost(spec["args"])) == repr(RealHost(tmp_path))


# --- this machine ---------------------------------------------------------------------------


def this_is_a_cpu_build() -> bool:
    return RealHost().build_target(RealImporter()).device == "cpu"


@REAL_TORCH
@pytest.mark.anyio
async def test_the_engine_runs_on_this_host_with_real_probes() -> None:
    engine = await run(None)

    assert engine.error is None
    assert engine.finished.outcome is RunOutcome.READY
    cpuinfo = RealHost().read_cpuinfo()
    zen = is_amd_zen(cpuinfo)
    if this_is_a_cpu_build():
        # The CPU build (torch's, or VLLM_TARGET_DEVICE=cpu) decides.
        assert engine.value(PLATFORM_STEP)["plugin"] == "cpu"
        expected = {"CpuPlatform"} if not zen else {"CpuPlatform", "ZenCpuPlatform"}
        assert engine.value(PLATFORM_STEP)["platform_class"] in expected
    else:
        assert engine.value(PLATFORM_STEP)["plugin"] != "cpu"
    # The zentorch branch runs exactly when the CPU is an AMD Zen with AVX-512.
    assert (ZENTORCH_STEP in engine.steps()) is zen


#: The command that installs the real zentorch wheel beside torch, as .ci/run
#: does (--no-deps keeps torch 2.13.0 as installed).
ZENTORCH_INSTALL = ".venv/bin/pip install --no-deps 'zentorch==2.14.0.1'"


def versions() -> tuple[str, str]:
    """zentorch's and torch's installed versions (skips when either is missing)."""
    try:
        return importlib.metadata.version("zentorch"), importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError as missing:
        pytest.skip(
            f"{missing.name} is not installed; the real-zentorch tests run after "
            f"{ZENTORCH_INSTALL} (.ci/run installs it; the README's test command does not)"
        )


def expect_incompatible_torch() -> None:
    zentorch, torch = versions()
    if zentorch.split(".")[:2] == torch.split("+")[0].split(".")[:2]:
        pytest.skip(f"zentorch {zentorch} matches torch {torch}; this case needs a mismatch")


def assert_zentorch_broken_by_the_torch_version(engine: Any) -> None:
    broken = engine.terminal(ZENTORCH_STEP)
    assert isinstance(broken, StepUnavailable)
    assert broken.outcome is Outcome.UNAVAILABLE
    assert broken.reasons[0].startswith("ImportError: Incompatible PyTorch version")
    assert broken.cause.type == "ImportError"
    assert engine.value(PLATFORM_STEP)["platform_class"] == "CpuPlatform"


@REAL_TORCH
@pytest.mark.anyio
async def test_the_real_zentorch_wheel_beside_an_incompatible_torch_on_this_host() -> None:
    expect_incompatible_torch()
    if not is_amd_zen(RealHost().read_cpuinfo()):
        pytest.skip("this CPU is not an AMD Zen with AVX-512, so the cpu plugin skips zentorch")

    engine = await run(None)

    assert_zentorch_broken_by_the_torch_version(engine)


@REAL_TORCH
@pytest.mark.anyio
async def test_the_real_zentorch_wheel_beside_an_incompatible_torch_on_zen_facts() -> None:
    # Zen CPU facts from the profile, every import real: the zentorch wheel's
    # own version check runs whatever CPU this machine has.
    expect_incompatible_torch()
    zen4 = load_profile("zen4")

    engine = await run(None, host=SimulatedHost(zen4), importer=RealImporter())

    assert_zentorch_broken_by_the_torch_version(engine)
