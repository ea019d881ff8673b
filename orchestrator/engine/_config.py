"""The reference engine's configuration and its errors."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from events import InvalidValueError

from .._errors import OrchestratorError

__all__ = [
    "AllreduceBackend",
    "EngineConfig",
    "EngineConfigError",
    "PlatformConflictError",
    "ProfileError",
    "UnspecifiedPlatformError",
]


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

    __module__ = "orchestrator.engine"

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

    __module__ = "orchestrator.engine"

    def __init__(self, source: str, reason: str) -> None:
        self.source = source
        self.reason = reason
        super().__init__(f"profile {source!r}: {reason}")


class PlatformConflictError(OrchestratorError, RuntimeError):
    """More than one platform plugin activated (SPEC §3.2).

    Attributes:
        plugins: the activated plugins.
    """

    __module__ = "orchestrator.engine"

    def __init__(self, plugins: list[str]) -> None:
        self.plugins = list(plugins)
        super().__init__(
            f"Only one platform plugin can be activated, but got: {self.plugins}; "
            "uninstall or disable all but one"
        )


class UnspecifiedPlatformError(OrchestratorError, RuntimeError):
    """No platform plugin activated (SPEC §3.2). The message names every
    plugin that failed and why; the first failure is the ``__cause__``.

    Attributes:
        failures: plugin name -> the reason it failed.
    """

    __module__ = "orchestrator.engine"

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        if self.failures:
            details = "; ".join(f"{name}: {reason}" for name, reason in self.failures.items())
            text = (
                "Failed to infer device type: no platform plugin activated. "
                f"Failed plugins: {details}"
            )
        else:
            text = (
                "Failed to infer device type: no platform plugin activated and none failed "
                "(no supported device found on this host)"
            )
        super().__init__(text)


class AllreduceBackend(enum.StrEnum):
    """``auto``: mnnvl, with a trtllm fallback only on a single node."""

    AUTO = "auto"
    MNNVL = "mnnvl"
    TRTLLM = "trtllm"


_DTYPES = ("auto", "float16", "bfloat16", "float32")
_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


def _positive(field: str) -> Any:
    def check(_instance: object, _attribute: object, value: int) -> None:
        if type(value) is not int or value < 1:
            raise EngineConfigError(field, value, "must be a positive integer")

    return check


def _one_of(field: str, choices: tuple[str, ...]) -> Any:
    def check(_instance: object, _attribute: object, value: str) -> None:
        if value not in choices:
            raise EngineConfigError(field, value, valid=choices)

    return check


def _allreduce(value: object) -> AllreduceBackend:
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
        step_timeout: seconds each probe may take (a plugin's check, an
            import, a candidate, an attempt, an exchange), or ``None``. A
            step that waits for probes may take that long per level of
            probes below it, plus once for itself (:meth:`bound`), so a probe
            that hangs times out before the step that runs it.
    """

    tp: int = attrs.field(default=1, validator=_positive("tp"))
    attention_backend: str | None = None
    allreduce_backend: AllreduceBackend = attrs.field(
        default=AllreduceBackend.AUTO, converter=_allreduce
    )
    dtype: str = attrs.field(default="auto", validator=_one_of("dtype", _DTYPES))
    head_size: int = attrs.field(default=128, validator=_positive("head_size"))
    kv_cache_dtype: str = attrs.field(
        default="auto", validator=_one_of("kv_cache_dtype", _KV_CACHE_DTYPES)
    )
    use_mla: bool = False
    block_size: int = attrs.field(default=16, validator=_positive("block_size"))
    quant_fusion: bool = True
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
        return {
            "tp": self.tp,
            "attention_backend": self.attention_backend,
            "allreduce_backend": str(self.allreduce_backend),
            "dtype": self.dtype,
            "head_size": self.head_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "use_mla": self.use_mla,
            "block_size": self.block_size,
            "quant_fusion": self.quant_fusion,
            "step_timeout": self.step_timeout,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Rebuild from :meth:`to_json`'s form; unknown keys are ignored (a
        newer release may add settings).

        Raises:
            EngineConfigError: a value is invalid.
        """
        known = {field.name for field in attrs.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})
