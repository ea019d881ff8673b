"""Ray, as an engine uses it: one orchestrator per Ray actor.

The engine's workers are Ray actors; each runs one rank's
:class:`~orchestrator.Startup`, the ranks agree over a torch.distributed
(gloo) group as an engine's Ray workers do, and the driver gathers every
rank's log into its own run directory (no shared filesystem needed) with a
manifest that names any actor that died or never answered::

    import ray
    from orchestrator.ray import launch_on_ray

    ray.init()
    launch = launch_on_ray(4, profile="h200x8", faults=["2:flash_attn=RuntimeError:bad"])
    print(launch.ready, launch.run_dir)  # startup-orchestrator replay <run_dir>

An engine that already has its own worker actors numbers them with
:func:`rank_identities` (from the nodes they landed on), calls
:func:`run_assigned_rank` from one of their methods with a
:class:`RankAssignment` and sends the :class:`RankReport` back.

Importing this package does not import Ray; :func:`launch_on_ray` needs it
(``pip install 'startup-orchestrator[torch,ray]'``) and raises
:class:`RayLaunchError` saying so when it is missing.
"""

from __future__ import annotations

from ._actor import ActorPlace as ActorPlace
from ._actor import RankActor as RankActor
from ._actor import RankAssignment as RankAssignment
from ._actor import RankReport as RankReport
from ._actor import run_assigned_rank as run_assigned_rank
from ._launch import RayLaunch as RayLaunch
from ._launch import RayLaunchError as RayLaunchError
from ._launch import RayRank as RayRank
from ._launch import launch_on_ray as launch_on_ray
from ._launch import rank_identities as rank_identities

__all__ = [
    "ActorPlace",
    "RankActor",
    "RankAssignment",
    "RankReport",
    "RayLaunch",
    "RayLaunchError",
    "RayRank",
    "launch_on_ray",
    "rank_identities",
    "run_assigned_rank",
]
