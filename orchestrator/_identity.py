"""Where this process sits in the launch: rank identity and run id.

Three launcher conventions are read, the first one present wins:

* torchrun (and our own launcher): ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``;
* SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``,
  ``SLURM_NODEID``, and this node's tasks from ``SLURM_TASKS_PER_NODE``
  (what each node runs), else ``SLURM_NTASKS_PER_NODE``;
* Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``. Open MPI
  names no node index (its ``OMPI_COMM_WORLD_NODE_RANK`` is the process's
  rank among all jobs' processes on its node, not the node's number), so the
  node rank is rank // local size, as ``mpirun``'s default placement by slot
  lays ranks out.

Every value can be overridden in code. A process started under none of them
is rank 0 of a world of 1. The run id every rank of a launch shares comes
from the environment too (:func:`run_id_from_environment`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping

from events import MAX_WORLD_SIZE, RankIdentity

from ._errors import RankEnvironmentError

__all__ = [
    "RUN_ID_VARIABLE",
    "checked_run_id",
    "identity_from_environment",
    "launcher_convention",
    "new_run_id",
    "restarted",
    "run_id_from_environment",
    "torchrun_restart_count",
]

#: Set by our own launcher; takes precedence over torchrun's run id.
RUN_ID_VARIABLE = "STARTUP_ORCHESTRATOR_RUN_ID"

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _int(env: Mapping[str, str], name: str, default: int, override: int | None) -> int:
    value: object = override
    if override is None:
        value = raw = env.get(name, "")
        if not raw.strip():
            return default
        try:
            override = int(raw)  # int() drops surrounding blanks itself
        except ValueError:
            raise RankEnvironmentError(name, raw, "must be a non-negative integer") from None
    elif type(override) is not int:
        raise RankEnvironmentError(name, override, "must be an integer")
    if override < 0:
        raise RankEnvironmentError(name, value, "must be a non-negative integer")
    return override


#: The variables of each launcher convention, in the order of
#: :class:`RankIdentity`'s fields: rank, local rank, world size, local world
#: size, node rank (``None``: the launcher names none; derived).
_CONVENTIONS: dict[str, tuple[str, str, str, str, str | None]] = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"),
    "SLURM": (
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "SLURM_NTASKS",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NODEID",
    ),
    "Open MPI": (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        None,
    ),
}


def launcher_convention(environ: Mapping[str, str] | None = None) -> str | None:
    """Which launcher's variables describe this process: ``"torchrun"``,
    ``"SLURM"``, ``"Open MPI"``, or ``None`` when none is set."""
    env = os.environ if environ is None else environ
    for name, variables in _CONVENTIONS.items():
        if any(env.get(variable, "").strip() for variable in (variables[0], variables[2])):
            return name
    return None


def _slurm_tasks_per_node(env: Mapping[str, str]) -> tuple[dict[str, str], int]:
    """This node's count in ``SLURM_TASKS_PER_NODE`` (``"4(x2)"``, ``"4,4"``,
    ``"2(x3),1"``), as ``SLURM_NTASKS_PER_NODE``, and how many nodes it
    lists (0: none). The layout says what each node runs; a
    ``SLURM_NTASKS_PER_NODE`` set by ``--ntasks-per-node`` is only the most
    a node may run (``--ntasks=3 --ntasks-per-node=4`` runs 3), and is read
    only where the layout names no count for this node."""
    node = env.get("SLURM_NODEID", "").strip()
    index = int(node) if node.isdecimal() else 0
    tasks: dict[str, str] = {}
    nodes = 0
    for count, repeat in re.findall(r"(\d+)(?:\(x(\d+)\))?", env.get("SLURM_TASKS_PER_NODE", "")):
        nodes += int(repeat or 1)
        if index < nodes and not tasks:
            tasks = {"SLURM_NTASKS_PER_NODE": count}
    return tasks, nodes


def identity_from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    local_world_size: int | None = None,
    node_rank: int | None = None,
) -> RankIdentity:
    """Read the rank identity from the launcher's variables (``os.environ``
    by default; see the module documentation); keyword arguments override
    single values.

    Defaults: rank and local rank 0, world size 1, local world size = world
    size, local rank = rank % local world size, node rank = rank // local
    world size.

    Raises:
        RankEnvironmentError: a value is not a non-negative integer, a size is
            0, a world is larger than :data:`events.MAX_WORLD_SIZE`, or a rank
            is not below its size (the error names the variable).
    """
    env = os.environ if environ is None else environ
    convention = launcher_convention(env)
    names = _CONVENTIONS[convention or "torchrun"]
    listed_nodes = 0
    if convention == "SLURM":
        tasks, listed_nodes = _slurm_tasks_per_node(env)
        env = {**env, **tasks}
    rank_name, local_rank_name, world_name, local_world_name, node_name = names
    the_rank = _int(env, rank_name, 0, rank)
    the_world = _int(env, world_name, 1, world_size)
    the_local_world = _int(env, local_world_name, the_world, local_world_size)
    if the_world == 0:
        raise RankEnvironmentError(world_name, the_world, "must be at least 1")
    if the_world > MAX_WORLD_SIZE:
        raise RankEnvironmentError(world_name, the_world, f"must be at most {MAX_WORLD_SIZE:,}")
    if the_local_world == 0:
        raise RankEnvironmentError(local_world_name, the_local_world, "must be at least 1")
    if the_rank >= the_world:
        raise RankEnvironmentError(
            rank_name, the_rank, f"must be below {world_name}={the_world} (ranks are 0-based)"
        )
    if the_local_world > the_world:
        raise RankEnvironmentError(
            local_world_name, the_local_world, f"cannot exceed {world_name}={the_world}"
        )
    the_local_rank = _int(env, local_rank_name, the_rank % the_local_world, local_rank)
    if the_local_rank >= the_local_world:
        raise RankEnvironmentError(
            local_rank_name,
            the_local_rank,
            f"must be below {local_world_name}={the_local_world} (local ranks are 0-based)",
        )
    nodes = max(-(-the_world // the_local_world), listed_nodes)
    node_name = node_name or "node_rank"
    the_node = _int(env, node_name, the_rank // the_local_world, node_rank)
    if the_node >= nodes:
        raise RankEnvironmentError(
            node_name,
            the_node,
            f"must be below the node count {nodes} ({world_name} / {local_world_name})",
        )
    return RankIdentity(
        rank=the_rank,
        local_rank=the_local_rank,
        world_size=the_world,
        local_world_size=the_local_world,
        node_rank=the_node,
    )


def new_run_id() -> str:
    """A fresh run id: sortable by time, unique (``20261129T083704-1a2b3c``)."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + os.urandom(3).hex()


def torchrun_restart_count(environ: Mapping[str, str] | None = None) -> int:
    """How many times this node's torchrun agent restarted its worker group
    after a failure (``TORCHELASTIC_RESTART_COUNT``; 0 when unset). Each
    agent counts its own: a node whose workers were healthy restarts them
    when a failed node rejoins, without counting it.

    Raises:
        RankEnvironmentError: the count is not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    return _int(env, "TORCHELASTIC_RESTART_COUNT", 0, None)


def restarted(name: str, restarts: int) -> str:
    """``name`` (a run id or run directory) for a worker group restarted
    ``restarts`` times: ``<name>-restart-N``, or ``name`` for none."""
    return f"{name}-restart-{restarts}" if restarts else name


def run_id_from_environment(
    environ: Mapping[str, str] | None = None, *, restarts: int | None = None
) -> str | None:
    """The launch's run id, the same on every rank, from what the launcher
    set: ``STARTUP_ORCHESTRATOR_RUN_ID``; else torchrun's
    ``TORCHELASTIC_RUN_ID`` (unless it is torchrun's default ``none``), with
    ``-restart-N`` when the worker group was restarted N > 0 times (a
    restarted worker group is a new run in a new directory; ``restarts``
    overrides this node's :func:`torchrun_restart_count`); else SLURM's
    ``slurm-<SLURM_JOB_ID>-<SLURM_STEP_ID>``; else Open MPI's job
    (``ompi-<PMIX_NAMESPACE or OMPI_MCA_ess_base_jobid>``); else ``None``
    (the caller makes one, or agrees on one over the process group).

    Raises:
        RankEnvironmentError: the id is not 1-128 characters of letters,
            digits, ``.``, ``_`` and ``-`` (it names a directory).
    """
    env = os.environ if environ is None else environ
    ours = env.get(RUN_ID_VARIABLE, "").strip()
    if ours:
        return checked_run_id(ours, RUN_ID_VARIABLE)
    elastic = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":
        checked = checked_run_id(elastic, "TORCHELASTIC_RUN_ID")
        count = torchrun_restart_count(env) if restarts is None else restarts
        return checked_run_id(restarted(checked, count), "TORCHELASTIC_RUN_ID")
    job = env.get("SLURM_JOB_ID", "").strip()
    if job and env.get("SLURM_PROCID", "").strip():
        step = env.get("SLURM_STEP_ID", "").strip() or "0"
        return checked_run_id(f"slurm-{job}-{step}", "SLURM_JOB_ID")
    for name in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"):
        value = env.get(name, "").strip()
        if value and env.get("OMPI_COMM_WORLD_RANK", "").strip():
            # Namespaces look like "prterun-host-1234@1": keep what names a
            # directory.
            return checked_run_id(
                "ompi-" + re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-"), name
            )
    return None


def checked_run_id(value: str, name: str = "run_id") -> str:
    """``value`` as a run id (surrounding blanks dropped), which names the
    run's directory.

    Raises:
        RankEnvironmentError: it is not 1-128 letters, digits, ``.``, ``_``
            and ``-`` (``name`` says where it came from).
    """
    stripped = value.strip()
    if not _RUN_ID.match(stripped):
        raise RankEnvironmentError(
            name, value, "a run id is 1-128 letters, digits, '.', '_' or '-'"
        )
    return stripped
