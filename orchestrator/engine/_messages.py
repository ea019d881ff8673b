"""The reference engine's messages: SPEC §3.6 as rules and one hook.

Pure: imports only ``events`` (and attrs), so a replay of an engine log never
needs the runtime, anyio or torch. The kernel derives the generic messages
(``step.*``, ``run.*``); this module adds the engine's, for the steps of
:mod:`orchestrator.engine._conventions`::

    platform/<p> ends absent (declined)                 platform.plugin_declined   [rule]
    platform/<p> ends unavailable or invalid            platform.device_unusable   [rule]
      without a cause (declined, its hardware present but unusable)
    platform/<p> ends unavailable|failed with a cause   platform.plugin_failed
      (or timed out or crashed)
    platform started with vLLM's own code               platform.vllm_code, and
                                                        platform.vllm_untested outside
                                                        the vLLM releases tested
    platform ok                                         platform.detected          [rule]
    platform ok after some plugin failed                platform.fallback (one per plugin)
    platform failed: PlatformConflictError              platform.conflict          [rule]
    platform failed: UnspecifiedPlatformError           platform.unspecified       [rule]
    platform/cpu/zentorch ok | absent                   zentorch.loaded | .absent  [rules]
    platform/cpu/zentorch unavailable                   zentorch.broken
    attention/<B> invalid | unavailable, absent         attention.backend_invalid |
                                                        _unavailable               [rules]
    attention ok, explicit                              attention.explicit_selected [rule]
    attention ok, automatic                             attention.selected
    attention failed: ExplicitCandidateInvalidError     attention.explicit_invalid [rule]
    attention failed: NoValidCandidateError             attention.none_valid       [rule]
    flashinfer_comm unavailable | invalid               flashinfer_comm.unavailable [rules]
      (absent, i.e. flashinfer not installed, is the expected case: no message)
    allreduce_workspace/<b> attempt ends unavailable,   allreduce.attempt_failed   [fallback
      failed, timed out or crashed, fallback_left      rules: said when the next attempt
                                                       starts, which they name]
    allreduce_workspace ok, enabled                     allreduce.workspace_ready  [rule]
    allreduce_workspace ok, disabled, attempts ran      allreduce.workspace_failed
    allreduce_workspace ok, disabled, no backend        allreduce.unsupported      [rule]
      for the launch (auto on several nodes without MNNVL)
    allreduce_workspace/quant ends unavailable,         allreduce.quant_workspace_failed
      timed out or crashed (quantization fusion off)

``[rule]`` rows are :class:`events.MessageRule` data (conditions on the
step's result and cause, defaults for values an older log lacks); the others
need what earlier events said (failed plugins, attempts, the torch version)
and are derived by :class:`EngineMessageHook`, the slice's message hook.

Legacy logs: releases before the typed candidate errors recorded
``attention.explicit_invalid`` and ``attention.none_valid`` failures as a
plain ``ValueError``. Such a log is still understood, by two more rules: a
``ValueError`` that starts at the attention step and whose message begins as
those releases wrote it (``Selected backend`` / ``No valid``) gets the same
code. These are the only rules where a message's text decides anything, and
only for those logs.
"""

from __future__ import annotations

import attrs

from events import (
    JsonValue,
    MessageContext,
    MessageRule,
    Outcome,
    RunStarted,
    Scope,
    Severity,
    StepCrashed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
    cause_of,
    outcome_of,
    reason_of,
)

from ._conventions import (
    ALLREDUCE_AGREE_STEP,
    ALLREDUCE_QUANT_STEP,
    ALLREDUCE_STEP,
    ALLREDUCE_UNSUPPORTED_REASON,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_BUILD_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)

__all__ = ["ENGINE_RULES", "SEVERITIES", "EngineMessageHook"]

_DEBUG, _INFO, _WARNING, _ERROR = Severity.DEBUG, Severity.INFO, Severity.WARNING, Severity.ERROR
_PROCESS, _LOCAL, _GLOBAL = Scope.PROCESS, Scope.LOCAL, Scope.GLOBAL

#: SPEC §3.6 as data: the failures and outcomes a rule can say alone.
ENGINE_RULES: tuple[MessageRule, ...] = (
    *(
        MessageRule(
            code=code, step=PLATFORM_STEP, exception=exception, text="{message}", severity=_ERROR
        )
        for code, exception in (
            ("platform.conflict", "PlatformConflictError"),
            ("platform.unspecified", "UnspecifiedPlatformError"),
        )
    ),
    MessageRule(
        code="zentorch.loaded",
        step=ZENTORCH_STEP,
        outcomes=Outcome.OK,
        text="Loaded zentorch; using ZenCpuPlatform.",
        args=(),
        severity=_INFO,
        scope=_LOCAL,
    ),
    MessageRule(
        code="zentorch.absent",
        step=ZENTORCH_STEP,
        outcomes=Outcome.ABSENT,
        text="zentorch is not installed; using CpuPlatform.",
        args=(),
        severity=_DEBUG,
        scope=_LOCAL,
        detail=False,
    ),
    # A plugin (a candidate under platform: not its children, nor the build
    # target) that declined says why at DEBUG; at WARNING when its hardware
    # is evidently there but unusable (beyond vLLM, which says nothing then).
    *(
        MessageRule(
            code=code,
            step=f"{PLATFORM_STEP}/*",
            outcomes=outcomes,
            when={"kind": "candidate", "cause": False},
            text=f"Platform plugin {{attributes[plugin]}} {what}: {{reason}}",
            args=("{attributes[plugin]}", "{reason}"),
            defaults={"attributes.plugin": "{name}"},
            severity=severity,
        )
        for code, outcomes, what, severity in (
            ("platform.plugin_declined", Outcome.ABSENT, "declined", _DEBUG),
            (
                "platform.device_unusable",
                (Outcome.UNAVAILABLE, Outcome.INVALID),
                "cannot use this host's devices",
                _WARNING,
            ),
        )
    ),
    MessageRule(
        code="platform.detected",
        step=PLATFORM_STEP,
        outcomes=Outcome.OK,
        text="Automatically detected platform {result[platform_class]}.",
        args=("{result[platform_class]}",),
        defaults={"result.platform_class": "an unknown platform"},
        severity=_INFO,
        scope=_LOCAL,
    ),
    *(
        MessageRule(
            code=code,
            step=f"{ATTENTION_STEP}/*",
            outcomes=outcomes,
            text=f"Attention backend {{attributes[candidate]}} {what}: {{reason}}",
            args=("{attributes[candidate]}", "{reason}"),
            defaults={"attributes.candidate": "{name}"},
            severity=_DEBUG,
        )
        for code, outcomes, what in (
            ("attention.backend_invalid", Outcome.INVALID, "does not support this configuration"),
            (
                "attention.backend_unavailable",
                (Outcome.UNAVAILABLE, Outcome.ABSENT),
                "is unavailable",
            ),
        )
    ),
    MessageRule(
        code="attention.explicit_selected",
        step=ATTENTION_STEP,
        outcomes=Outcome.OK,
        when={"result.explicit": True},
        text="Using {result[backend]} backend.",
        args=("{result[backend]}",),
        defaults={"result.backend": "an unknown"},
        severity=_INFO,
        scope=_LOCAL,
    ),
    *(
        MessageRule(
            code=code,
            step=ATTENTION_STEP,
            exception=exception,
            when=when,
            text="{message}",
            severity=_ERROR,
        )
        for code, exception, when in (
            # The typed errors of orchestrator._candidates, by their public names.
            ("attention.explicit_invalid", "orchestrator.ExplicitCandidateInvalidError", {}),
            ("attention.none_valid", "orchestrator.NoValidCandidateError", {}),
            # Logs of releases before the typed errors (the module docstring).
            ("attention.explicit_invalid", "ValueError", {"message": "Selected backend*"}),
            ("attention.none_valid", "ValueError", {"message": "No valid*"}),
        )
    ),
    # Absent (flashinfer not installed) is the expected case: no message.
    # With a cause, the import failed; without, a fusion entry point is missing.
    *(
        MessageRule(
            code="flashinfer_comm.unavailable",
            step=FLASHINFER_COMM_STEP,
            outcomes=(Outcome.UNAVAILABLE, Outcome.INVALID),
            when=when,
            text=text,
            args=(arg,),
            severity=_DEBUG,
            scope=_LOCAL,
        )
        for when, text, arg in (
            ({"cause": True}, "flashinfer.comm import failed: {message}", "{message}"),
            ({}, "flashinfer.comm is unavailable: {reason}", "{reason}"),
        )
    ),
    # An attempt a fallback recovers is expected on many healthy hosts: one
    # line, no traceback (the cause stays in the log). The first that matches
    # speaks: mnnvl's names its likely cause.
    *(
        MessageRule(
            code="allreduce.attempt_failed",
            fallback=True,
            step=f"{ALLREDUCE_STEP}/{backend}",
            text="FlashInfer allreduce workspace with backend={attributes[backend]} {verb} "
            f"({{reason}}{hint}); falling back to {{next_name}}.",
            args=("{attributes[backend]}", "{reason}", "{next_name}"),
            defaults={"attributes.backend": "{name}"},
            detail=False,
            severity=_WARNING,
            scope=_LOCAL,
        )
        for backend, hint in (
            ("mnnvl", "; likely no NVSwitch multicast support for mnnvl"),
            ("*", ""),
        )
    ),
    MessageRule(
        code="allreduce.workspace_ready",
        step=ALLREDUCE_STEP,
        outcomes=Outcome.OK,
        when={"result.enabled": True},
        text="Initialized FlashInfer allreduce fusion workspace with backend={result[backend]}",
        args=("{result[backend]}",),
        defaults={"result.backend": "unknown"},
        severity=_INFO,
        scope=_LOCAL,
    ),
    # vLLM 0.33 leaves multi-node fusion off without MNNVL, at DEBUG.
    MessageRule(
        code="allreduce.unsupported",
        step=ALLREDUCE_STEP,
        outcomes=Outcome.OK,
        when={"result.reason": ALLREDUCE_UNSUPPORTED_REASON},
        text="FlashInfer allreduce fusion is disabled: {result[reason]}.",
        args=("{result[reason]}",),
        severity=_DEBUG,
        scope=_LOCAL,
    ),
)

#: SPEC §3.6, row by row, for the codes the hook and the kernel derive (the
#: rules above carry their own), then the codes this release adds to it:
#: with the rules, the engine's policy (severity and scope of every code an
#: engine run derives), each written once.
SEVERITIES: dict[str, tuple[Severity, Scope]] = {
    "platform.plugin_failed": (_DEBUG, _PROCESS),
    "platform.fallback": (_WARNING, _PROCESS),
    "zentorch.broken": (_WARNING, _LOCAL),
    "attention.selected": (_INFO, _LOCAL),
    "allreduce.workspace_failed": (_ERROR, _PROCESS),
    "allreduce.divergence": (_ERROR, _GLOBAL),
    # Added: a terminal failure, ERROR once per rank as its plain sibling.
    "allreduce.quant_workspace_failed": (_ERROR, _PROCESS),
    "step.failed": (_ERROR, _PROCESS),
    "step.timed_out": (_ERROR, _PROCESS),
    "step.crashed": (_ERROR, _PROCESS),
    "run.ready": (_INFO, _GLOBAL),
    "run.failed": (_ERROR, _PROCESS),
    "run.interrupted": (_ERROR, _PROCESS),
    # Codes outside SPEC's table that this release derives (cross-rank
    # findings it does not name); a later slice may override them.
    # Mixed platforms in one launch cannot run one collective program.
    "platform.divergence": (_ERROR, _GLOBAL),
    # Different attention kernels still run; outputs and speed may differ.
    "attention.divergence": (_WARNING, _GLOBAL),
    # A rank without flashinfer.comm costs every rank the fusion (recovered).
    "flashinfer_comm.divergence": (_WARNING, _GLOBAL),
    # Which steps ran a real engine's own code (engine="vllm").
    "platform.vllm_code": (_INFO, _LOCAL),
    "platform.vllm_untested": (_WARNING, _LOCAL),
}


# --------------------------------------------------------------------------
# The hook


def _field(value: JsonValue, key: str) -> JsonValue:
    return value.get(key) if isinstance(value, dict) else None


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) and value else None


def _attribute(started: StepStarted | None, key: str, fallback: str) -> str:
    return (_text(started.attributes.get(key)) if started is not None else None) or fallback


@attrs.frozen(kw_only=True)
class _Memory:
    """What the engine's derivations remember between events of a rank."""

    torch_version: str | None = None
    failed_plugins: tuple[tuple[str, str, int], ...] = ()
    #: all-reduce attempts that ended: (backend, failure reason or None, seq)
    attempts: tuple[tuple[str, str | None, int], ...] = ()


def _is_plugin(step: str) -> bool:
    return step.rpartition("/")[0] == PLATFORM_STEP and step != PLATFORM_BUILD_STEP


def _is_attempt(step: str, started: StepStarted | None) -> bool:
    if step.rpartition("/")[0] != ALLREDUCE_STEP:
        return False
    if started is not None:
        return started.kind is StepKind.ATTEMPT
    return step not in (ALLREDUCE_AGREE_STEP, ALLREDUCE_QUANT_STEP)


class EngineMessageHook:
    """The engine slice's message hook (:class:`events.MessageHook`): the
    §3.6 rows that depend on earlier events. Stateless; its memory per rank
    is a frozen value the kernel keeps."""

    def initial(self) -> _Memory:
        return _Memory()

    def covers_stop(self, step: str, started: StepStarted | None) -> bool:
        # A timeout or crash of an all-reduce attempt or of the quantization
        # workspace is covered by the allreduce codes, one of a platform
        # plugin by the platform codes (a failed plugin); the build target's
        # is the kernel's to say.
        return _is_attempt(step, started) or step == ALLREDUCE_QUANT_STEP or _is_plugin(step)

    def before(self, context: MessageContext, memory: _Memory) -> _Memory:
        event = context.event
        if isinstance(event, RunStarted):
            return attrs.evolve(memory, torch_version=event.versions.get("torch"))
        return memory

    def after(self, context: MessageContext, memory: _Memory) -> _Memory:
        event = context.event
        if isinstance(event, StepStarted):
            if event.step == PLATFORM_STEP:
                _real_engine_code(context, event)
            return memory
        if outcome_of(event) is None:
            return memory
        step = event.step
        started = context.started
        if _is_plugin(step):
            return _plugin(context, memory, started)
        if step == ZENTORCH_STEP:
            _zentorch(context, memory)
        elif _is_attempt(step, started):
            return _allreduce_attempt(context, memory, started)
        elif step == ALLREDUCE_QUANT_STEP:
            _quant_workspace(context, memory, started)
        elif isinstance(event, StepSucceeded):
            if step == PLATFORM_STEP:
                _platform(context, event, memory)
            elif step == ATTENTION_STEP:
                _attention(context, event, started)
            elif step == ALLREDUCE_STEP:
                _allreduce(context, event, memory)
        return memory


# -- platform ----------------------------------------------------------------


def _plugin(context: MessageContext, memory: _Memory, started: StepStarted | None) -> _Memory:
    # A plugin that raised, timed out or crashed failed: not activated, and
    # worth a WARNING if the run goes on on another platform (one that
    # declined is a rule).
    event = context.event
    cause = cause_of(event)
    if cause is None and not isinstance(event, StepTimedOut | StepCrashed):
        return memory
    plugin = _attribute(started, "plugin", event.step.rpartition("/")[2])
    reason = reason_of(event)
    context.emit(
        "platform.plugin_failed",
        f"Platform plugin {plugin} failed: {reason}",
        step=event.step,
        args=(plugin, reason),
        exception=cause,
    )
    return attrs.evolve(
        memory, failed_plugins=(*memory.failed_plugins, (plugin, reason, event.seq))
    )


def _platform(context: MessageContext, event: StepSucceeded, memory: _Memory) -> None:
    # platform.detected is a rule, said before these.
    platform_class = _text(_field(event.result, "platform_class")) or "an unknown platform"
    for plugin, reason, seq in memory.failed_plugins:
        context.emit(
            "platform.fallback",
            f"Platform plugin {plugin} failed ({reason}); continuing on "
            f"{platform_class}. Fix or uninstall the plugin if {plugin} was expected.",
            step=event.step,
            args=(plugin, reason, platform_class),
            seqs=(seq,),
        )


def _real_engine_code(context: MessageContext, event: StepStarted) -> None:
    attributes = event.attributes
    if attributes.get("engine") != "vllm":
        return
    version = _text(attributes.get("vllm_version")) or "unknown"
    modelled = attributes.get("modelled", [ATTENTION_STEP, FLASHINFER_COMM_STEP, ALLREDUCE_STEP])
    names = [str(name) for name in modelled] if isinstance(modelled, list) else []
    text = f"Platform detection runs vLLM {version}'s own plugins (vllm.platforms)"
    if names:
        listed = ", ".join(names[:-1]) + f" and {names[-1]}" if len(names) > 1 else names[0]
        verb = "are" if len(names) > 1 else "is"
        text += f"; {listed} {verb} the reference engine's model of the platform it selects"
    context.emit("platform.vllm_code", text + ".", step=event.step, args=(version, *names))
    tested = _text(attributes.get("vllm_tested"))
    if attributes.get("vllm_supported") is False:
        context.emit(
            "platform.vllm_untested",
            f"vLLM {version} is outside the releases this startup-orchestrator was tested "
            f"with ({tested}); its platform plugins still run, but what they log may not "
            "give the reasons recorded for tested releases.",
            step=event.step,
            args=(version,),
        )


def _zentorch(context: MessageContext, memory: _Memory) -> None:
    event = context.event
    if outcome_of(event) is not Outcome.UNAVAILABLE:
        return
    reason = reason_of(event)
    torch = memory.torch_version
    installed = f"the installed torch {torch}" if torch else "the installed torch"
    context.emit(
        "zentorch.broken",
        f"zentorch failed to import ({reason}); the zentorch build probably does not "
        f"match {installed}. Falling back to CpuPlatform; install the zentorch "
        "release built for this torch to use ZenCpuPlatform.",
        step=event.step,
        args=(reason,),
        exception=cause_of(event),
    )


# -- attention ---------------------------------------------------------------


def _attention(context: MessageContext, event: StepSucceeded, started: StepStarted | None) -> None:
    result = event.result
    if _field(result, "explicit") is True:
        return  # attention.explicit_selected, a rule
    backend = _text(_field(result, "backend")) or "an unknown"
    # vLLM 0.33 lists the valid candidates; logs of earlier releases have
    # only every candidate probed.
    valid = _field(result, "valid")
    if not isinstance(valid, list):
        valid = _field(result, "considered")
    if not isinstance(valid, list) and started is not None:
        valid = started.attributes.get("candidates")
    names = [str(item) for item in valid] if isinstance(valid, list) else []
    context.emit(
        "attention.selected",
        f"Using {backend} attention backend out of potential backends: {names!r}",
        step=event.step,
        args=(backend, repr(names)),
    )


# -- all-reduce --------------------------------------------------------------


def _allreduce_attempt(
    context: MessageContext, memory: _Memory, started: StepStarted | None
) -> _Memory:
    # Its message, with a fallback left, is a rule's; the workspace's outcome
    # names the attempts.
    event = context.event
    reason = None if outcome_of(event) in (Outcome.OK, Outcome.CANCELLED) else reason_of(event)
    backend = _attribute(started, "backend", event.step.rpartition("/")[2])
    return attrs.evolve(memory, attempts=(*memory.attempts, (backend, reason, event.seq)))


def _allreduce(context: MessageContext, event: StepSucceeded, memory: _Memory) -> None:
    result = event.result
    reason = _text(_field(result, "reason"))
    attempts = memory.attempts
    # Enabled (allreduce.workspace_ready) and unsupported are rules.
    if _field(result, "enabled") is True or reason == ALLREDUCE_UNSUPPORTED_REASON or not attempts:
        return
    last_backend = attempts[-1][0]
    failures = [why for _backend, why, _seq in attempts if why is not None]
    reason = reason or (failures[-1] if failures else "the ranks did not agree on a backend")
    context.emit(
        "allreduce.workspace_failed",
        f"Failed to initialize FlashInfer allreduce fusion workspace with "
        f"backend={last_backend} ({reason}); allreduce fusion is disabled and startup "
        "continues without it. Make every rank able to create a workspace (mnnvl needs "
        "NVSwitch multicast, trtllm a single node) or choose a backend that works here.",
        step=event.step,
        args=(last_backend, reason),
        seqs=[seq for _b, _r, seq in attempts],
    )


def _quant_workspace(context: MessageContext, memory: _Memory, started: StepStarted | None) -> None:
    # A propagating failure (StepFailed) is a step.failed; a cancelled one is
    # part of a run that stopped for another reason.
    event = context.event
    if not isinstance(event, StepUnavailable | StepTimedOut | StepCrashed):
        return
    plain = [backend for backend, reason, _seq in memory.attempts if reason is None]
    backend = _attribute(started, "backend", plain[-1] if plain else "unknown")
    reason = reason_of(event)
    context.emit(
        "allreduce.quant_workspace_failed",
        f"Failed to initialize FlashInfer allreduce quantization fusion workspace with "
        f"backend={backend} ({reason}); quantization fusion is disabled and startup "
        f"continues with the plain allreduce fusion on backend={backend}. Fix what stopped "
        "the workspace from being created, or turn quantization fusion off in the engine "
        "configuration.",
        step=event.step,
        args=(backend, reason),
        exception=cause_of(event),
    )
