"""The baseline of ``bench_startup.py``: the reference engine's probes done the
way an inference engine does them today, one after another, with try/except
imports and log lines, and nothing of this project imported.

Run alone (``python benchmarks/_plain_startup.py``) it probes this host as
``python -m orchestrator run`` does, in the same order and with the same
imports, and prints what it decided:

1. platform plugins, in vLLM's order (tpu, cuda, rocm, xpu, cpu), then the
   third-party plugins registered under the entry-point group: ``libtpu``
   when findable; ``pynvml`` when findable, else the NVIDIA driver's files;
   ``amdsmi`` when findable, else the KFD topology; ``torch`` (its ``xpu``
   devices) when findable; the CPU when nothing else is usable, and on an AMD
   Zen host with AVX-512 ``import zentorch`` in try/except;
2. the attention backends of the selected device, each imported in
   try/except and validated against the configuration (a single rank: dtype
   bfloat16, head size 128, KV cache ``auto``, block size 16, no MLA);
3. ``import flashinfer.comm`` in try/except, as vLLM's fusion pass does at
   import (the engine skips it on a device flashinfer does not run on; this
   loop tries it anyway, as vLLM does);
4. the all-reduce fusion workspace decision (off: tensor parallel size 1).

It writes no event log and records nothing: this is what the orchestrated
run is compared with. With ``--exit-now`` it ends as the command line does
(``atexit`` hooks, flushed output, then ``os._exit``) instead of with the
interpreter's teardown.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import sys
from pathlib import Path
from types import ModuleType

logger = logging.getLogger("plain_startup")

#: The entry-point group the engine discovers platform plugins in.
PLATFORM_PLUGIN_GROUP = "startup_orchestrator.platform_plugins"

#: (backend, module it imports, devices it runs on, head sizes or None)
ATTENTION: dict[str, tuple[tuple[str, str, frozenset[str], tuple[int, ...] | None], ...]] = {
    "cuda": (
        ("FLASH_ATTN", "flash_attn", frozenset({"cuda"}), None),
        ("FLASHINFER", "flashinfer", frozenset({"cuda"}), (64, 128, 256)),
        ("TRITON_ATTN", "triton", frozenset({"cuda", "rocm", "xpu"}), None),
        ("FLEX_ATTENTION", "torch", frozenset({"cuda"}), None),
    ),
    "rocm": (
        ("ROCM_AITER_FA", "aiter", frozenset({"rocm"}), (64, 128, 256)),
        ("ROCM_ATTN", "torch", frozenset({"rocm"}), (64, 128)),
        ("TRITON_ATTN", "triton", frozenset({"cuda", "rocm", "xpu"}), None),
    ),
    "cpu": (
        (
            "CPU_ATTN",
            "torch",
            frozenset({"cpu"}),
            (32, 64, 80, 96, 112, 128, 160, 192, 224, 256),
        ),
    ),
    "tpu": (("PALLAS", "torch_xla", frozenset({"tpu"}), (64, 128, 256)),),
    "xpu": (
        ("XPU_ATTN", "torch", frozenset({"xpu"}), (64, 80, 96, 128, 256)),
        ("TRITON_ATTN", "triton", frozenset({"cuda", "rocm", "xpu"}), None),
    ),
}
HEAD_SIZE = 128
TP = 1


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


def _entries(path: str) -> list[Path]:
    try:
        return sorted(p for p in Path(path).iterdir() if p.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def tpu_plugin() -> str | None:
    try:
        if importlib.util.find_spec("libtpu") is None:
            return None
        importlib.import_module("libtpu")
        return "TpuPlatform"
    except Exception as exc:
        logger.debug("TPU platform is not available: %s", exc)
        return None


def cuda_plugin() -> str | None:
    try:
        if importlib.util.find_spec("pynvml") is not None:
            nvml = importlib.import_module("pynvml")
            nvml.nvmlInit()
            try:
                return "CudaPlatform" if nvml.nvmlDeviceGetCount() > 0 else None
            finally:
                nvml.nvmlShutdown()
        return "CudaPlatform" if _entries("/proc/driver/nvidia/gpus") else None
    except Exception as exc:
        logger.debug("CUDA platform is not available: %s", exc)
        return None


def rocm_plugin() -> str | None:
    try:
        if importlib.util.find_spec("amdsmi") is not None:
            smi = importlib.import_module("amdsmi")
            smi.amdsmi_init()
            try:
                return "RocmPlatform" if smi.amdsmi_get_processor_handles() else None
            finally:
                smi.amdsmi_shut_down()
        for node in _entries("/sys/class/kfd/kfd/topology/nodes"):
            properties = _read(str(node / "properties")) or ""
            if re.search(r"^simd_count\s+[1-9]", properties, re.MULTILINE):
                return "RocmPlatform"
        return "RocmPlatform" if Path("/dev/kfd").exists() else None
    except Exception as exc:
        logger.debug("ROCm platform is not available: %s", exc)
        return None


def xpu_plugin() -> str | None:
    try:
        if importlib.util.find_spec("torch") is None:
            return None
        torch = importlib.import_module("torch")
        xpu = getattr(torch, "xpu", None)
        return "XpuPlatform" if xpu is not None and xpu.is_available() else None
    except Exception as exc:
        logger.debug("XPU platform is not available: %s", exc)
        return None


def is_amd_zen(cpuinfo: str | None) -> bool:
    text = cpuinfo or ""
    vendor = re.search(r"^vendor_id\s*:\s*AuthenticAMD\s*$", text, re.MULTILINE) is not None
    avx512 = re.search(r"^flags\s*:.*\bavx512", text, re.MULTILINE) is not None
    return vendor and avx512


def cpu_plugin(accelerators: bool) -> str | None:
    if accelerators:
        return None
    if is_amd_zen(_read("/proc/cpuinfo")):
        try:
            importlib.import_module("zentorch")
            return "ZenCpuPlatform"
        except (ImportError, OSError) as exc:
            logger.warning(
                "zentorch failed to import (%s: %s); falling back to CpuPlatform.",
                type(exc).__name__,
                exc,
            )
    return "CpuPlatform"


def detect_platform() -> tuple[str, str]:
    """The platform class and its device, or exit 1 when none activates."""
    activated: list[tuple[str, str]] = []
    for device, plugin in (
        ("tpu", tpu_plugin),
        ("cuda", cuda_plugin),
        ("rocm", rocm_plugin),
        ("xpu", xpu_plugin),
    ):
        found = plugin()
        if found is not None:
            activated.append((found, device))
    cpu = cpu_plugin(bool(activated))
    if cpu is not None:
        activated.append((cpu, "cpu"))
    for entry_point in importlib.metadata.entry_points(group=PLATFORM_PLUGIN_GROUP):
        try:
            found = entry_point.load()(None)
        except Exception as exc:
            logger.warning("platform plugin %s failed: %s", entry_point.name, exc)
            continue
        if found is not None:
            return str(found), ""
    if len(activated) != 1:
        logger.error("no single platform: %s", activated or "none activated")
        raise SystemExit(1)
    return activated[0]


def select_attention(device: str) -> str:
    considered = []
    for name, module, devices, head_sizes in ATTENTION.get(device, ()):
        considered.append(name)
        try:
            importlib.import_module(module)
        except (ImportError, OSError) as exc:
            logger.debug("%s is not available: %s", name, exc)
            continue
        fits = device in devices and (
            HEAD_SIZE in head_sizes if head_sizes is not None else HEAD_SIZE % 8 == 0
        )
        if fits:
            logger.info(
                "Using %s attention backend out of potential backends: %s", name, considered
            )
            return name
    logger.error("no valid attention backend among %s", considered)
    raise SystemExit(1)


def import_flashinfer_comm() -> ModuleType | None:
    try:
        import flashinfer.comm as flashinfer_comm  # type: ignore[import-not-found]
    except ImportError:
        return None
    if not hasattr(flashinfer_comm, "allreduce_fusion"):
        return None
    return flashinfer_comm  # type: ignore[no-any-return]


def main() -> int:
    logging.basicConfig(format="%(levelname)-7s %(message)s", level=logging.INFO)
    platform_class, device = detect_platform()
    logger.info("Automatically detected platform %s.", platform_class)
    select_attention(device)
    comm = import_flashinfer_comm()
    if TP == 1 or comm is None:
        reason = "tensor parallel size is 1" if TP == 1 else "flashinfer.comm unavailable"
        logger.info("All-reduce fusion is off: %s.", reason)
    logger.info("Startup ready.")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    if "--exit-now" in sys.argv[1:]:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)
