"""Host facts: what the platform probes ask about the machine.

The probes never know whether the host is real. They ask a :class:`HostFacts`
object for ``/proc/cpuinfo`` and for the devices of each vendor, handing it
the run's importer, so every driver library they touch (``pynvml``,
``amdsmi``, ``libtpu``, ``torch``) is imported through the importer — where
faults are injected and where a simulated profile decides what exists.

:class:`RealHost` reads this machine; :class:`~orchestrator.engine.SimulatedHost`
answers from a profile. Both can be rebuilt in an isolated step's child
process from ``isolation_spec()``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import attrs

from .._importer import Importer

__all__ = [
    "GpuDevice",
    "HostFacts",
    "RealHost",
    "amd_devices_from_amdsmi",
    "is_amd_zen",
    "nvidia_devices_from_nvml",
    "tpu_present",
    "xpu_devices_from_torch",
]


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

    def nvidia_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
        """NVIDIA GPUs (NVML through ``pynvml`` when importable, else the
        driver's files)."""
        ...

    def amd_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
        """AMD GPUs (``amdsmi`` when importable, else the KFD topology)."""
        ...

    def tpu_present(self, importer: Importer) -> bool:
        """Whether ``libtpu`` is installed."""
        ...

    def xpu_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
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
    if not cpuinfo:
        return False
    vendor = False
    avx512 = False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id":
            vendor = vendor or value.strip() == "AuthenticAMD"
        elif key == "flags":
            avx512 = avx512 or any(flag.startswith("avx512") for flag in value.split())
    return vendor and avx512


def tpu_present(importer: Importer) -> bool:
    """Whether ``libtpu`` imports through ``importer`` (as vLLM's TPU plugin
    decides: installed means a TPU host). Not findable is ``False``; an
    import that raises propagates, so a broken or injected ``libtpu`` is a
    failed plugin, never a TPU."""
    if importer.find_spec("libtpu") is None:
        return False
    importer.import_module("libtpu")
    return True


def _library_reports_no_driver(exc: Exception, library: str) -> bool:
    # NVML and AMD SMI raise their own error classes when the kernel driver
    # is missing; that is "no devices here", not a broken plugin. Anything
    # else (an injected fault, a bug) is left to the caller's policy.
    module = type(exc).__module__ or ""
    return module == library or module.startswith(library + ".")


def nvidia_devices_from_nvml(importer: Importer) -> tuple[GpuDevice, ...] | None:
    """Ask NVML through ``pynvml``; ``None`` when pynvml is not installed."""
    if importer.find_spec("pynvml") is None:
        return None
    nvml = importer.import_module("pynvml")
    try:
        nvml.nvmlInit()
    except Exception as exc:
        if _library_reports_no_driver(exc, "pynvml"):
            return ()
        raise
    try:
        devices = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
            name = nvml.nvmlDeviceGetName(handle)
            if isinstance(name, bytes):  # older pynvml releases
                name = name.decode("utf-8", "replace")
            devices.append(
                GpuDevice(
                    vendor="nvidia",
                    name=str(name),
                    capability=(int(major), int(minor)),
                    index=index,
                )
            )
        return tuple(devices)
    finally:
        nvml.nvmlShutdown()


def gfx_capability(target: str | None) -> tuple[int, int] | None:
    """``gfx942`` -> ``(9, 4)``, ``gfx90a`` -> ``(9, 0)``, ``gfx1100`` ->
    ``(11, 0)``; ``None`` for anything else."""
    match = re.fullmatch(r"gfx(\d+)([0-9a-f])([0-9a-f])", (target or "").strip().lower())
    if match is None:
        return None
    return int(match[1]), int(match[2], 16)


def amd_devices_from_amdsmi(importer: Importer) -> tuple[GpuDevice, ...] | None:
    """Ask AMD SMI through ``amdsmi``; ``None`` when it is not installed."""
    if importer.find_spec("amdsmi") is None:
        return None
    smi = importer.import_module("amdsmi")
    try:
        smi.amdsmi_init()
    except Exception as exc:
        if _library_reports_no_driver(exc, "amdsmi"):
            return ()
        raise
    try:
        devices = []
        for index, handle in enumerate(smi.amdsmi_get_processor_handles()):
            info = smi.amdsmi_get_gpu_asic_info(handle)
            devices.append(
                GpuDevice(
                    vendor="amd",
                    name=str(info.get("market_name") or "AMD GPU"),
                    capability=gfx_capability(info.get("target_graphics_version")),
                    index=index,
                )
            )
        return tuple(devices)
    finally:
        smi.amdsmi_shut_down()


def xpu_devices_from_torch(importer: Importer) -> tuple[GpuDevice, ...]:
    """Ask ``torch.xpu``; importing torch takes seconds, so it happens only
    when torch is findable."""
    if importer.find_spec("torch") is None:
        return ()
    torch = importer.import_module("torch")
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return ()
    return tuple(
        GpuDevice(
            vendor="intel", name=str(xpu.get_device_name(index)), capability=None, index=index
        )
        for index in range(xpu.device_count())
    )


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


class RealHost:
    """This machine.

    Args:
        root: the file-system root the driver files are read under (tests
            point it at a fake tree; default ``/``).
    """

    name = "real"

    def __init__(self, root: str | Path = "/") -> None:
        self._root = Path(root)

    def __repr__(self) -> str:
        return f"RealHost(root={str(self._root)!r})"

    def _path(self, path: str) -> Path:
        return self._root / path.lstrip("/")

    def read_cpuinfo(self) -> str | None:
        """``/proc/cpuinfo``, or ``None`` when the file does not exist."""
        return _read_text(self._path("/proc/cpuinfo"))

    def nvidia_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
        """NVML when ``pynvml`` is importable, else one device per
        ``/proc/driver/nvidia/gpus/*`` entry (capability unknown)."""
        devices = nvidia_devices_from_nvml(importer)
        if devices is not None:
            return devices
        found = []
        for index, gpu in enumerate(_sorted_entries(self._path("/proc/driver/nvidia/gpus"))):
            information = _read_text(gpu / "information") or ""
            model = re.search(r"^Model:\s*(.+)$", information, re.MULTILINE)
            found.append(
                GpuDevice(
                    vendor="nvidia",
                    name=model[1].strip() if model else "NVIDIA GPU",
                    capability=None,
                    index=index,
                )
            )
        return tuple(found)

    def amd_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
        """AMD SMI when ``amdsmi`` is importable, else the KFD topology nodes
        with SIMD units (CPU nodes have none), else one device of unknown
        kind if ``/dev/kfd`` exists."""
        devices = amd_devices_from_amdsmi(importer)
        if devices is not None:
            return devices
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
        return tuple(found)

    def tpu_present(self, importer: Importer) -> bool:
        """Whether ``libtpu`` imports (see :func:`tpu_present`)."""
        return tpu_present(importer)

    def xpu_devices(self, importer: Importer) -> tuple[GpuDevice, ...]:
        """``torch.xpu`` devices (torch imported only when findable)."""
        return xpu_devices_from_torch(importer)

    def nvswitch_multicast(self) -> bool:
        """Whether the driver exposes the fabric (IMEX) capability that
        multi-node NVLink multicast needs. A heuristic: the authoritative
        answer is whether the mnnvl workspace can be created."""
        return self._path("/proc/driver/nvidia/capabilities/fabric-imex-mgmt").exists()

    def nodes(self) -> int | None:
        """Unknown: the launcher's rank identity says how many nodes there are."""
        return None

    def isolation_spec(self) -> dict[str, Any]:
        """Rebuilt in a child process by :func:`rebuild_real_host`."""
        return {"factory": f"{__name__}:rebuild_real_host", "args": {"root": str(self._root)}}


def rebuild_real_host(args: Any) -> RealHost:
    """The factory named by :meth:`RealHost.isolation_spec`."""
    root = args.get("root", "/") if isinstance(args, dict) else "/"
    return RealHost(root)


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
