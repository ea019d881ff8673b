"""Where this process sits in the launch: rank identity and run id.

The launcher environment follows torchrun's conventions (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``); every
value can be overridden in code. A process started without them is rank 0 of
a world of 1.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from collections.abc import Mapping

from events import RankIdentity

from ._errors import RankEnvironmentError

__all__ = ["RUN_ID_VARIABLE", "identity_from_environment", "new_run_id", "run_id_from_environment"]

#: Set by our own launcher; takes precedence over torchrun's run id.
RUN_ID_VARIABLE = "STARTUP_ORCHESTRATOR_RUN_ID"

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _int(env: Mapping[str, str], name: str, default: int, override: int | None) -> int:
    if override is not None:
        value: object = override
        if type(override) is not int:
            raise RankEnvironmentError(name, override, "must be an integer")
        number = override
    else:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            return default
        value = raw
        try:
            number = int(raw.strip())
        except ValueError:
            raise RankEnvironmentError(name, raw, "must be a non-negative integer") from None
    if number < 0:
        raise RankEnvironmentError(name, value, "must be a non-negative integer")
    return number


def identity_from_environment(
    environ: Mapping[str, str] | None = None,
    *,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    local_world_size: int | None = None,
    node_rank: int | None = None,
) -> RankIdentity:
    """Read the rank identity from torchrun-style variables (``os.environ`` by
    default); keyword arguments override single values.

    Defaults: rank and local rank 0, world size 1, local world size = world
    size, local rank = rank % local world size, node rank = rank // local
    world size.

    Raises:
        RankEnvironmentError: a value is not a non-negative integer, a size is
            0, or a rank is not below its size.
    """
    env = os.environ if environ is None else environ
    the_rank = _int(env, "RANK", 0, rank)
    the_world = _int(env, "WORLD_SIZE", 1, world_size)
    the_local_world = _int(env, "LOCAL_WORLD_SIZE", the_world, local_world_size)
    if the_world == 0:
        raise RankEnvironmentError("WORLD_SIZE", the_world, "must be at least 1")
    if the_local_world == 0:
        raise RankEnvironmentError("LOCAL_WORLD_SIZE", the_local_world, "must be at least 1")
    if the_rank >= the_world:
        raise RankEnvironmentError(
            "RANK", the_rank, f"must be below WORLD_SIZE={the_world} (ranks are 0-based)"
        )
    if the_local_world > the_world:
        raise RankEnvironmentError(
            "LOCAL_WORLD_SIZE", the_local_world, f"cannot exceed WORLD_SIZE={the_world}"
        )
    the_local_rank = _int(env, "LOCAL_RANK", the_rank % the_local_world, local_rank)
    if the_local_rank >= the_local_world:
        raise RankEnvironmentError(
            "LOCAL_RANK",
            the_local_rank,
            f"must be below LOCAL_WORLD_SIZE={the_local_world} (local ranks are 0-based)",
        )
    nodes = -(-the_world // the_local_world)
    the_node = _int(env, "GROUP_RANK", the_rank // the_local_world, node_rank)
    if the_node >= nodes:
        raise RankEnvironmentError(
            "GROUP_RANK",
            the_node,
            f"must be below the node count {nodes} (WORLD_SIZE / LOCAL_WORLD_SIZE)",
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
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


def run_id_from_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """The launch's run id shared by every rank: ``STARTUP_ORCHESTRATOR_RUN_ID``,
    else torchrun's ``TORCHELASTIC_RUN_ID`` (unless it is torchrun's default
    ``none``), else ``None`` (the caller makes one).

    Raises:
        RankEnvironmentError: the id is not 1-128 characters of letters,
            digits, ``.``, ``_`` and ``-`` (it names a directory).
    """
    env = os.environ if environ is None else environ
    for name in (RUN_ID_VARIABLE, "TORCHELASTIC_RUN_ID"):
        value = env.get(name, "").strip()
        if not value or (name == "TORCHELASTIC_RUN_ID" and value == "none"):
            continue
        if not _RUN_ID.match(value):
            raise RankEnvironmentError(
                name, value, "a run id is 1-128 letters, digits, '.', '_' or '-'"
            )
        return value
    return None
