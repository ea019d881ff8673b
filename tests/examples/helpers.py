"""What the examples' tests share: where the examples are, and the
environment a user's shell would give them."""

from __future__ import annotations

import os
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: Launcher and tracing variables a developer's shell may hold; the examples
#: must not pick them up from the test run.
_LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "STARTUP_ORCHESTRATOR_RUN_ID",
    "TRACEPARENT",
)


def clean_environment(**extra: str) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in _LAUNCH_VARIABLES
        and not name.startswith(("OTEL_", "SLURM_", "OMPI_", "PMIX_", "TORCHELASTIC_"))
    }
    env.update(extra)
    return env


def only_run_dir(cwd: Path) -> Path:
    (run_dir,) = (cwd / "startup-runs").iterdir()
    return run_dir
