"""Host facts: what the platform probes ask about the machine.

The probes never know whether the host is real. They ask a :class:`HostFacts`
object for ``/proc/cpuinfo``, for the build target and for the devices of
each vendor, handing it the run's importer, so every driver library they
touch (``pynvml``, ``amdsmi``, ``libtpu``, ``torch``) is imported through the
importer — where faults are injected and where a simulated profile decides
what exists. A device query answers with :class:`Devices`: what it found, or
why there is nothing, in the terms a user can act on.

:class:`RealHost` reads this machine; :class:`~orchestrator.engine.SimulatedHost`
answers from a profile. Both can be rebuilt in an isolated step's child
process from ``isolation_spec()``.
"""

from __future__ import annotations

import abc
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from .._importer import Importer

__all__ = [
    "DRIVER_MODULES",
    "TARGET_DEVICE_VARIABLE",
    "BuildTarget",
    "Devices",
    "GpuDevice",
    "HostFacts",
    "RealHost",
    "amd_devices_from_amdsmi",
    "build_target_of_torch",
    "is_amd_zen",
]

#: The variable that names the build target, as in vLLM.
TARGET_DEVICE_VARIABLE = "VLLM_TARGET_DEVICE"

#: Build target -> the driver library its devices are queried through, in
#: the order a build target prefers them.
DRIVER_MODULES = {"cuda": "pynvml", "rocm": "amdsmi", "tpu": "libtpu", "xpu": "torch"}


@attrs.frozen(kw_only=True)
class GpuDevice:
    """One accelerator.

    Attributes:
        vendor: ``nvidia``, ``amd`` or ``intel``.
        name: the marketing name (``NVIDIA H200``).
        capability: ``(major, minor)`` compute capability (CUDA SM version;
            for AMD the gfx version, ``gfx942`` -> ``(9, 4)``), or ``None``
            when the source does not tell (driver files, XPUs).
        index: position among the vendor's devices.
    """

    vendor: str
    name: str
    capability: tuple[int, int] | None
    index: int


@attrs.frozen(kw_only=True)
class Devices:
    """What one device query found.

    Attributes:
        found: the devices, by index; empty when there are none.
        reason: when ``found`` is empty, why, in the terms a user can act on
            (``pynvml is not installed``, ``NVML Shared Library Not
            Found``, ``NVML reports no devices``); empty otherwise.
        present: the hardware is evidently there (device nodes, driver
            files, a profile's GPUs) although nothing usable was found:
            ``reason`` then says what is missing and what to do.
    """

    found: tuple[GpuDevice, ...] = ()
    reason: str = ""
    present: bool = False


@attrs.frozen(kw_only=True)
class BuildTarget:
    """What the engine's build targets, which decides whether the CPU
    platform may be used (as vLLM's ``VLLM_TARGET_DEVICE`` and build do).

    Attributes:
        device: ``cuda``, ``rocm``, ``cpu``, ``tpu`` or ``xpu`` (or what
            ``VLLM_TARGET_DEVICE`` says, lower-cased).
        source: where it came from, for the record
            (``torch 2.13.0+cpu``, ``VLLM_TARGET_DEVICE``, ``profile xeon``).
        explicit: named by the user (``VLLM_TARGET_DEVICE`` or
            ``--target-device``) rather than read off the installed build:
            an explicit ``cpu`` probes the cpu plugin alone, as vLLM does.
    """

    device: str
    source: str
    explicit: bool = False


@runtime_checkable
class HostFacts(Protocol):
    """What the platform probes may ask about a host.

    Methods taking an ``importer`` import driver libraries only through it
    (a :class:`~orchestrator.StepContext` is an importer too). They raise
    what the library raises when it is broken; a library that reports "no
    driver here" means no devices.
    """

    @property
    def name(self) -> str:
        """``real``, or the simulated profile's name."""
        ...

    def read_cpuinfo(self) -> str | None:
        """The text of ``/proc/cpuinfo``; ``None`` if there is no such file."""
        ...

    def build_target(self, importer: Importer) -> BuildTarget:
        """What the build targets (the installed torch, or what the user
        named)."""
        ...

    def nvidia_devices(self, importer: Importer) -> Devices:
        """NVIDIA GPUs, through NVML (``pynvml``)."""
        ...

    def amd_devices(self, importer: Importer) -> Devices:
        """AMD GPUs (``amdsmi`` when importable, else the KFD topology)."""
        ...

    def tpu_devices(self, importer: Importer) -> Devices:
        """A TPU when ``libtpu`` is installed."""
        ...

    def xpu_devices(self, importer: Importer) -> Devices:
        """Intel XPUs (``torch.xpu``; torch is imported only if findable)."""
        ...

    def nvswitch_multicast(self) -> bool:
        """Whether NVSwitch multicast (multi-node NVLink) is usable."""
        ...

    def nodes(self) -> int | None:
        """How many nodes the launch spans, if the host knows."""
        ...

    def isolation_spec(self) -> dict[str, Any]:
        """How to rebuild this object in a child process
        (``{"factory": "module:function", "args": <JSON>}``)."""
        ...


def is_amd_zen(cpuinfo: str | None) -> bool:
    """Whether ``/proc/cpuinfo`` describes an AMD Zen CPU with AVX-512 (the
    hosts zentorch targets): vendor ``AuthenticAMD`` and an ``avx512*`` flag.
    No cpuinfo (``None``) means not Zen."""
    fields = [line.partition(":") for line in (cpuinfo or "").splitlines()]
    vendors = {value.strip() for key, _, value in fields if key.strip() == "vendor_id"}
    flags = [flag for key, _, value in fields if key.strip() == "flags" for flag in value.split()]
    return "AuthenticAMD" in vendors and any(flag.startswith("avx512") for flag in flags)


def build_target_of_torch(importer: Importer) -> BuildTarget:
    """The build target of the installed torch: ``torch.version.cuda`` ->
    cuda, ``.hip`` -> rocm, ``.xpu`` -> xpu, a CPU build or no torch -> cpu.
    A torch that fails to import propagates."""
    if importer.find_spec("torch") is None:
        return BuildTarget(device="cpu", source="no torch installed")
    torch = importer.import_module("torch")
    version = getattr(torch, "version", None)
    release = getattr(torch, "__version__", "")
    for attribute, device, kind in (
        ("cuda", "cuda", "CUDA"),
        ("hip", "rocm", "ROCm"),
        ("xpu", "xpu", "XPU"),
    ):
        if getattr(version, attribute, None):
            return BuildTarget(device=device, source=f"torch {release}, a {kind} build")
    return BuildTarget(device="cpu", source=f"torch {release}, a CPU build")


def _ask_library(
    importer: Importer,
    library: str,
    calls: tuple[str, str],
    read: Callable[[Any], Iterator[GpuDevice]],
    what: str,
    no_driver: str = "",
) -> Devices | None:
    """Init ``library`` with ``calls[0]``, read its devices, then shut it
    down with ``calls[1]`` (``None``: not installed); ``what`` names it in reasons."""
    if importer.find_spec(library) is None:
        return None
    module = importer.import_module(library)
    try:
        getattr(module, calls[0])()
    except Exception as exc:
        # NVML and AMD SMI raise their own error classes when the kernel driver
        # is missing; that is "no devices here", not a broken plugin. Anything
        # else (an injected fault, a bug) is left to the caller's policy.
        origin = type(exc).__module__ or ""
        if origin == library or origin.startswith(library + "."):
            return Devices(reason=no_driver + (str(exc) or type(exc).__name__))
        raise
    try:
        found = tuple(read(module))
    finally:
        getattr(module, calls[1])()
    return Devices(found=found, reason="" if found else f"{what} reports no devices")


def _nvml_devices(nvml: Any) -> Iterator[GpuDevice]:
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        name = nvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):  # older pynvml releases
            name = name.decode("utf-8", "replace")
        yield GpuDevice(
            vendor="nvidia", name=str(name), capability=(int(major), int(minor)), index=index
        )


def gfx_capability(target: str | None) -> tuple[int, int] | None:
    """``gfx942`` -> ``(9, 4)``, ``gfx90a`` -> ``(9, 0)``, ``gfx1100`` ->
    ``(11, 0)``; ``None`` for anything else."""
    match = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", (target or "").strip().lower())
    if match is None:
        return None
    return int(match[1]), int(match[2], 16)


def amd_devices_from_amdsmi(importer: Importer) -> Devices | None:
    """Ask AMD SMI through ``amdsmi``; ``None`` when it is not installed."""
    return _ask_library(
        importer,
        "amdsmi",
        ("amdsmi_init", "amdsmi_shut_down"),
        _amdsmi_devices,
        "AMD SMI",
        "AMD SMI: ",
    )


def _amdsmi_devices(smi: Any) -> Iterator[GpuDevice]:
    for index, handle in enumerate(smi.amdsmi_get_processor_handles()):
        info = smi.amdsmi_get_gpu_asic_info(handle)
        yield GpuDevice(
            vendor="amd",
            name=str(info.get("market_name") or "AMD GPU"),
            capability=gfx_capability(info.get("target_graphics_version")),
            index=index,
        )


#: What to do when NVIDIA GPUs are there but NVML cannot be used.
_NVIDIA_RUNTIME_HINT = (
    "the container was probably started without the NVIDIA runtime "
    "(docker run --gpus all, or the NVIDIA Container Toolkit)"
)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


class HostBase(abc.ABC):
    """What a real and a simulated host answer alike, asking the driver
    libraries only through the importer; where a real host falls back to
    the driver's files, a simulated one answers from its profile."""

    def nvidia_devices(self, importer: Importer) -> Devices:
        """NVML through ``pynvml`` (vLLM asks nothing else). Not installed,
        an NVML that cannot load (``NVML Shared Library Not Found``: no
        driver, or a container started without the NVIDIA runtime) or no
        devices is an empty answer with its reason; anything else pynvml
        raises propagates. When it finds nothing while the host shows NVIDIA
        GPUs (device nodes or driver files, a profile's GPUs), the answer
        says they are ``present``, why NVML cannot use them, and what to do."""
        asked = _ask_library(
            importer, "pynvml", ("nvmlInit", "nvmlShutdown"), _nvml_devices, "NVML"
        )
        devices = Devices(reason="pynvml is not installed") if asked is None else asked
        evidence = "" if devices.found else self._nvidia_evidence()
        if not evidence:
            return devices
        hint = "install nvidia-ml-py" if asked is None else _NVIDIA_RUNTIME_HINT
        return Devices(
            reason=f"NVIDIA GPUs are present ({evidence}) but {devices.reason}: {hint}",
            present=True,
        )

    def amd_devices(self, importer: Importer) -> Devices:
        """AMD SMI when ``amdsmi`` is importable, else what the host shows
        without it."""
        devices = amd_devices_from_amdsmi(importer)
        return self._amd_devices_without_smi() if devices is None else devices

    @abc.abstractmethod
    def _nvidia_evidence(self) -> str:
        """What shows NVIDIA GPUs here without NVML (empty: nothing)."""

    @abc.abstractmethod
    def _amd_devices_without_smi(self) -> Devices:
        """What the host shows of AMD GPUs when AMD SMI cannot be imported."""

    def tpu_devices(self, importer: Importer) -> Devices:
        """A TPU when ``libtpu`` imports through ``importer`` (as vLLM's TPU
        plugin decides: installed means a TPU host). An import that raises
        propagates, so a broken or injected ``libtpu`` is a failed plugin, never
        a TPU."""
        if importer.find_spec("libtpu") is None:
            return Devices(reason="libtpu is not installed")
        importer.import_module("libtpu")
        return Devices(found=(GpuDevice(vendor="google", name="TPU", capability=None, index=0),))

    def xpu_devices(self, importer: Importer) -> Devices:
        """Ask ``torch.xpu``; importing torch takes seconds, so it happens only
        when torch is findable."""
        if importer.find_spec("torch") is None:
            return Devices(reason="torch is not installed")
        xpu = getattr(importer.import_module("torch"), "xpu", None)
        if xpu is None:
            return Devices(reason="this torch build has no XPU support")
        if not xpu.is_available():
            return Devices(reason="torch.xpu reports no XPU devices")
        return Devices(
            found=tuple(
                GpuDevice(
                    vendor="intel",
                    name=str(xpu.get_device_name(index)),
                    capability=None,
                    index=index,
                )
                for index in range(xpu.device_count())
            )
        )


class RealHost(HostBase):
    """This machine.

    Args:
        root: the file-system root the driver files are read under (tests
            point it at a fake tree; default ``/``).
        environ: the environment ``VLLM_TARGET_DEVICE`` is read from
            (default :data:`os.environ`).
    """

    name = "real"

    def __init__(self, root: str | Path = "/", environ: Mapping[str, str] | None = None) -> None:
        self._root = Path(root)
        self._environ = os.environ if environ is None else environ

    def __repr__(self) -> str:
        return f"RealHost(root={str(self._root)!r})"

    def _path(self, path: str) -> Path:
        return self._root / path.lstrip("/")

    def read_cpuinfo(self) -> str | None:
        return _read_text(self._path("/proc/cpuinfo"))

    def build_target(self, importer: Importer) -> BuildTarget:
        """``VLLM_TARGET_DEVICE`` when set, else the installed torch's build
        (:func:`build_target_of_torch`)."""
        named = self._environ.get(TARGET_DEVICE_VARIABLE, "").strip().lower()
        if named:
            return BuildTarget(
                device=named, source=f"named by {TARGET_DEVICE_VARIABLE}", explicit=True
            )
        return build_target_of_torch(importer)

    def _nvidia_evidence(self) -> str:
        evidence = [
            *sorted(self._path("/dev").glob("nvidia[0-9]*")),
            *_sorted_entries(self._path("/proc/driver/nvidia/gpus")),
        ]
        shown = ", ".join(f"/{path.relative_to(self._root)}" for path in evidence[:3])
        more = f" and {len(evidence) - 3} more" if len(evidence) > 3 else ""
        return shown + more

    def _amd_devices_without_smi(self) -> Devices:
        # The KFD topology nodes with SIMD units (CPU nodes have none), else
        # one device of unknown kind if /dev/kfd exists.
        found: list[GpuDevice] = []
        for node in _sorted_entries(self._path("/sys/class/kfd/kfd/topology/nodes")):
            properties = _parse_properties(_read_text(node / "properties") or "")
            if properties.get("simd_count", 0) <= 0:
                continue
            version = properties.get("gfx_target_version", 0)
            capability = (version // 10000, (version // 100) % 100) if version else None
            name = (_read_text(node / "name") or "").strip() or "AMD GPU"
            found.append(
                GpuDevice(vendor="amd", name=name, capability=capability, index=len(found))
            )
        if not found and self._path("/dev/kfd").exists():
            found.append(GpuDevice(vendor="amd", name="AMD GPU", capability=None, index=0))
        reason = "" if found else "amdsmi is not installed and no KFD GPU nodes"
        return Devices(found=tuple(found), reason=reason)

    def nvswitch_multicast(self) -> bool:
        """Whether the driver exposes the fabric (IMEX) capability that
        multi-node NVLink multicast needs. A heuristic: the authoritative
        answer is whether the mnnvl workspace can be created."""
        return self._path("/proc/driver/nvidia/capabilities/fabric-imex-mgmt").exists()

    def nodes(self) -> int | None:
        """Unknown: the launcher's rank identity says how many nodes there are."""
        return None

    def isolation_spec(self) -> dict[str, Any]:
        """Rebuilt in a child process as ``RealHost(root)``."""
        return {"factory": f"{__name__}:RealHost", "args": str(self._root)}


def _sorted_entries(directory: Path) -> Sequence[Path]:
    try:
        return sorted(entry for entry in directory.iterdir() if entry.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return ()


def _parse_properties(text: str) -> dict[str, int]:
    values: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    return values
