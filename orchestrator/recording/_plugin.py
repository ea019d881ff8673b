"""The ``vllm.general_plugins`` entry point: as cheap as a dictionary lookup
when recording is off, since vLLM loads it in every one of its processes."""

from __future__ import annotations

import os

__all__ = ["RUNS_VARIABLE", "vllm_plugin"]

#: Where recorded runs go: a directory, one run directory per launch in it.
RUNS_VARIABLE = "STARTUP_ORCHESTRATOR_RUNS"


def vllm_plugin() -> None:
    """Record this vLLM process's start in ``$STARTUP_ORCHESTRATOR_RUNS``
    when that is set (:mod:`orchestrator.recording`); otherwise return at
    once, having imported nothing."""
    directory = os.environ.get(RUNS_VARIABLE, "").strip()
    if directory:
        from ._vllm import record_this_process

        record_this_process(directory)
