"""The ``attention`` step: which attention backend works here (SPEC §3.1)?

The candidates depend on the platform and the configuration (CUDA SM80/SM90
without MLA: FLASH_ATTN, FLASHINFER, TRITON_ATTN, FLEX_ATTENTION; SM100:
FLASHINFER first; MLA, ROCm, CPU, TPU and XPU lists of their own). Every
candidate is probed concurrently as ``attention/<BACKEND>``: it imports the
backend's real module through the importer and validates the configuration
(device, compute capability, dtype, head size, KV-cache dtype, block size,
MLA), giving the reasons it does not fit.

Under the probe policy an ImportError or OSError makes a candidate
``unavailable`` with reason ``"Type: message"`` while the others go on;
anything else propagates and cancels the siblings. Automatic selection takes
the valid candidate with the best priority; explicit selection
(``EngineConfig.attention_backend``) probes only that backend, with no
fallback.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import attrs

from events import JsonValue, Outcome

from .._candidates import Candidate, select_candidate
from .._context import StepContext, Unavailable
from .._graph import Step
from .._policy import PROBE_POLICY, Action, ErrorPolicy
from ._config import _KV_CACHE_DTYPES, EngineConfig
from ._conventions import ATTENTION_STEP, PLATFORM_STEP
from ._platform import _device_capability

__all__ = [
    "ATTENTION_BACKENDS",
    "ATTENTION_POLICY",
    "AttentionBackend",
    "attention_candidates",
    "make_attention_step",
]

#: The attention step's own errors (no valid backend, an explicit backend
#: that is unknown or not valid) are terminal, and so is a timeout: an
#: engine without attention cannot serve.
ATTENTION_POLICY = ErrorPolicy(name="attention", on_timeout=Action.PROPAGATE)

_HALF = ("float16", "bfloat16")
_HALF_KV = ("auto", *_HALF)
_FP8_KV = (*_HALF_KV, "fp8", "fp8_e4m3")


@attrs.frozen(kw_only=True)
class AttentionBackend:
    """What an attention backend needs: the module it loads and the
    configurations it supports.

    Attributes:
        name: ``FLASH_ATTN``...
        module: the module its probe imports.
        devices: platform devices it runs on (``cuda``, ``rocm``, ``cpu``...).
        dtypes: supported model dtypes.
        head_sizes: supported head sizes, or ``None`` for any multiple of 8
            up to ``max_head_size``.
        max_head_size: the bound for ``head_sizes=None``.
        kv_cache_dtypes: supported KV-cache dtypes.
        min_capability, max_capability: the supported compute-capability
            range (inclusive); ``None`` for no bound. Not checked when the
            device's capability is unknown.
        block_sizes: supported KV-cache block sizes, or ``None`` for any
            multiple of 16.
        mla: whether it is a multi-head-latent-attention backend.
    """

    name: str
    module: str
    devices: frozenset[str]
    dtypes: tuple[str, ...] = _HALF
    head_sizes: tuple[int, ...] | None = None
    max_head_size: int = 256
    kv_cache_dtypes: tuple[str, ...] = _HALF_KV
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    block_sizes: tuple[int, ...] | None = None
    mla: bool = False

    def validate(
        self, config: EngineConfig, device: str | None, capability: tuple[int, int] | None
    ) -> list[str]:
        """The reasons this backend does not fit (empty: it fits)."""
        reasons = []
        if device not in self.devices:
            reasons.append(f"device {device} not supported")
        low, high = self.min_capability, self.max_capability
        if capability is not None and not (low or capability) <= capability <= (high or capability):
            reasons.append(f"compute capability {capability[0]}.{capability[1]} not supported")
        if config.resolved_dtype not in self.dtypes:
            reasons.append(f"dtype {config.resolved_dtype} not supported")
        heads, head = self.head_sizes, config.head_size
        if not (
            head in heads if heads is not None else head % 8 == 0 and head <= self.max_head_size
        ):
            reasons.append(f"head_size {config.head_size} not supported")
        if config.kv_cache_dtype not in self.kv_cache_dtypes:
            reasons.append(f"kv_cache_dtype {config.kv_cache_dtype} not supported")
        blocks, block = self.block_sizes, config.block_size
        if not (block in blocks if blocks is not None else block % 16 == 0):
            reasons.append(f"block_size {config.block_size} not supported")
        if config.use_mla != self.mla:
            reasons.append("MLA not supported" if config.use_mla else "non-MLA not supported")
        return reasons


_CUDA = frozenset({"cuda"})
_MLA_HEAD = (576,)  # kv_lora_rank 512 + rope 64

#: Every backend the engine knows, by name (explicit selection accepts these).
ATTENTION_BACKENDS: Mapping[str, AttentionBackend] = {
    backend.name: backend
    for backend in (
        AttentionBackend(
            name="FLASH_ATTN",
            module="flash_attn",
            devices=_CUDA,
            kv_cache_dtypes=_FP8_KV,
            min_capability=(8, 0),
        ),
        AttentionBackend(
            name="FLASHINFER",
            module="flashinfer",
            devices=_CUDA,
            head_sizes=(64, 128, 256),
            kv_cache_dtypes=_KV_CACHE_DTYPES,
            min_capability=(7, 5),
            max_capability=(12, 1),
        ),
        AttentionBackend(
            name="TRITON_ATTN",
            module="triton",
            devices=frozenset({"cuda", "rocm", "xpu"}),
            dtypes=(*_HALF, "float32"),
            kv_cache_dtypes=_KV_CACHE_DTYPES,
        ),
        AttentionBackend(
            name="FLEX_ATTENTION",
            module="torch",
            devices=_CUDA,
            dtypes=(*_HALF, "float32"),
        ),
        AttentionBackend(
            name="CUTLASS_MLA",
            module="cutlass",
            devices=_CUDA,
            head_sizes=_MLA_HEAD,
            kv_cache_dtypes=_FP8_KV,
            min_capability=(10, 0),
            max_capability=(10, 9),
            block_sizes=(128,),
            mla=True,
        ),
        AttentionBackend(
            name="FLASHINFER_MLA",
            module="flashinfer",
            devices=_CUDA,
            head_sizes=_MLA_HEAD,
            kv_cache_dtypes=_KV_CACHE_DTYPES,
            min_capability=(10, 0),
            max_capability=(10, 9),
            block_sizes=(32, 64),
            mla=True,
        ),
        AttentionBackend(
            name="FLASH_ATTN_MLA",
            module="flash_attn",
            devices=_CUDA,
            head_sizes=_MLA_HEAD,
            min_capability=(9, 0),
            max_capability=(9, 9),
            mla=True,
        ),
        AttentionBackend(
            name="FLASHMLA",
            module="flash_mla",
            devices=_CUDA,
            head_sizes=_MLA_HEAD,
            kv_cache_dtypes=_FP8_KV,
            min_capability=(9, 0),
            max_capability=(10, 9),
            block_sizes=(64,),
            mla=True,
        ),
        AttentionBackend(
            name="TRITON_MLA",
            module="triton",
            devices=frozenset({"cuda", "rocm"}),
            head_sizes=_MLA_HEAD,
            mla=True,
        ),
        AttentionBackend(
            name="ROCM_AITER_FA",
            module="aiter",
            devices=frozenset({"rocm"}),
            head_sizes=(64, 128, 256),
            min_capability=(9, 4),
            max_capability=(9, 5),
        ),
        AttentionBackend(
            name="ROCM_ATTN",
            module="torch",
            devices=frozenset({"rocm"}),
            dtypes=(*_HALF, "float32"),
            head_sizes=(64, 128),
        ),
        AttentionBackend(
            name="CPU_ATTN",
            module="torch",
            devices=frozenset({"cpu"}),
            dtypes=(*_HALF, "float32"),
            head_sizes=(32, 64, 80, 96, 112, 128, 160, 192, 224, 256),
        ),
        AttentionBackend(
            name="PALLAS",
            module="torch_xla",
            devices=frozenset({"tpu"}),
            dtypes=("bfloat16", "float32"),
            head_sizes=(64, 128, 256),
        ),
        AttentionBackend(
            name="XPU_ATTN",
            module="torch",
            devices=frozenset({"xpu"}),
            head_sizes=(64, 80, 96, 128, 256),
        ),
    )
}


def attention_candidates(
    device: str | None, capability: tuple[int, int] | None, use_mla: bool
) -> tuple[str, ...]:
    """The candidate backends in priority order for a platform device
    (``cuda``, ``rocm``, ``cpu``, ``tpu``, ``xpu``; anything else has none)
    and, on CUDA, its compute capability (``None`` when unknown)."""
    major = capability[0] if capability is not None else None
    if device == "cuda":
        if use_mla:
            if major == 10:
                return ("CUTLASS_MLA", "FLASHINFER_MLA", "FLASH_ATTN_MLA", "TRITON_MLA")
            if major == 9:
                return ("FLASH_ATTN_MLA", "FLASHMLA", "TRITON_MLA")
            return ("TRITON_MLA",)
        if major == 10:
            return ("FLASHINFER", "FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION")
        return ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "FLEX_ATTENTION")
    if device == "rocm":
        if use_mla:
            return ("TRITON_MLA",)
        return ("ROCM_AITER_FA", "ROCM_ATTN", "TRITON_ATTN")
    lists = {"cpu": ("CPU_ATTN",), "tpu": ("PALLAS",), "xpu": ("XPU_ATTN", "TRITON_ATTN")}
    return lists.get(device or "", ())


def make_attention_step(config: EngineConfig) -> Step:
    """The ``attention`` step (depends on ``platform``).

    Result: ``{"backend", "explicit" (bool), "considered" (names in
    priority order), "valid" (those that fit, in priority order)}``. Raises
    ValueError when no candidate is valid (``No valid backend found for
    attention on cuda with AttentionSelectorConfig(...). Reasons: {...}.``,
    as vLLM 0.33 words it), or when the explicit backend is unknown (listing
    the valid names) or not valid (``Selected backend X is not valid for this
    configuration. Reason: [OSError: ...]``, raised from the original
    exception, when it cannot be loaded; ``Reason: ['head_size 80 not
    supported']``, the reasons list, when it does not fit). A platform
    without known backends (a third-party one) ends the step ``absent``.
    """
    explicit = config.attention_backend

    async def select_attention_backend(ctx: StepContext) -> JsonValue | Unavailable:
        platform = ctx.result(PLATFORM_STEP)
        if not isinstance(platform, dict):
            return Unavailable(reasons=("no platform was selected",))
        device = platform.get("device")
        device = device if isinstance(device, str) else None
        if explicit is not None and explicit not in ATTENTION_BACKENDS:
            raise ValueError(
                f"Unknown attention backend {explicit!r}; valid names: "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        capability = await ctx.to_thread(_device_capability, ctx, device)
        names = attention_candidates(device, capability, config.use_mla)
        if explicit is not None and explicit not in names:
            # Explicit selection may name any known backend; validation says
            # why it does not fit this platform.
            names = (*names, explicit)
        if not names:
            return Unavailable(
                outcome=Outcome.ABSENT,
                reasons=(f"no attention backends are known for {platform.get('platform_class')}",),
            )

        def load_and_validate(backend: AttentionBackend, child: StepContext) -> Sequence[str]:
            child.import_module(backend.module)
            return backend.validate(config, device, capability)

        candidates = [
            Candidate(
                name=name,
                priority=priority,
                probe=functools.partial(load_and_validate, ATTENTION_BACKENDS[name]),
            )
            for priority, name in enumerate(names)
        ]
        selection = await select_candidate(
            ctx,
            candidates,
            explicit=explicit,
            what="backend",
            # The configuration as vLLM 0.33 names it when no backend fits.
            where=f"attention on {device} with AttentionSelectorConfig(head_size="
            f"{config.head_size}, dtype=torch.{config.resolved_dtype}, kv_cache_dtype="
            f"{config.kv_cache_dtype}, block_size={config.block_size}, use_mla={config.use_mla})",
            policy=PROBE_POLICY,
            timeout=config.step_timeout,
        )
        return {
            "backend": selection.selected,
            "explicit": selection.explicit,
            "considered": list(selection.considered),
            "valid": list(selection.valid),
        }

    return Step(
        name=ATTENTION_STEP,
        body=select_attention_backend,
        depends_on=(PLATFORM_STEP,),
        policy=ATTENTION_POLICY,
        # Its candidates time out first, each recorded as timed out.
        timeout=config.bound(2),
        attributes={"explicit": explicit},
    )
