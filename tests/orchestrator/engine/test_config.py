"""SPEC §7: an engine configuration that cannot be started is refused with
one message naming the setting, its value and what would be valid."""

from __future__ import annotations

import re
from typing import Any

import pytest

from orchestrator.engine import EngineConfig, EngineConfigError


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("tp", 0, "tp=0: must be a positive integer"),
        ("tp", 2.0, "tp=2.0: must be a positive integer"),
        ("head_size", -8, "head_size=-8: must be a positive integer"),
        ("block_size", True, "block_size=True: must be a positive integer"),
        ("dtype", "fp16", "unknown dtype 'fp16'; valid: auto, float16, bfloat16, float32"),
        (
            "kv_cache_dtype",
            "int8",
            "unknown kv_cache_dtype 'int8'; valid: auto, float16, bfloat16, fp8, fp8_e4m3, "
            "fp8_e5m2",
        ),
        ("target_device", "gpu", "unknown target_device 'gpu'; valid: cuda, rocm, cpu, tpu, xpu"),
        (
            "allreduce_backend",
            "nccl",
            "unknown allreduce_backend 'nccl'; valid: auto, mnnvl, trtllm",
        ),
    ],
)
def test_a_bad_setting_is_refused_naming_it_and_what_is_valid(
    setting: str, value: Any, message: str
) -> None:
    with pytest.raises(EngineConfigError, match=f"^{re.escape(message)}$") as refused:
        EngineConfig(**{setting: value})

    assert refused.value.field == setting
    assert refused.value.value == value


@pytest.mark.parametrize("setting", ["tp", "head_size", "block_size"])
def test_one_is_the_smallest_size_accepted(setting: str) -> None:
    assert getattr(EngineConfig(**{setting: 1}), setting) == 1
