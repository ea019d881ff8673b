"""Cross-rank agreement: a tiny process-group interface.

Steps that must decide the same thing on every rank (which all-reduce
backend to use, which run id to share) exchange JSON values through a
:class:`Group`: :class:`LocalGroup` for one process,
:class:`TorchDistributedGroup` over ``torch.distributed``. Values always
travel as JSON text, so every implementation hands back plain JSON copies,
never the caller's objects; a failed or timed-out exchange raises
:class:`GroupError`.

A group may also be a :class:`Mailbox`, through which the ranks' logs reach
the launch's rank 0 at the end of a multi-node run: a post never waits for
the other ranks, so ranks that left the startup's collectives at different
points (one failed early) still deliver.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import os
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import attrs
import orjson

from events import JsonValue, Message, RankIdentity, Severity

from ._errors import OrchestratorError, RankEnvironmentError
from ._graph import Step
from ._policy import PROBE_POLICY, Action

__all__ = [
    "PROCESS_GROUP_STEP",
    "DeferredGroup",
    "Group",
    "GroupError",
    "LocalGroup",
    "Mailbox",
    "TorchDistributedGroup",
    "follows_a_peer",
    "init_torch_distributed_group",
    "process_group_step",
]

#: The name of the set-up step that forms the process group.
PROCESS_GROUP_STEP = "process_group"


class GroupError(OrchestratorError):
    """A collective operation of a :class:`Group` failed or timed out (a peer
    died, never arrived, or the group is not initialised).

    Attributes:
        rank: the rank that saw the failure (``None`` before it is known).
        world_size: the group's size (``None`` before it is known).
        operation: what was attempted (``all_gather``, ``init_process_group``).
        reason: what went wrong (``"RuntimeError: Timed out ..."``).
    """

    def __init__(
        self, rank: int | None, world_size: int | None, operation: str, reason: str
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.operation = operation
        self.reason = reason
        # The text names no rank or address, so the same failure seen by many
        # ranks groups into one message; both are in the fields and the cause.
        super().__init__(f"{operation} across the process group failed: {reason}")


#: How a recorded exception names a GroupError.
GROUP_ERROR_NAME = f"{GroupError.__module__}.{GroupError.__qualname__}"


def follows_a_peer(message: Message) -> bool:
    """Whether ``message`` is an ERROR of a failure in an exchange with the
    peers (a :class:`GroupError` in its cause chain): what this rank saw of
    another rank's failure, said alike by every rank that saw it."""
    exception = message.exception
    return (
        message.severity >= Severity.ERROR
        and exception is not None
        and any(link.type == GROUP_ERROR_NAME for link in exception.chain())
    )


@runtime_checkable
class Group(Protocol):
    """The ranks that must agree, and the one collective they need.

    ``all_gather`` blocks until every rank has called it; every rank calls
    it the same number of times, in the same order. It returns each rank's
    value in rank order (this rank's own value at index :attr:`rank`).

    Raises (from ``all_gather``):
        GroupError: the exchange failed or timed out.
        TypeError: ``value`` is not JSON.
    """

    @property
    def rank(self) -> int:
        """This process's rank in the group (0-based)."""
        ...

    @property
    def world_size(self) -> int:
        """How many ranks the group has."""
        ...

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """Every rank's ``value``, in rank order."""
        ...


@runtime_checkable
class Mailbox(Protocol):
    """An optional capability of a :class:`Group`: bytes left under a key by
    one rank and taken by another, with no collective (neither side waits
    for the other ranks to call anything).

    Raises (from both methods):
        GroupError: the store cannot be reached.
    """

    def post(self, key: str, data: bytes) -> None:
        """Leave ``data`` under ``key`` (replacing what was there)."""
        ...

    def take(self, key: str, timeout_s: float) -> bytes | None:
        """The bytes under ``key``, removed from the store, waiting at most
        ``timeout_s`` seconds for them (``0``: only look); ``None`` when
        nothing was posted by then."""
        ...


def _to_json_text(value: JsonValue) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        raise TypeError(f"a group exchanges JSON values only, not {type(value).__name__}") from exc


class LocalGroup:
    """A single process: rank 0 of a world of 1. ``all_gather(v)`` is ``[v]``
    (a JSON copy of it)."""

    @property
    def rank(self) -> int:
        """Always 0."""
        return 0

    @property
    def world_size(self) -> int:
        """Always 1."""
        return 1

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """``[value]``, copied through JSON like every other group would."""
        return [orjson.loads(_to_json_text(value))]


def _distributed() -> Any:
    # Imported by name so neither importing this module nor type-checking it
    # needs torch; only creating a torch group does.
    return importlib.import_module("torch.distributed")


def _torch() -> Any:
    return importlib.import_module("torch")


class TorchDistributedGroup:
    """A :class:`Group` over an initialised ``torch.distributed`` process group.

    Values travel as UTF-8 JSON in byte tensors (two ``all_gather`` calls:
    the lengths, then the padded bytes). Unlike ``all_gather_object`` this
    needs neither pickle nor numpy.

    Args:
        process_group: the ``torch.distributed`` group (e.g. the
            tensor-parallel subgroup); ``None`` for the default (world) group.
        device: where the exchanged tensors live; default ``cuda`` (the
            current CUDA device, which the caller sets) for nccl, else ``cpu``.
        owned: whether :meth:`close` destroys the default process group
            (set by :func:`init_torch_distributed_group`, which created it).

    Raises:
        ImportError: torch is not installed.
        GroupError: ``torch.distributed`` is not initialised.
    """

    def __init__(
        self,
        process_group: object | None = None,
        *,
        device: str | None = None,
        owned: bool = False,
    ) -> None:
        dist = _distributed()
        if not dist.is_available() or not dist.is_initialized():
            raise GroupError(
                None,
                None,
                "TorchDistributedGroup",
                "torch.distributed is not initialised; call init_torch_distributed_group "
                "or torch.distributed.init_process_group first",
            )
        self._dist = dist
        self._torch = _torch()
        self._group = process_group
        self._rank: int = int(dist.get_rank(group=process_group))
        self._world_size: int = int(dist.get_world_size(group=process_group))
        if device is None:
            device = "cuda" if str(dist.get_backend(process_group)) == "nccl" else "cpu"
        self._device = device
        self._owned = owned

    @property
    def rank(self) -> int:
        """This process's rank in the process group."""
        return self._rank

    @property
    def world_size(self) -> int:
        """The process group's size."""
        return self._world_size

    @property
    def process_group(self) -> object | None:
        """The wrapped ``torch.distributed`` group (``None``: the default one)."""
        return self._group

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        """Every rank's ``value`` in rank order (each exchange is bounded by the
        process group's timeout).

        Raises:
            GroupError: the collective failed or timed out, or a peer sent
                something that is not JSON.
            TypeError: ``value`` is not JSON.
        """
        data = _to_json_text(value).encode()
        try:
            payloads = self._exchange(data)
        except Exception as exc:
            raise self._failed(
                "all_gather",
                "a peer failed, exited, or never reached this exchange "
                "(the transport's error is the cause; look for the rank that failed first)",
            ) from exc
        values: list[JsonValue] = []
        for rank, payload in enumerate(payloads):
            try:
                values.append(orjson.loads(payload))
            except orjson.JSONDecodeError as exc:
                raise self._failed(
                    "all_gather", f"rank {rank} sent something that is not JSON: {exc}"
                ) from exc
        return values

    def _exchange(self, data: bytes) -> list[bytes]:
        torch, dist, device = self._torch, self._dist, self._device
        length = torch.tensor([len(data)], dtype=torch.int64, device=device)
        lengths = [
            torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self._world_size)
        ]
        dist.all_gather(lengths, length, group=self._group)
        sizes = [int(item.item()) for item in lengths]
        buffer = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
        buffer[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        received = [
            torch.empty(max(sizes), dtype=torch.uint8, device=device)
            for _ in range(self._world_size)
        ]
        dist.all_gather(received, buffer, group=self._group)
        return [
            bytes(item[:size].cpu().tolist()) for item, size in zip(received, sizes, strict=True)
        ]

    def post(self, key: str, data: bytes) -> None:
        """:meth:`Mailbox.post` through the process group's store (bounded by
        the store's timeout, the group's)."""
        try:
            self._store().set(key, data)
        except Exception as exc:
            raise self._failed("post", f"{type(exc).__name__}: {exc}") from exc

    def take(self, key: str, timeout_s: float) -> bytes | None:
        """:meth:`Mailbox.take` through the process group's store."""
        try:
            store = self._store()
            if timeout_s > 0:
                # A wait that times out raises; whether the key came is
                # asked once more below.
                with contextlib.suppress(Exception):
                    store.wait([key], datetime.timedelta(seconds=timeout_s))
            if not store.check([key]):
                return None
            data = bytes(store.get(key))
            store.delete_key(key)
        except Exception as exc:
            raise self._failed("take", f"{type(exc).__name__}: {exc}") from exc
        return data

    def _failed(self, operation: str, reason: str) -> GroupError:
        return GroupError(self._rank, self._world_size, operation, reason)

    def _store(self) -> Any:
        c10d = importlib.import_module("torch.distributed.distributed_c10d")
        if self._group is None:
            return c10d._get_default_store()
        return c10d._get_process_group_store(self._group)

    def close(self) -> None:
        """Destroy the default process group if this object created it;
        otherwise do nothing (the caller owns the group)."""
        if self._owned and self._dist.is_initialized():
            self._dist.destroy_process_group()
            self._owned = False


def init_torch_distributed_group(
    identity: RankIdentity, *, timeout_s: float = 300.0
) -> TorchDistributedGroup | None:
    """Initialise ``torch.distributed``'s default gloo process group from the
    launcher environment (``env://``) and wrap it; an already initialised
    one is wrapped as is (and not destroyed by ``close``). ``None`` for a
    world of 1 or without torch. ``timeout_s`` bounds the rendezvous and
    every exchange.

    Raises:
        RankEnvironmentError: ``MASTER_ADDR`` or ``MASTER_PORT`` is not set.
        GroupError: the rendezvous failed or timed out.
    """
    if identity.world_size <= 1:
        return None
    try:
        dist = _distributed()
    except ImportError:
        return None
    if not dist.is_available():
        return None
    if dist.is_initialized():
        return TorchDistributedGroup()
    for variable in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(variable, "").strip():
            raise RankEnvironmentError(
                variable,
                os.environ.get(variable),
                "required to initialise torch.distributed (env:// rendezvous); "
                "launch with torchrun or set it to rank 0's address/port",
            )
    try:
        dist.init_process_group(
            backend="gloo",
            init_method="env://",
            rank=identity.rank,
            world_size=identity.world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get(
            "TORCHELASTIC_MAX_RESTARTS", "0"
        ).strip() not in ("", "0"):
            # torchrun's agent keeps its store from one attempt to the next,
            # so a restarted group can read its last attempt's addresses.
            reason += (
                "; a restarted torchrun worker group may read the last attempt's addresses "
                "from torchrun's shared store (pytorch/pytorch#135712): start torchrun with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
            )
        raise GroupError(identity.rank, identity.world_size, "init_process_group", reason) from exc
    return TorchDistributedGroup(owned=True)


class DeferredGroup:
    """A :class:`Group` whose process group is formed later, by a step of
    the run (:func:`process_group_step`), so that forming it is recorded
    like any other probe. Until then, or when none could be formed, it is
    a world of one: the ranks decide alone.
    """

    def __init__(self, group: Group | None = None) -> None:
        self.group = group

    @property
    def rank(self) -> int:
        return 0 if self.group is None else self.group.rank

    @property
    def world_size(self) -> int:
        return 1 if self.group is None else self.group.world_size

    def all_gather(self, value: JsonValue) -> list[JsonValue]:
        return (LocalGroup() if self.group is None else self.group).all_gather(value)

    def close(self) -> None:
        close = getattr(self.group, "close", None)
        if callable(close):
            close()


def process_group_step(
    identity: RankIdentity,
    into: DeferredGroup,
    *,
    timeout_s: float,
    on_formed: Callable[[Group], None],
    failed: GroupError | None = None,
) -> Step:
    """The ``process_group`` set-up step: form the group
    (:func:`init_torch_distributed_group`), hand it to ``into``, then to
    ``on_formed``.

    torch is imported for real, not through the run's importer: the group
    is real even when the host is simulated (inject a fault on
    ``process_group`` itself to fail it). torch missing is ``unavailable``
    (the ranks then decide alone); a failed rendezvous, or a hang past
    ``timeout_s``, fails the run. ``failed``: the group was tried before
    the run and failed so; the step records that failure.
    """

    def form(_context: object) -> JsonValue:
        if failed is not None:
            raise failed
        group = init_torch_distributed_group(identity, timeout_s=timeout_s)
        if group is None:
            raise ImportError(
                "torch.distributed is not available; the ranks decide alone", name="torch"
            )
        into.group = group
        on_formed(group)
        return {"backend": "gloo", "world_size": group.world_size}

    return Step(
        name=PROCESS_GROUP_STEP,
        body=form,
        policy=_PROCESS_GROUP_POLICY,
        timeout=timeout_s + 30.0,
        attributes={"backend": "gloo", "world_size": identity.world_size},
    )


#: torch missing (ImportError) or unloadable (OSError) is recorded; any other
#: error, and running out of time, fails the run.
_PROCESS_GROUP_POLICY = attrs.evolve(
    PROBE_POLICY, name="process group", on_timeout=Action.PROPAGATE
)
