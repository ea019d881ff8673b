"""``run`` on the machine the tests run on, with real probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import run_cli

# A GPU (or an accelerator driver) makes the host's platform something else.
_ACCELERATOR_NODES = ("/dev/nvidiactl", "/dev/kfd", "/dev/accel", "/dev/dri/renderD128")


@pytest.mark.slow
@pytest.mark.slow
def test_run_on_this_host(tmp_path: Path) -> None:
    # On an AMD Zen host a zentorch that fails to import is a WARNING that
    # carries its traceback by design (SPEC §3.2).
    ran = run_cli("run", "--json", "--run-dir", "run", cwd=tmp_path, traceback_expected=_amd_zen())

    assert ran.returncode == 0, ran.describe()
    document = ran.json()
    assert document["outcome"] == "ready"
    assert document["world_size"] == 1
    [rank] = document["ranks"]
    replayed = run_cli("replay", "--json", "run", cwd=tmp_path)
    assert replayed.json() == document
    if any(Path(node).exists() for node in _ACCELERATOR_NODES):
        pytest.skip(f"this host has an accelerator; it started on {rank['platform_class']}")
    # No GPU: the cpu plugin wins, with ZenCpuPlatform only on an AMD Zen
    # host (AuthenticAMD with avx512) where zentorch imports.
    assert rank["platform"] == "cpu"
    if _amd_zen():
        assert rank["platform_class"] in ("CpuPlatform", "ZenCpuPlatform")
    else:
        assert rank["platform_class"] == "CpuPlatform"
    assert rank["attention_backend"] == "CPU_ATTN"


def _amd_zen() -> bool:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "AuthenticAMD" in cpuinfo and "avx512" in cpuinfo
