"""The reference engine's configuration and its errors."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from events import InvalidValueError

from .._errors import OrchestratorError

__all__ = [
    "BUILD_TARGETS",
    "CPU_TARGET_HINT",
    "AllreduceBackend",
    "EngineConfig",
    "EngineConfigError",
    "PlatformConflictError",
    "ProfileError",
    "UnspecifiedPlatformError",
]


#: What a declined cpu plugin, or a conflict with it, says would start on the CPU.
CPU_TARGET_HINT = "set VLLM_TARGET_DEVICE=cpu to start on the CPU"


class EngineConfigError(OrchestratorError, InvalidValueError):
    """The engine configuration is invalid (also an
    :class:`events.InvalidValueError`, so a ``ValueError``).

    Attributes:
        field: the offending setting (also ``what``).
        value: its value.
        reason: what would be valid.
        valid: the values accepted, where the setting takes one of a list
            (the message is then ``unknown FIELD 'VALUE'; valid: A, B``);
            else empty.
    """

    def __init__(
        self, field: str, value: object, reason: str | None = None, valid: Iterable[str] = ()
    ) -> None:
        super().__init__(field, value, valid)
        self.field = field
        self._reason = reason
        self.reason = f"valid: {', '.join(self.valid)}" if reason is None else reason
        if reason is not None:
            self.args = (f"{field}={value!r}: {reason}",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self._reason, self.valid))


class ProfileError(OrchestratorError, ValueError):
    """A simulated host profile is unknown or malformed.

    Attributes:
        source: the profile name or file.
        reason: what is wrong and what would be valid.
    """

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"profile {source!r}: {reason}")


class PlatformConflictError(OrchestratorError, RuntimeError):
    """More than one platform plugin activated (SPEC §3.2).

    Attributes:
        plugins: the activated plugins.
    """

    def __init__(self, plugins: list[str]) -> None:
        self.plugins = list(plugins)
        advice = "uninstall or disable all but one"
        if "cpu" in self.plugins:
            # vLLM's cpu plugin activates for a CPU build whatever GPUs the
            # host has (vLLM #11739).
            advice += (
                "; a CPU build runs on a host whose accelerator also activated: "
                f"{CPU_TARGET_HINT}, or install the accelerator's build"
            )
        super().__init__(
            f"Only one platform plugin can be activated, but got: {self.plugins}; {advice}"
        )


class UnspecifiedPlatformError(OrchestratorError, RuntimeError):
    """No platform plugin activated (SPEC §3.2). The message names every
    plugin's reason, in priority order: what it looked for and did not find
    when it declined, its exception chain when it failed, and what would
    change the answer where that is known; the first failure is the
    ``__cause__``.

    Attributes:
        reasons: plugin name -> why it did not activate, in priority order.
        declined: the plugins that declined, with their reasons.
        failures: the plugins that failed (raised, timed out), with their
            reasons.
    """

    def __init__(self, reasons: Mapping[str, str], failed: Iterable[str] = ()) -> None:
        self.reasons = dict(reasons)
        failing = set(failed)
        self.failures = {name: why for name, why in self.reasons.items() if name in failing}
        self.declined = {name: why for name, why in self.reasons.items() if name not in failing}
        details = "; ".join(
            f"{name} failed: {why}" if name in failing else f"{name}: {why}"
            for name, why in self.reasons.items()
        )
        super().__init__(
            "Failed to infer device type: no platform plugin activated. "
            + (details or "No platform plugin ran.")
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reasons, tuple(self.failures)))


class AllreduceBackend(enum.StrEnum):
    """``auto``: mnnvl, with a trtllm fallback only on a single node."""

    AUTO = "auto"
    MNNVL = "mnnvl"
    TRTLLM = "trtllm"


#: What a build of the engine can target (vLLM's ``VLLM_TARGET_DEVICE``).
BUILD_TARGETS = ("cuda", "rocm", "cpu", "tpu", "xpu")

_DTYPES = ("auto", "float16", "bfloat16", "float32")
_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise EngineConfigError(attribute.name, value, "must be a positive integer")


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
        if value not in choices:
            raise EngineConfigError(attribute.name, value, valid=choices)

    return check


def _allreduce_backend(value: object) -> AllreduceBackend:
    try:
        return AllreduceBackend(str(value))
    except ValueError:
        valid = [b.value for b in AllreduceBackend]
        raise EngineConfigError("allreduce_backend", value, valid=valid) from None


@attrs.frozen(kw_only=True)
class EngineConfig:
    """What the engine is asked to start.

    Attributes:
        tp: tensor-parallel size (the all-reduce workspace runs when > 1).
        attention_backend: an explicit attention backend, or ``None`` for
            automatic selection.
        allreduce_backend: ``auto``, ``mnnvl`` or ``trtllm``.
        dtype: model dtype (``auto`` resolves to bfloat16).
        head_size: attention head size.
        kv_cache_dtype: KV-cache dtype.
        use_mla: multi-head latent attention (changes the candidate lists).
        block_size: KV-cache block size.
        quant_fusion: also set up the quantization-fusion workspace.
        target_device: what the engine build targets (``cuda``, ``rocm``,
            ``cpu``, ``tpu``, ``xpu``), as ``VLLM_TARGET_DEVICE``; ``None``
            reads the host (``VLLM_TARGET_DEVICE``, else the installed torch
            build, or a simulated profile's ``build``). ``cpu`` probes the
            cpu plugin alone. With vLLM's own platform code
            (``engine="vllm"``) it is handed to vLLM as ``VLLM_TARGET_DEVICE``.
        step_timeout: seconds each probe may take (a plugin's check, an
            import, a candidate, an attempt, an exchange), or ``None``. A
            step that waits for probes may take that long per level of
            probes below it, plus once for itself (:meth:`bound`), so a probe
            that hangs times out before the step that runs it.
    """

    tp: int = attrs.field(default=1, validator=_positive)
    attention_backend: str | None = None
    allreduce_backend: AllreduceBackend = attrs.field(
        default=AllreduceBackend.AUTO, converter=_allreduce_backend
    )
    dtype: str = attrs.field(default="auto", validator=_one_of(_DTYPES))
    head_size: int = attrs.field(default=128, validator=_positive)
    kv_cache_dtype: str = attrs.field(default="auto", validator=_one_of(_KV_CACHE_DTYPES))
    use_mla: bool = False
    block_size: int = attrs.field(default=16, validator=_positive)
    quant_fusion: bool = True
    target_device: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(_one_of(BUILD_TARGETS))
    )
    step_timeout: float | None = None

    def bound(self, levels: int = 1) -> float | None:
        """The timeout of a step with ``levels - 1`` levels of probes below
        it: ``step_timeout * levels`` (``None`` when there is no timeout)."""
        return None if self.step_timeout is None else self.step_timeout * levels

    @property
    def resolved_dtype(self) -> str:
        """``dtype`` with ``auto`` resolved (bfloat16)."""
        return "bfloat16" if self.dtype == "auto" else self.dtype

    def to_json(self) -> dict[str, Any]:
        """The JSON form recorded in ``run.started``."""
        return {**attrs.asdict(self), "allreduce_backend": str(self.allreduce_backend)}
