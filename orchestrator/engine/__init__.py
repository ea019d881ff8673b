"""The reference engine startup graph: platform (with zentorch), attention
backends, the optional ``flashinfer.comm`` module and the all-reduce fusion
workspace, on the real host or a simulated one."""

from ._config import AllreduceBackend as AllreduceBackend
from ._config import EngineConfig as EngineConfig
from ._config import EngineConfigError as EngineConfigError
from ._config import PlatformConflictError as PlatformConflictError
from ._config import ProfileError as ProfileError
from ._config import UnspecifiedPlatformError as UnspecifiedPlatformError

__all__ = [
    "AllreduceBackend",
    "EngineConfig",
    "EngineConfigError",
    "PlatformConflictError",
    "ProfileError",
    "UnspecifiedPlatformError",
]
