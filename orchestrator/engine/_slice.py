"""The reference engine as one slice of the generic kernel: its rank state,
report columns, agreements and messages. ``events.replay(log,
slices=[ENGINE])`` replays an engine run; its states are :class:`EngineState`.

Pure: imports only ``events`` (and attrs) and the engine's other pure modules
(:mod:`._conventions`, :mod:`._messages`), so replaying an engine log never
imports the runtime, anyio or torch.

The engine's facts per rank, from the events its graph writes::

    platform ok                 platform (plugin), platform_class
    attention ok                attention_backend
    flashinfer_comm ok|other    flashinfer_comm_available, flashinfer_comm (what it was:
                                "available", "not installed", "unavailable (reason)")
    allreduce_workspace ok      fusion_enabled, allreduce_backend, allreduce_settled,
                                fusion_lost (off for any reason but one that does not
                                apply: tensor parallel size 1, several nodes without MNNVL)
    decision allreduce.agreed   allreduce_backend (what every rank uses)

Ranks must agree on the all-reduce backend (``allreduce.divergence``, ERROR:
divergent backends hang collectives, compared among ranks whose all-reduce
step ended ok), the platform class (``platform.divergence``, ERROR) and the
attention backend (``attention.divergence``, WARNING); and they should
agree on ``flashinfer.comm`` (``flashinfer_comm.divergence``, WARNING): a
rank without it keeps every rank from building a fusion workspace, so in a
degraded start this names the ranks where the loss began. A ready start
that is degraded names the ranks that lost the all-reduce fusion first.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from events import (
    Agreement,
    Collective,
    Column,
    DecisionMade,
    Event,
    JsonValue,
    Loss,
    RankState,
    Slice,
    StepSucceeded,
    StepUnavailable,
)

from ._conventions import (
    ALLREDUCE_STEP,
    ALLREDUCE_TP1_REASON,
    ALLREDUCE_UNSUPPORTED_REASON,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    PROCESS_GROUP_STEP,
)
from ._messages import ENGINE_RULES, SEVERITIES, EngineMessageHook, _field, _text

__all__ = ["ENGINE", "EngineState"]


@attrs.frozen(kw_only=True)
class EngineState(RankState):
    """What one rank's engine startup derived: a :class:`events.RankState`
    with typed views of the engine's facts.

    Attributes (views of ``facts``):
        platform: the platform plugin that won, or ``None``.
        platform_class: its platform class (``CudaPlatform``), or ``None``.
        attention_backend: the selected attention backend, or ``None``.
        allreduce_backend: the all-reduce backend this rank uses (the agreed
            one when ranks agreed), or ``None`` when fusion is off.
        fusion_enabled: whether the all-reduce fusion workspace is usable.
        flashinfer_comm_available: whether ``flashinfer.comm`` is usable;
            ``None`` when that step never ended.
        allreduce_settled: the all-reduce step ended ok (so its backend is
            a decision to compare across ranks).
    """

    @property
    def platform(self) -> str | None:
        return _text(self.facts.get("platform"))

    @property
    def platform_class(self) -> str | None:
        return _text(self.facts.get("platform_class"))

    @property
    def attention_backend(self) -> str | None:
        return _text(self.facts.get("attention_backend"))

    @property
    def allreduce_backend(self) -> str | None:
        return _text(self.facts.get("allreduce_backend"))

    @property
    def fusion_enabled(self) -> bool:
        return self.facts.get("fusion_enabled") is True

    @property
    def flashinfer_comm_available(self) -> bool | None:
        value = self.facts.get("flashinfer_comm_available")
        return value if isinstance(value, bool) else None

    @property
    def allreduce_settled(self) -> bool:
        return self.facts.get("allreduce_settled") is True


def _engine_facts(facts: Mapping[str, JsonValue], event: Event) -> Mapping[str, JsonValue] | None:
    """The engine facts a terminal step event or a decision settles."""
    step = event.step
    if isinstance(event, DecisionMade):
        if event.name == "allreduce.agreed":
            return {"allreduce_backend": _text(event.value)}
        return None
    ok = isinstance(event, StepSucceeded)
    result: JsonValue = event.result if isinstance(event, StepSucceeded) else None
    if step == PLATFORM_STEP and ok:
        return {
            "platform": _text(_field(result, "plugin")),
            "platform_class": _text(_field(result, "platform_class")),
        }
    if step == ATTENTION_STEP and ok:
        return {"attention_backend": _text(_field(result, "backend"))}
    if step == FLASHINFER_COMM_STEP:
        available = ok and _field(result, "available") is not False
        return {
            "flashinfer_comm_available": available,
            "flashinfer_comm": _flashinfer_comm(event, available),
        }
    if step == ALLREDUCE_STEP:
        if not ok:
            return {"fusion_enabled": False, "allreduce_backend": None, "fusion_lost": True}
        enabled = _field(result, "enabled") is True
        backend = _text(_field(result, "backend")) if enabled else None
        return {
            "fusion_enabled": enabled,
            "allreduce_backend": backend,
            "allreduce_settled": True,
            "fusion_lost": not enabled and _field(result, "reason") not in _NOT_LOST,
        }
    return None


#: Why the fusion may be off without anything lost: it does not apply to
#: this launch (tensor parallel size 1; several nodes without MNNVL).
_NOT_LOST = (ALLREDUCE_TP1_REASON, ALLREDUCE_UNSUPPORTED_REASON)


def _flashinfer_comm(event: Event, available: bool) -> str | None:
    """What ``flashinfer.comm`` was on this rank, as compared across ranks."""
    if available:
        return "available"
    if isinstance(event, StepUnavailable):
        if event.outcome == "absent":
            return "not installed"
        reason = event.reasons[0] if event.reasons else "no reason recorded"
        return f"unavailable ({reason})"
    return None


#: The reference engine, as a slice of the kernel.
ENGINE = Slice(
    name="engine",
    steps=(
        PLATFORM_STEP,
        f"{PLATFORM_STEP}/*",
        ATTENTION_STEP,
        f"{ATTENTION_STEP}/*",
        FLASHINFER_COMM_STEP,
        ALLREDUCE_STEP,
        f"{ALLREDUCE_STEP}/*",
    ),
    rules=ENGINE_RULES,
    severities=SEVERITIES,
    facts={
        "platform": None,
        "platform_class": None,
        "attention_backend": None,
        "allreduce_backend": None,
        "fusion_enabled": False,
        "flashinfer_comm_available": None,
        "flashinfer_comm": None,
        "allreduce_settled": False,
        "fusion_lost": False,
    },
    report_facts=(
        "platform",
        "platform_class",
        "attention_backend",
        "allreduce_backend",
        "fusion_enabled",
        "flashinfer_comm_available",
    ),
    columns=(
        Column(title="PLATFORM", fact="platform"),
        Column(title="CLASS", fact="platform_class"),
        Column(title="ATTENTION", fact="attention_backend"),
        Column(title="ALLREDUCE", fact="allreduce_backend"),
        Column(title="FUSION", fact="fusion_enabled", labels={True: "on", False: "off"}),
    ),
    agreements=(
        Agreement(
            code="allreduce.divergence",
            fact="allreduce_backend",
            what="Ranks disagree on the allreduce fusion backend",
            advice="collectives hang when ranks use different backends; let the ranks agree "
            "through a process group (torch.distributed) or configure one backend that works "
            "on every rank.",
            among="allreduce_settled",
            none_text="disabled",
        ),
        Agreement(
            code="platform.divergence",
            fact="platform_class",
            what="Ranks run on different platforms",
            advice="one launch needs the same platform on every rank; check the platform "
            "messages of the ranks that differ.",
        ),
        Agreement(
            code="attention.divergence",
            fact="attention_backend",
            what="Ranks selected different attention backends",
            advice="outputs and speed may differ between ranks; name one attention backend "
            "that works on every rank.",
        ),
        Agreement(
            code="flashinfer_comm.divergence",
            fact="flashinfer_comm",
            what="Ranks differ in flashinfer.comm",
            advice="all-reduce fusion needs it on every rank; install the same flashinfer "
            "everywhere and make it importable on the ranks where it is not.",
        ),
    ),
    losses=(Loss(fact="fusion_lost", what="all-reduce fusion off"),),
    # A rank without torch.distributed decides alone; its peers wait for it
    # at the rendezvous and fail there, long after.
    collectives=(Collective(step=PROCESS_GROUP_STEP, what="the process group"),),
    # A rank stalled in a rendezvous or collective (torch.distributed, or
    # vLLM's own exchanges between workers), or waiting for a process it
    # started (vLLM's engine core for its workers, its main process for the
    # engine core over zmq), waits for another process stuck elsewhere.
    peer_waits=("*/torch/distributed/*", "*/vllm/distributed/*", "*/vllm/v1/executor/*", "*/zmq/*"),
    derive_facts=_engine_facts,
    messages=EngineMessageHook(),
    state_type=EngineState,
)
