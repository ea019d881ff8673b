"""A real engine's start, recorded in every one of its processes.

``pip install startup-orchestrator`` beside vLLM installs a
``vllm.general_plugins`` entry point, :func:`vllm_plugin`, which vLLM loads
in each of its processes. With ``STARTUP_ORCHESTRATOR_RUNS=DIR`` set, each
process records its start in one run directory per launch,
``DIR/<run-id>/``, which ``startup-orchestrator replay`` (and every other
view) reads as any run: the root cause first, across processes. Without the
variable, the plugin returns at once. What is recorded, and the vLLM
functions it wraps: :mod:`orchestrator.recording._vllm`; how a process the
engine's code drives becomes a run: :class:`Recording`.

Names load on first use, so loading the entry point imports nothing more.
"""

import typing

from events._surface import Surface as _Surface

# Every public name is declared once, here (see events/_surface.py).
if typing.TYPE_CHECKING:
    from ._plugin import RUNS_VARIABLE as RUNS_VARIABLE
    from ._plugin import vllm_plugin as vllm_plugin
    from ._recorder import PROCESSES_STEP as PROCESSES_STEP
    from ._recorder import STARTUP_STEP as STARTUP_STEP
    from ._recorder import ExitedBeforeReady as ExitedBeforeReady
    from ._recorder import Recording as Recording
    from ._vllm import HOOKS as HOOKS
    from ._vllm import TESTED_RELEASES as TESTED_RELEASES
    from ._vllm import Hook as Hook

_SURFACE = _Surface(globals())
