"""The ``flashinfer_comm`` step: is the optional ``flashinfer.comm`` usable
(SPEC §3.3)?

Only when the ``flashinfer`` package is findable is ``flashinfer.comm``
imported, under a policy that records **any** ``Exception`` (a broken
optional module disables the all-reduce fusion; startup goes on).
BaseExceptions still propagate. Both fusion entry points must be present.
"""

from __future__ import annotations

from events import JsonValue, Outcome

from .._context import StepContext, Unavailable
from .._graph import Step
from .._policy import ANY_EXCEPTION_POLICY
from ._config import EngineConfig
from ._conventions import FLASHINFER_COMM_STEP, PLATFORM_STEP

__all__ = ["FLASHINFER_COMM_SYMBOLS", "make_flashinfer_comm_step"]

#: What the all-reduce fusion needs from ``flashinfer.comm``.
FLASHINFER_COMM_SYMBOLS = ("allreduce_fusion", "create_allreduce_fusion_workspace")

#: Platform devices flashinfer does not run on (a third-party platform, whose
#: device is unknown, is probed).
_NOT_FLASHINFER_DEVICES = frozenset({"cpu", "rocm", "tpu", "xpu"})


def probe_flashinfer_comm(ctx: StepContext) -> JsonValue | Unavailable:
    """Body of the ``flashinfer_comm`` step (blocking)."""
    platform = ctx.result(PLATFORM_STEP)
    if isinstance(platform, dict) and platform.get("device") in _NOT_FLASHINFER_DEVICES:
        return Unavailable(
            outcome=Outcome.ABSENT,
            reasons=(f"flashinfer does not run on {platform.get('platform_class')}",),
        )
    if ctx.find_spec("flashinfer") is None:
        return Unavailable(outcome=Outcome.ABSENT, reasons=("flashinfer is not installed",))
    comm = ctx.import_module("flashinfer.comm")
    missing = [name for name in FLASHINFER_COMM_SYMBOLS if not callable(getattr(comm, name, None))]
    if missing:
        return Unavailable(reasons=tuple(f"flashinfer.comm has no {name}" for name in missing))
    return {"available": True}


def make_flashinfer_comm_step(config: EngineConfig) -> Step:
    """The ``flashinfer_comm`` step (depends on ``platform``): ``ok``
    ``{"available": true}``, ``absent`` (flashinfer not installed, or a
    platform it does not run on) or ``unavailable`` (the import failed, with
    the cause; or a fusion entry point is missing, named in the reason)."""
    return Step(
        name=FLASHINFER_COMM_STEP,
        body=probe_flashinfer_comm,
        depends_on=(PLATFORM_STEP,),
        policy=ANY_EXCEPTION_POLICY,
        timeout=config.step_timeout,
    )
