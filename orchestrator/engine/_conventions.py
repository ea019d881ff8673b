"""The reference engine's step names and payload keys.

The engine graph writes events following these conventions; the engine
slice's pure projections (state, messages, report columns) read them. Keeping
them in one module is what lets a log written by one release be understood
by the projections of another. This module imports nothing.

Steps (``kind`` in brackets, payloads as JSON)::

    process_group                     [step]       the runtime's (orchestrator._group)
      result   {"backend", "world_size"}
      unavailable (torch missing or unloadable: the rank decides alone, and
      its peers wait for it at the rendezvous) | failed (GroupError, timeout)
    platform                          [step]       attributes {} | {"engine": "vllm",
                                                   "vllm_version", "vllm_tested"}
      result   {"plugin", "platform_class", "device", "builtin"}
               (+ "qualname", "handed_back" with engine vllm)
      failure  cause PlatformConflictError | UnspecifiedPlatformError
      decision "platform.select" -> {"plugin", "platform_class"} | null
    platform/build                    [step]       the reference engine's build target
      result   {"device", "source", "explicit": bool} | unavailable (cause)
    platform/<plugin>                 [candidate]  attributes {"plugin", "builtin", "priority"}
      result   {"activated": true, "platform_class": str, "device": str | null}
               (+ "qualname" with engine vllm)
      absent (declined: reasons) | unavailable without a cause (declined, its
      hardware present but unusable: reasons) | unavailable (or failed) with
      the cause (it raised); logs of earlier releases record a decline as
      ok {"activated": false}
    platform/<plugin>/register        [step]       engine vllm: the plugin's own function
      result   {"returned": qualname | null, "records": [{"logger", "level", "message"}]}
    platform/<plugin>/load_class      [step]       engine vllm: importing the class it named
      result   {"qualname", "device"}
    platform/cpu/zentorch             [step]       optional-module policy
      ok {"loaded": true} | absent | unavailable (broken) | failed
    attention                         [step]       attributes {"explicit": name | null}
      result   {"backend", "explicit": bool, "considered": [names by priority],
                "valid": [the valid ones, by priority]}
               (the candidates depend on the platform, known only at run time)
      failure  orchestrator.ExplicitCandidateInvalidError | orchestrator.NoValidCandidateError
               (both ValueError; logs of earlier releases record a plain
               ValueError, recognised by its message)
      decision "candidates.select" -> backend name
    attention/<BACKEND>               [candidate]  attributes {"candidate", "priority"}
      ok | invalid (reasons) | unavailable (cause) | failed
    flashinfer_comm                   [step]
      ok {"available": true} | absent (flashinfer not installed)
      | unavailable (cause: the import error, or reason naming a missing symbol)
    allreduce_workspace               [step]       attributes {"requested", "tp"}
      result   {"enabled": bool, "backend": str | null, "quant_backend": str | null,
                "reason": str | null, "quant_reason": str | null, "nodes": int}
      failure  ValueError (configuration error, e.g. trtllm on several nodes)
      decision "fallback.result" -> backend | null (this rank's chain)
      decision "allreduce.agreed" -> backend | null (what every rank uses)
    allreduce_workspace/<backend>     [attempt]    attributes {"backend", "attempt", "attempts",
                                                               "fallback_left"}
               (+ "catch_up": true when tried late so all ranks can agree)
    allreduce_workspace/agree         [step]       result {"backend", "local", "group",
                                                           "rounds", "released"}
    allreduce_workspace/quant         [step]       result {"backend", "reused": bool}
               (only when a backend was agreed and quant fusion is on)
"""

from __future__ import annotations

__all__ = [
    "ALLREDUCE_AGREE_STEP",
    "ALLREDUCE_QUANT_STEP",
    "ALLREDUCE_STEP",
    "ALLREDUCE_TP1_REASON",
    "ALLREDUCE_UNSUPPORTED_REASON",
    "ATTENTION_STEP",
    "ENGINE_SLICE",
    "FLASHINFER_COMM_STEP",
    "PLATFORM_BUILD_STEP",
    "PLATFORM_STEP",
    "PROCESS_GROUP_STEP",
    "ZENTORCH_STEP",
]

#: The runtime's step (orchestrator._group.PROCESS_GROUP_STEP), named here
#: for the pure modules, which cannot import the runtime.
PROCESS_GROUP_STEP = "process_group"
PLATFORM_STEP = "platform"
PLATFORM_BUILD_STEP = "platform/build"
ZENTORCH_STEP = "platform/cpu/zentorch"
ATTENTION_STEP = "attention"
FLASHINFER_COMM_STEP = "flashinfer_comm"
ALLREDUCE_STEP = "allreduce_workspace"
ALLREDUCE_AGREE_STEP = "allreduce_workspace/agree"
ALLREDUCE_QUANT_STEP = "allreduce_workspace/quant"

#: The all-reduce step's ``reason`` when fusion does not apply (nothing lost).
ALLREDUCE_TP1_REASON = "tensor parallel size is 1"

#: Its ``reason`` when ``auto`` has no backend for the launch (several
#: nodes without an MNNVL-capable system): off as vLLM 0.33 leaves it,
#: nothing lost.
ALLREDUCE_UNSUPPORTED_REASON = "multi-node process groups require an MNNVL-capable Blackwell system"

#: Where the engine's slice (:data:`~orchestrator.engine.ENGINE`) is loaded
#: from, as ``--slice`` takes it; engine runs record it in ``run.started``.
ENGINE_SLICE = "orchestrator.engine:ENGINE"
