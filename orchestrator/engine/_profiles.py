"""Simulated host profiles: device facts and module availability as data.

A profile says what a machine looks like to the probes: its CPU (what
``/proc/cpuinfo`` would say), its GPUs, TPU and XPUs, how many nodes the
launch spans, whether NVSwitch multicast works, and which Python modules
import, are absent, or raise what. :class:`SimulatedHost` answers the
platform probes' questions from it and :class:`SimulatedImporter` imports
from it, so the same probes run unchanged against a real or a simulated
machine. Faults (:class:`~orchestrator.FaultPlan`) are injected in front of
a simulated importer exactly as in front of the real one.

The JSON form (also what a profile file holds)::

    {
      "name": "my-box",
      "description": "one node, 8 x H200",
      "cpu": {"vendor_id": "AuthenticAMD", "model_name": "AMD EPYC 9654",
              "flags": ["avx2", "avx512f"]},            (null: no /proc/cpuinfo)
      "gpus": {"vendor": "nvidia", "count": 8, "name": "NVIDIA H200",
               "capability": [9, 0]},                   (vendor nvidia | amd | none)
      "nodes": 1,
      "build": "cuda",           (what the engine build targets: cuda | rocm | cpu | tpu | xpu;
                                  default from the devices: nvidia -> cuda, amd -> rocm,
                                  a TPU -> tpu, XPUs -> xpu, none -> cpu)
      "nvswitch_multicast": false,
      "tpu": false,
      "xpu": 0,                                          (number of Intel XPUs)
      "modules": {
        "torch": "import",
        "zentorch": "absent",
        "flashinfer.comm": {"raise": "TypeError",
                            "args": ["type 'array.array' is not subscriptable"]}
      }
    }

Modules not listed are absent: a simulated host is hermetic. The driver
libraries the device facts imply are importable unless listed otherwise:
``pynvml`` with NVIDIA GPUs, ``amdsmi`` with AMD GPUs, ``libtpu`` with a TPU,
``torch`` with XPUs.
"""

from __future__ import annotations

import enum
import importlib.machinery
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from events import MAX_WORLD_SIZE, DecodeError
from events._codec import _json_type, structure, unstructure

from .._errors import FaultSpecError
from .._faults import BUILTIN_EXCEPTIONS, Fault, FaultPlan, not_an_exception
from .._importer import TableImporter, dotted_prefixes
from .._json_text import load_json, read_input
from ._config import BUILD_TARGETS, ProfileError
from ._host import DRIVER_MODULES, BuildTarget, Devices, GpuDevice, HostBase

__all__ = [
    "BUILTIN_PROFILES",
    "CpuFacts",
    "GpuFacts",
    "ModuleAction",
    "ModuleRule",
    "Profile",
    "SimulatedHost",
    "SimulatedImporter",
    "load_profile",
]

_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_GPU_VENDORS = ("nvidia", "amd", "none")


class ModuleAction(enum.StrEnum):
    """What importing a simulated module does."""

    IMPORT = "import"
    ABSENT = "absent"
    RAISE = "raise"


@attrs.frozen(kw_only=True)
class ModuleRule:
    """How one module behaves on a simulated host.

    Attributes:
        action: import, absent, or raise.
        exception: builtin exception class name, for :attr:`ModuleAction.RAISE`.
        args: its constructor arguments.
        kwargs: ``name``/``path`` for ImportError types (``name`` defaults to
            the module, as a real failed import of it would set).
    """

    action: ModuleAction = ModuleAction.IMPORT
    exception: str | None = None
    args: tuple[str | int | float | bool | None, ...] = ()
    kwargs: Mapping[str, str] = attrs.field(factory=dict)

    def make_exception(self, module: str) -> BaseException:
        """A fresh instance of the configured exception for ``module``."""
        fault = Fault(target=module, exception=self.exception, args=self.args, kwargs=self.kwargs)
        return fault.make_exception()

    def to_json(self) -> str | dict[str, Any]:
        """``"import"``, ``"absent"`` or ``{"raise": ..., "args": ..., "kwargs": ...}``."""
        if self.action is not ModuleAction.RAISE:
            return str(self.action)
        # A fault's JSON form, as the reader translates it back (_module_rule).
        fault = Fault(target="", exception=self.exception, args=self.args, kwargs=self.kwargs)
        data = fault.to_json()
        del data["target"]
        return {"raise": data.pop("exception"), **data}


@attrs.frozen(kw_only=True)
class CpuFacts:
    """What ``/proc/cpuinfo`` says."""

    vendor_id: str = ""
    model_name: str = ""
    flags: tuple[str, ...] = ()

    def cpuinfo(self) -> str:
        """The text of ``/proc/cpuinfo`` for one logical CPU."""
        return (
            "processor\t: 0\n"
            f"vendor_id\t: {self.vendor_id}\n"
            f"model name\t: {self.model_name}\n"
            f"flags\t\t: {' '.join(self.flags)}\n"
        )


def _between(low: int, high: int) -> Callable[[object, object, int], None]:
    def check(_instance: object, _attribute: object, value: int) -> None:
        if not low <= value <= high:
            raise ValueError(f"expected an integer from {low} to {high:,}, not {value!r}")

    return check


def _one_of(choices: tuple[str, ...]) -> Callable[[object, object, str], None]:
    def check(_instance: object, _attribute: object, value: str) -> None:
        if value not in choices:
            raise ValueError(f"{value!r} is not valid; valid: {', '.join(choices)}")

    return check


def _gpu_count(instance: GpuFacts, attribute: object, value: int) -> None:
    _between(0, _MAX_DEVICES)(instance, attribute, value)
    if instance.vendor == "none" and value:
        raise ValueError("must be 0 when gpus.vendor is none")


def _capability(_instance: object, _attribute: object, value: tuple[int, int] | None) -> None:
    if value is not None and min(value) < 0:
        raise ValueError("expected [major, minor] (e.g. [9, 0]) or null")


def _named(_instance: object, _attribute: object, value: str) -> None:
    if not value:
        raise ValueError("must not be empty")


#: The most devices of a kind one simulated host may have (a machine has
#: 8 or 16; a count of 10**9 made every probe enumerate without end).
_MAX_DEVICES = 1024


@attrs.frozen(kw_only=True)
class GpuFacts:
    """The node's GPUs: ``count`` identical devices of ``vendor``."""

    vendor: str = attrs.field(default="none", validator=_one_of(_GPU_VENDORS))
    count: int = attrs.field(default=0, validator=_gpu_count)
    name: str = ""
    capability: tuple[int, int] | None = attrs.field(default=None, validator=_capability)


@attrs.frozen(kw_only=True)
class Profile:
    """A simulated machine (see the module docstring for the JSON form).

    Attributes:
        name: the profile's name (``h200x8``).
        description: one line for humans.
        cpu: the CPU, or ``None`` for a host without ``/proc/cpuinfo``.
        gpus: the GPUs of each node.
        nodes: how many nodes the launch spans.
        build: what the engine build targets (``cuda``, ``rocm``, ``cpu``,
            ``tpu``, ``xpu``): the cpu plugin activates only for a CPU
            build, as vLLM's does. ``None`` derives it from the devices
            (:attr:`build_target`).
        nvswitch_multicast: whether multi-node NVLink multicast works.
        tpu: whether a TPU (``libtpu``) is present.
        xpu: how many Intel XPUs there are.
        modules: module name -> how it imports.
    """

    name: str = attrs.field(validator=_named)
    description: str = ""
    cpu: CpuFacts | None = None
    gpus: GpuFacts = GpuFacts()
    nodes: int = attrs.field(default=1, validator=_between(1, MAX_WORLD_SIZE))
    build: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_one_of(BUILD_TARGETS))
    )
    nvswitch_multicast: bool = False
    tpu: bool = False
    xpu: int = attrs.field(default=0, validator=_between(0, _MAX_DEVICES))
    modules: Mapping[str, ModuleRule] = attrs.field(factory=dict)

    @property
    def build_target(self) -> str:
        """:attr:`build`, or what the devices imply: NVIDIA GPUs -> cuda,
        AMD GPUs -> rocm, a TPU -> tpu, XPUs -> xpu, none -> cpu."""
        if self.build is not None:
            return self.build
        return next(iter(self._present()), "cpu")

    def _present(self) -> list[str]:
        # The build target of each kind of device present, in DRIVER_MODULES' order.
        gpus = self.gpus.vendor if self.gpus.count else "none"
        present = (gpus == "nvidia", gpus == "amd", self.tpu, self.xpu > 0)
        return [build for build, here in zip(DRIVER_MODULES, present, strict=True) if here]

    def devices(self, vendor: str) -> tuple[GpuDevice, ...]:
        """The GPUs of ``vendor`` (``nvidia`` or ``amd``) on one node."""
        if self.gpus.vendor != vendor:
            return ()
        return tuple(
            GpuDevice(
                vendor=vendor, name=self.gpus.name, capability=self.gpus.capability, index=index
            )
            for index in range(self.gpus.count)
        )

    def effective_modules(self) -> dict[str, ModuleRule]:
        """:attr:`modules` plus the driver libraries the device facts imply
        (an explicit entry wins)."""
        drivers = {DRIVER_MODULES[build]: ModuleRule() for build in self._present()}
        return {**drivers, **self.modules}

    def to_json(self) -> dict[str, Any]:
        """The JSON form :meth:`from_json` reads (fields at their default
        left out)."""
        modules = {name: rule.to_json() for name, rule in self.modules.items()}
        return {**unstructure(self), **({"modules": modules} if modules else {})}

    @classmethod
    def from_json(cls, data: object, *, source: str, default_name: str | None = None) -> Profile:
        """Build a profile from its JSON form.

        Raises:
            ProfileError: naming the bad field and what would be valid.
        """
        # The modules' entries have a form of their own ("import", or
        # {"raise": ...}); the rest is read as the classes' fields are.
        # A "modules" that is no object is left for the reader to name.
        modules: dict[str, object] = {}
        if isinstance(data, dict):
            data = dict(data)
            if isinstance(data.get("modules"), dict):
                modules = data.pop("modules")
            if default_name is not None:
                data.setdefault("name", default_name)
        try:
            profile = structure(cls, data)
        except DecodeError as exc:
            raise ProfileError(source, str(exc)) from None
        rules = {name: _module_rule(name, entry, source) for name, entry in modules.items()}
        return attrs.evolve(profile, modules=rules)


def _module_rule(module: str, entry: object, source: str) -> ModuleRule:
    field = f"modules[{module!r}]"

    def fail(where: str, reason: str) -> ProfileError:
        return ProfileError(source, f"field {where!r}: {reason}")

    if not _MODULE_NAME.match(module):
        raise fail(field, "not a module name (like torch or flashinfer.comm)")
    choices = 'valid: "import", "absent" or {"raise": EXCEPTION, "args": [...]}'
    if isinstance(entry, str):
        if entry in (ModuleAction.IMPORT, ModuleAction.ABSENT):
            return ModuleRule(action=ModuleAction(entry))
        raise fail(field, f"{entry!r} is not valid; {choices}")
    if not isinstance(entry, dict) or "raise" not in entry:
        raise fail(field, f"{_json_type(entry)} is not valid; {choices}")
    unknown = sorted(set(entry) - {"raise", "args", "kwargs"})
    if unknown:
        raise fail(f"{field}.{unknown[0]}", "unknown field; valid fields: raise, args, kwargs")
    exception = entry["raise"]
    # hang and crash are faults, not facts of a host: never offered here.
    if isinstance(exception, str) and exception not in BUILTIN_EXCEPTIONS:
        raise fail(f"{field}.raise", f"expected {not_an_exception(exception)}")
    fault_json = {"target": module, **entry, "exception": exception}
    del fault_json["raise"]
    try:
        fault = FaultPlan.from_json([fault_json], source=source).faults[0]
    except FaultSpecError as exc:
        # The fault reader names its own fields ("entry 0: args"); name
        # this profile's instead.
        part = exc.part.partition(": ")[2] or "raise"
        raise fail(f"{field}.{'raise' if part == 'exception' else part}", exc.reason) from None
    return ModuleRule(
        action=ModuleAction.RAISE,
        exception=fault.exception,
        args=fault.args,
        kwargs=dict(fault.kwargs),
    )


# --- built-in profiles ---------------------------------------------------------------


def _flags(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_X86_BASE = _flags(
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx "
    "fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc "
    "cpuid pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave "
    "avx f16c rdrand lahf_lm abm fsgsbase bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap "
    "clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 xsaves umip pku ospke vaes vpclmulqdq "
    "gfni rdpid"
)
_AVX512 = _flags(
    "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512vbmi avx512_vbmi2 "
    "avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16"
)
_AMD_EXTRA = _flags("mmxext fxsr_opt svm extapic cr8_legacy sse4a misalignsse topoext clzero")
_INTEL_EXTRA = _flags("ds_cpl vmx est tm2 xtpr pdcm dca tsc_deadline_timer arat pln pts")

_INTEL_CPU = CpuFacts(
    vendor_id="GenuineIntel",
    model_name="Intel(R) Xeon(R) Platinum 8480+",
    flags=(*_X86_BASE, *_INTEL_EXTRA, *_AVX512, "amx_bf16", "amx_tile", "amx_int8"),
)
_CUDA_MODULES = {
    name: ModuleRule()
    for name in ("torch", "triton", "flash_attn", "flashinfer", "flashinfer.comm", "pynvml")
}

#: The profiles ``--simulate`` knows by name.
BUILTIN_PROFILES: Mapping[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="a100x4",
            description="one node, 4 x A100 80GB (SM80), AMD EPYC 7763 host (Zen 3, no AVX-512)",
            cpu=CpuFacts(
                vendor_id="AuthenticAMD",
                model_name="AMD EPYC 7763 64-Core Processor",
                flags=(*_X86_BASE, *_AMD_EXTRA),
            ),
            gpus=GpuFacts(
                vendor="nvidia", count=4, name="NVIDIA A100-SXM4-80GB", capability=(8, 0)
            ),
            modules=_CUDA_MODULES,
        ),
        Profile(
            name="b200x8",
            description="one node, 8 x B200 (SM100) with NVSwitch multicast",
            cpu=attrs.evolve(_INTEL_CPU, model_name="Intel(R) Xeon(R) Platinum 8570"),
            gpus=GpuFacts(vendor="nvidia", count=8, name="NVIDIA B200", capability=(10, 0)),
            nvswitch_multicast=True,
            modules=_CUDA_MODULES,
        ),
        Profile(
            name="h200x8",
            description="one node, 8 x H200 (SM90), CUDA modules installed, no NVSwitch multicast",
            cpu=_INTEL_CPU,
            gpus=GpuFacts(vendor="nvidia", count=8, name="NVIDIA H200", capability=(9, 0)),
            modules=_CUDA_MODULES,
        ),
        Profile(
            name="xeon",
            description="Intel Xeon CPU host without GPUs; zentorch not installed",
            cpu=attrs.evolve(_INTEL_CPU, model_name="Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz"),
            modules={"torch": ModuleRule(), "zentorch": ModuleRule(action=ModuleAction.ABSENT)},
        ),
        Profile(
            name="zen4",
            description="AMD EPYC 9654 (Zen 4, AVX-512) CPU host with a working zentorch",
            cpu=CpuFacts(
                vendor_id="AuthenticAMD",
                model_name="AMD EPYC 9654 96-Core Processor",
                flags=(*_X86_BASE, *_AMD_EXTRA, *_AVX512),
            ),
            modules={"torch": ModuleRule(), "zentorch": ModuleRule()},
        ),
    )
}


def load_profile(name_or_path: str | os.PathLike[str], *, content: bytes | None = None) -> Profile:
    """A built-in profile by name, or a JSON profile file: ``content`` when
    the caller has read the file already (a pipe can be read only once).

    Raises:
        ProfileError: the name is neither a built-in profile nor a file (the
            message lists the built-ins), or the file is unreadable, not
            JSON, or malformed (the message names the field).
    """
    text = os.fspath(name_or_path)
    if text in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[text]
    path = Path(text)
    if not (path.suffix == ".json" or os.sep in text or path.exists()):
        raise ProfileError(
            text,
            f"unknown profile; built-in profiles: {', '.join(sorted(BUILTIN_PROFILES))}, "
            "or the path of a JSON profile file",
        )
    try:
        data = load_json(read_input(path) if content is None else content)
    except OSError as exc:
        raise ProfileError(text, f"cannot read the file: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise ProfileError(text, str(exc)) from exc
    return Profile.from_json(data, source=text, default_name=path.stem)


# --- the simulated host and importer ------------------------------------------------


class SimulatedHost(HostBase):
    """Host facts answered from a :class:`Profile`.

    Driver libraries are still imported through the importer (so a fault on
    ``pynvml`` breaks the cuda plugin here as on a real host); where a real
    host would fall back to the driver's files, this one answers from the
    profile: its NVIDIA GPUs are ``present`` but unusable when NVML finds
    nothing, its AMD GPUs are found without AMD SMI.
    """

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.name = profile.name

    def __repr__(self) -> str:
        return f"SimulatedHost({self.name!r})"

    def read_cpuinfo(self) -> str | None:
        """The profile's CPU as ``/proc/cpuinfo`` text (``None`` without one)."""
        return None if self.profile.cpu is None else self.profile.cpu.cpuinfo()

    def build_target(self, importer: Any) -> BuildTarget:
        """The profile's build target (:attr:`Profile.build_target`): a
        simulated host is hermetic, so ``VLLM_TARGET_DEVICE`` does not
        reach it (``--target-device`` does)."""
        return BuildTarget(device=self.profile.build_target, source=f"profile {self.profile.name}")

    def _nvidia_evidence(self) -> str:
        gpus = self.profile.devices("nvidia")
        return f"profile {self.profile.name}: {len(gpus)} x {gpus[0].name}" if gpus else ""

    def _amd_devices_without_smi(self) -> Devices:
        found = self.profile.devices("amd")
        return Devices(found=found, reason="" if found else "amdsmi is not installed")

    def nvswitch_multicast(self) -> bool:
        """The profile's ``nvswitch_multicast``."""
        return self.profile.nvswitch_multicast

    def nodes(self) -> int | None:
        """The profile's ``nodes``."""
        return self.profile.nodes

    def isolation_spec(self) -> dict[str, Any]:
        """Rebuilt in a child process by :func:`rebuild_simulated_host`."""
        return {"factory": f"{__name__}:rebuild_simulated_host", "args": self.profile.to_json()}


def rebuild_simulated_host(args: Any) -> SimulatedHost:
    """The factory named by :meth:`SimulatedHost.isolation_spec`."""
    return SimulatedHost(Profile.from_json(args, source="parent process"))


class SimulatedImporter(TableImporter):
    """Imports from a :class:`Profile`: synthetic modules for ``import``
    entries (with the attributes the probes use) and for the parent
    packages of listed modules, ModuleNotFoundError for absent and unlisted
    modules, a fresh instance of the configured exception for ``raise``
    entries: the profile's table for :class:`~orchestrator._importer.TableImporter`."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        origin = f"simulated:{profile.name}"
        rules = profile.effective_modules()
        # Listed modules and their parent packages, built parents first.
        names = {prefix for listed in rules for prefix in dotted_prefixes(listed)}
        modules: dict[str, ModuleType | BaseException | None] = {}
        for name in sorted(names, key=lambda n: n.count(".")):
            rule = rules.get(name, ModuleRule())
            if rule.action is ModuleAction.RAISE:
                modules[name] = rule.make_exception(name)
            elif rule.action is ModuleAction.IMPORT:
                modules[name] = module = ModuleType(name, f"Simulated {name} ({origin}).")
                module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, origin=origin)
                module.__version__ = _VERSIONS.get(name, "0.0.0+simulated")  # type: ignore[attr-defined]
                if name in _POPULATE:
                    _POPULATE[name](module, profile)
                parent, _, child = name.rpartition(".")
                if isinstance(modules.get(parent), ModuleType):
                    setattr(modules[parent], child, module)
            else:
                modules[name] = None
        super().__init__(modules, None, origin)

    def __repr__(self) -> str:
        return f"SimulatedImporter({self.profile.name!r})"

    def isolation_spec(self) -> dict[str, Any]:
        """Rebuilt in a child process by :func:`rebuild_simulated_importer`."""
        return {"factory": f"{__name__}:rebuild_simulated_importer", "args": self.profile.to_json()}


def rebuild_simulated_importer(args: Any) -> SimulatedImporter:
    """The factory named by :meth:`SimulatedImporter.isolation_spec`."""
    return SimulatedImporter(Profile.from_json(args, source="parent process"))


_VERSIONS = {
    "torch": "2.13.0",
    "triton": "3.6.0",
    "flash_attn": "2.8.3",
    "flashinfer": "0.5.3",
    "zentorch": "2.13.0",
    "pynvml": "13.580.82",
}


def _populate_pynvml(module: ModuleType, profile: Profile) -> None:
    devices = profile.devices("nvidia")

    class NVMLError(Exception):
        """Raised by the simulated NVML for a bad device index."""

    NVMLError.__module__ = "pynvml"

    def handle(index: int) -> GpuDevice:
        if not 0 <= index < len(devices):
            raise NVMLError(f"Invalid Argument: no GPU with index {index}")
        return devices[index]

    vars(module).update(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetCudaComputeCapability=lambda device: device.capability or (0, 0),
        nvmlDeviceGetName=lambda device: device.name,
    )


def _populate_amdsmi(module: ModuleType, profile: Profile) -> None:
    devices = profile.devices("amd")

    def asic_info(device: GpuDevice) -> dict[str, str]:
        info = {"market_name": device.name}
        if device.capability is not None:
            major, minor = device.capability
            info["target_graphics_version"] = f"gfx{major}{minor:x}0"
        return info

    vars(module).update(
        amdsmi_init=lambda: None,
        amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: list(devices),
        amdsmi_get_gpu_asic_info=asic_info,
    )


def _populate_torch(module: ModuleType, profile: Profile) -> None:
    xpu = ModuleType("torch.xpu", "Simulated torch.xpu.")
    vars(xpu).update(
        is_available=lambda: profile.xpu > 0,
        device_count=lambda: profile.xpu,
        get_device_name=lambda index=0: "Intel(R) Data Center GPU Max 1550",
    )
    module.xpu = xpu  # type: ignore[attr-defined]


def _populate_flashinfer_comm(module: ModuleType, profile: Profile) -> None:
    def create_allreduce_fusion_workspace(**options: Any) -> dict[str, Any]:
        """Simulated: returns a description of the workspace it would create."""
        return {"simulated": True, "profile": profile.name, **options}

    def allreduce_fusion(*args: Any, **kwargs: Any) -> None:
        """Simulated: there are no kernels to run."""
        raise NotImplementedError("the simulated flashinfer.comm runs no kernels")

    vars(module).update(
        create_allreduce_fusion_workspace=create_allreduce_fusion_workspace,
        allreduce_fusion=allreduce_fusion,
    )


_POPULATE: Mapping[str, Callable[[ModuleType, Profile], None]] = {
    "pynvml": _populate_pynvml,
    "amdsmi": _populate_amdsmi,
    "torch": _populate_torch,
    "flashinfer.comm": _populate_flashinfer_comm,
}
