"""The reference engine startup graph: platform (with zentorch), attention
backends, the optional ``flashinfer.comm`` module and the all-reduce fusion
workspace, on the real host or a simulated one; and the engine as one slice of
the generic kernel (:data:`ENGINE`): its step names, rank state, message rules
and report columns, in pure modules that import only ``events``.

Run one rank's engine startup with :func:`prepare_engine` and replay its
log with ``events.replay(events, slices=[ENGINE])``. Names load on
first use, so replaying a log imports neither the runtime, anyio nor torch.
"""

import typing

from events._surface import Surface as _Surface

# Every public name is declared once, here (see events/_surface.py).
if typing.TYPE_CHECKING:
    from ._allreduce import RealWorkspaceFactory as RealWorkspaceFactory
    from ._allreduce import SimulatedWorkspace as SimulatedWorkspace
    from ._allreduce import SimulatedWorkspaceFactory as SimulatedWorkspaceFactory
    from ._allreduce import WorkspaceFactory as WorkspaceFactory
    from ._allreduce import WorkspaceHost as WorkspaceHost
    from ._allreduce import allreduce_chain as allreduce_chain
    from ._allreduce import make_allreduce_step as make_allreduce_step
    from ._attention import ATTENTION_BACKENDS as ATTENTION_BACKENDS
    from ._attention import AttentionBackend as AttentionBackend
    from ._attention import attention_candidates as attention_candidates
    from ._attention import make_attention_step as make_attention_step
    from ._config import AllreduceBackend as AllreduceBackend
    from ._config import EngineConfig as EngineConfig
    from ._config import EngineConfigError as EngineConfigError
    from ._config import PlatformConflictError as PlatformConflictError
    from ._config import ProfileError as ProfileError
    from ._config import UnspecifiedPlatformError as UnspecifiedPlatformError
    from ._conventions import ALLREDUCE_AGREE_STEP as ALLREDUCE_AGREE_STEP
    from ._conventions import ALLREDUCE_QUANT_STEP as ALLREDUCE_QUANT_STEP
    from ._conventions import ALLREDUCE_STEP as ALLREDUCE_STEP
    from ._conventions import ATTENTION_STEP as ATTENTION_STEP
    from ._conventions import ENGINE_SLICE as ENGINE_SLICE
    from ._conventions import FLASHINFER_COMM_STEP as FLASHINFER_COMM_STEP
    from ._conventions import PLATFORM_BUILD_STEP as PLATFORM_BUILD_STEP
    from ._conventions import PLATFORM_STEP as PLATFORM_STEP
    from ._conventions import ZENTORCH_STEP as ZENTORCH_STEP
    from ._flashinfer_comm import FLASHINFER_COMM_SYMBOLS as FLASHINFER_COMM_SYMBOLS
    from ._flashinfer_comm import make_flashinfer_comm_step as make_flashinfer_comm_step
    from ._graph import build_engine_graph as build_engine_graph
    from ._host import BuildTarget as BuildTarget
    from ._host import Devices as Devices
    from ._host import GpuDevice as GpuDevice
    from ._host import HostFacts as HostFacts
    from ._host import RealHost as RealHost
    from ._host import is_amd_zen as is_amd_zen
    from ._messages import ENGINE_RULES as ENGINE_RULES
    from ._platform import BUILTIN_PLATFORM_PLUGINS as BUILTIN_PLATFORM_PLUGINS
    from ._platform import PLATFORM_PLUGIN_GROUP as PLATFORM_PLUGIN_GROUP
    from ._platform import PlatformPlugin as PlatformPlugin
    from ._platform import decline as decline
    from ._platform import make_platform_step as make_platform_step
    from ._profiles import BUILTIN_PROFILES as BUILTIN_PROFILES
    from ._profiles import CpuFacts as CpuFacts
    from ._profiles import GpuFacts as GpuFacts
    from ._profiles import ModuleAction as ModuleAction
    from ._profiles import ModuleRule as ModuleRule
    from ._profiles import Profile as Profile
    from ._profiles import SimulatedHost as SimulatedHost
    from ._profiles import SimulatedImporter as SimulatedImporter
    from ._profiles import load_profile as load_profile
    from ._resolution import ENGINE_DECIDERS as ENGINE_DECIDERS
    from ._resolution import decide_platform as decide_platform
    from ._run import prepare_engine as prepare_engine
    from ._slice import ENGINE as ENGINE
    from ._slice import EngineState as EngineState
    from ._targets import InjectionTargets as InjectionTargets
    from ._targets import injection_targets as injection_targets

_SURFACE = _Surface(globals())
