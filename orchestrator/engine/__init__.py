"""The reference engine startup graph: platform (with zentorch), attention
backends, the optional ``flashinfer.comm`` module and the all-reduce fusion
workspace, on the real host or a simulated one."""

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
from ._flashinfer_comm import FLASHINFER_COMM_SYMBOLS as FLASHINFER_COMM_SYMBOLS
from ._flashinfer_comm import make_flashinfer_comm_step as make_flashinfer_comm_step
from ._graph import ENGINE_DECIDERS as ENGINE_DECIDERS
from ._graph import build_engine_graph as build_engine_graph
from ._host import GpuDevice as GpuDevice
from ._host import HostFacts as HostFacts
from ._host import RealHost as RealHost
from ._host import is_amd_zen as is_amd_zen
from ._platform import BUILTIN_PLATFORM_PLUGINS as BUILTIN_PLATFORM_PLUGINS
from ._platform import PLATFORM_PLUGIN_GROUP as PLATFORM_PLUGIN_GROUP
from ._platform import PlatformPlugin as PlatformPlugin
from ._platform import decide_platform as decide_platform
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
from ._run import prepare_engine as prepare_engine
from ._run import run_engine as run_engine
from ._targets import InjectionTargets as InjectionTargets
from ._targets import injection_targets as injection_targets

__all__ = [
    "ATTENTION_BACKENDS",
    "BUILTIN_PLATFORM_PLUGINS",
    "BUILTIN_PROFILES",
    "ENGINE_DECIDERS",
    "FLASHINFER_COMM_SYMBOLS",
    "PLATFORM_PLUGIN_GROUP",
    "AllreduceBackend",
    "AttentionBackend",
    "CpuFacts",
    "EngineConfig",
    "EngineConfigError",
    "GpuDevice",
    "GpuFacts",
    "HostFacts",
    "InjectionTargets",
    "ModuleAction",
    "ModuleRule",
    "PlatformConflictError",
    "PlatformPlugin",
    "Profile",
    "ProfileError",
    "RealHost",
    "RealWorkspaceFactory",
    "SimulatedHost",
    "SimulatedImporter",
    "SimulatedWorkspace",
    "SimulatedWorkspaceFactory",
    "UnspecifiedPlatformError",
    "WorkspaceFactory",
    "WorkspaceHost",
    "allreduce_chain",
    "attention_candidates",
    "build_engine_graph",
    "decide_platform",
    "injection_targets",
    "is_amd_zen",
    "load_profile",
    "make_allreduce_step",
    "make_attention_step",
    "make_flashinfer_comm_step",
    "make_platform_step",
    "prepare_engine",
    "run_engine",
]
